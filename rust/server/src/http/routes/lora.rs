//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` as vLLM
//! answers them on a server started without LoRA support: a 400 saying why,
//! whatever the body (this server has no LoRA support to start with).

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

/// The LoRA routes.
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/v1/load_lora_adapter", post(lora_unsupported))
        .route("/v1/unload_lora_adapter", post(lora_unsupported))
}

/// 400: LoRA is not enabled.
async fn lora_unsupported() -> Response {
    ApiError::bad_request(RULES.message("lora_unsupported", &[])).into_response()
}
