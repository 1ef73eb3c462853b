//! Tokens in, tokens out: `/inference/v1/generate` through the completions
//! pipeline, and `/inference/v1/abort_requests`.

use super::answer;
use super::convert;
use super::types::{AbortBody, GenerateBody};
use crate::http::body::{parse_body, JsonBody, JsonRequest};
use crate::http::error::ApiError;
use crate::http::generation::submit::chat_default_max_tokens;
use crate::http::routes::openai::completions::completion;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// Handles `POST /inference/v1/generate`: token ids in, token ids out, through the completions pipeline.
pub async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let run = async {
        let body: GenerateBody = parse_body(&body?.0)?;
        let (request_id, completion_body) =
            convert::completion_body(body, |prompt_len| chat_default_max_tokens(&state, prompt_len))?;
        let response = completion(state.clone(), headers, completion_body).await.map_err(convert::generate_error)?;
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map_err(|e| ApiError::internal(format!("cannot read the completion answer: {e}")))?;
        let completion: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::internal(format!("the completion answer is not JSON: {e}")))?;
        // vLLM runs a generate request as `generate-tokens-<id>`; the completions pipeline ran it as `cmpl-<id>`.
        let id = completion["id"].as_str().and_then(|id| id.strip_prefix("cmpl-")).unwrap_or(&request_id);
        Ok(convert::generate_response(format!("generate-tokens-{id}"), &completion))
    };
    answer(run.await)
}

/// Handles `POST /inference/v1/abort_requests`: ends the requests named by the id each was
/// given (a generate request's `request_id`, or the id a response carries);
/// each finishes as `abort` with what it generated. 200 with no body, as in vLLM.
pub async fn abort_requests(State(state): State<SharedState>, JsonRequest(body): JsonRequest<AbortBody>) -> Response {
    let Some(ids) = body.request_ids else {
        return ApiError::invalid_param("request_ids", "Missing 'request_ids' in request body").into_response();
    };
    // The completions pipeline runs a generate request `generate-tokens-<id>` as `cmpl-<id>`.
    let prefixed: Vec<String> =
        ids.iter().map(|id| format!("cmpl-{}", id.strip_prefix("generate-tokens-").unwrap_or(id))).collect();
    let names: Vec<&str> = ids.iter().chain(&prefixed).map(String::as_str).collect();
    state.engines.abort_by_external_id(&names);
    StatusCode::OK.into_response()
}
