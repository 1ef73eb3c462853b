//! The OpenAI-compatible HTTP API.

pub mod answer;
pub mod auth;
pub mod body_deadline;
pub mod chat;
pub mod completions;
pub mod error;
pub mod misc;
pub mod params;
pub mod rules;
pub mod server;
pub mod sse;
pub mod state;
pub mod submit;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{middleware, Router};
use error::ApiError;
use state::SharedState;

/// All routes, with authentication and the body deadline (the size limit is the
/// JSON extractor's).
pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/load", get(misc::load))
        .route("/version", get(misc::version))
        .route("/v1/models", get(misc::list_models))
        .route("/v1/completions", post(completions::create_completion))
        .route("/v1/chat/completions", post(chat::create_chat_completion))
        .route("/reset_prefix_cache", post(misc::reset_prefix_cache))
        .route("/sleep", post(misc::sleep))
        .route("/wake_up", post(misc::wake_up))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed").into_response()
        })
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_api_key))
        .layer(middleware::from_fn_with_state(state.clone(), body_deadline::limit_body_time))
        .with_state(state)
}
