//! The routes of vLLM's APIs that need a model architecture this server
//! does not run: `POST /v1/decisions` and `POST /v1/systemone` (the
//! structured decisions APIs, which vLLM serves only for the architectures
//! it has a decision reader for). vLLM answers them on any other model with
//! a 501 naming the API; so does this server, whatever the body.

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

/// The routes of APIs this server's models cannot serve.
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/v1/decisions", post(|| async { not_implemented("decisions_unsupported") }))
        .route("/v1/systemone", post(|| async { not_implemented("structured_decisions_unsupported") }))
}

/// 501 with vLLM's message `key`.
fn not_implemented(key: &str) -> Response {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, RULES.message(key, &[])).into_response()
}
