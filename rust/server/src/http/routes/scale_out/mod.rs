//! vLLM 0.33's scale-out routes, served with `--enable-scale-out` (`403`
//! naming the flag without it, as vLLM's Rust frontend answers):
//!
//! - render: `/v1/chat/completions/render`, `/v1/completions/render`,
//!   `/v1/messages/render`, `/v1/responses/render` answer the prompt's token ids and sampling
//!   parameters the request would run with, without running it;
//! - derender: `/v1/chat/completions/derender`, `/v1/completions/derender`
//!   turn a generate answer's token ids into a chat or completions answer;
//! - tokens in, tokens out: `/inference/v1/generate` runs token ids through
//!   the completions pipeline and answers token ids;
//!   `/inference/v1/abort_requests` ends requests in flight (vLLM's
//!   unauthenticated `/abort_requests` comes only with `--tokens-only`,
//!   which this server refuses).
//!
//! Each builds on the route it mirrors (`prepare_chat`, the completions
//! pipeline, the Messages conversion), so a rendered request is exactly what
//! that route would run.
pub mod convert;
pub mod derender;
pub mod generate;
pub mod render;
pub mod types;

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

/// The scale-out routes, each answering 403 unless the server was started with `--enable-scale-out`.
pub fn routes(state: &SharedState) -> Router<SharedState> {
    Router::new()
        .route("/v1/chat/completions/render", post(render::render_chat))
        .route("/v1/completions/render", post(render::render_completion))
        .route("/v1/messages/render", post(render::render_messages))
        .route("/v1/chat/completions/derender", post(derender::derender_chat))
        .route("/v1/completions/derender", post(derender::derender_completion))
        .route("/inference/v1/generate", post(generate::generate))
        .route("/inference/v1/abort_requests", post(generate::abort_requests))
        .route("/v1/responses/render", post(render::render_responses))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_scale_out))
}

/// 403 with vLLM's message naming the flag unless scale-out is enabled.
async fn require_scale_out(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    if state.config.enable_scale_out {
        return next.run(request).await;
    }
    ApiError::new(StatusCode::FORBIDDEN, RULES.message("scale_out_disabled", &[])).into_response()
}

/// `Ok` as JSON, `Err` as the error response.
pub fn answer<T: serde::Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}
