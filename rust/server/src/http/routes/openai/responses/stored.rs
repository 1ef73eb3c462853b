//! `GET /v1/responses/{response_id}` and `POST /v1/responses/{response_id}/cancel`
//! as vLLM answers them with its response store disabled (its default, and
//! the only way this server runs): no response is ever stored, so every id
//! is unknown and both routes answer vLLM's 404 for an unknown response.

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// The stored-response routes.
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/v1/responses/{response_id}", get(unknown_response))
        .route("/v1/responses/{response_id}/cancel", post(unknown_response))
}

/// 404 naming `response_id`, in vLLM's words and error type.
async fn unknown_response(Path(response_id): Path<String>) -> Response {
    ApiError::response_not_found(RULES.message("response_not_found", &[("response_id", &response_id)])).into_response()
}
