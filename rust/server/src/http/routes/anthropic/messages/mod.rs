//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, as vLLM 0.33 serves them. A request is
//! checked (`validate.rs`), converted to a chat request (`convert.rs`) and
//! answered by the chat pipeline, templating, sampling, tools, reasoning
//! and streaming included; its answer is converted back (`convert.rs`,
//! `stream.rs`). Errors are in Anthropic's shape (`error.rs`).

pub mod convert;
pub mod error;
pub mod stream;
pub mod types;
pub mod validate;

use crate::http::body::JsonBody;
use crate::http::error::ApiError;
use crate::http::routes::openai::chat_completions::chat_completion;
use crate::http::routes::openai::chat_completions::convert::prepare_chat;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use error::anthropic_error;
use serde_json::Value;
use types::{ContextManagement, CountTokensBody, CountTokensResponse, MessagesBody};

/// Handles `POST /v1/messages`, streamed or not.
pub async fn create_message(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let answer = async { message(state, headers, &body?.0).await };
    answer.await.unwrap_or_else(anthropic_error)
}

async fn message(state: SharedState, headers: HeaderMap, bytes: &[u8]) -> Result<Response, ApiError> {
    let body: MessagesBody = validate::parse(bytes)?;
    validate::check_messages_body(&body)?;
    let stream = body.stream == Some(true);
    let chat = convert::chat_body(body)?;
    let (parts, body) = chat_completion(state, headers, chat).await?.into_parts();
    if stream {
        return Ok(Response::from_parts(parts, stream::translate(body)));
    }
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("cannot read the chat answer: {e}")))?;
    let chat: Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(format!("the chat answer is not JSON: {e}")))?;
    Ok(Json(convert::messages_response(&chat)).into_response())
}

/// Handles `POST /v1/messages/count_tokens`: the prompt's token count, the
/// prompt rendered exactly as `/v1/messages` renders it.
pub async fn count_tokens(State(state): State<SharedState>, body: Result<JsonBody, ApiError>) -> Response {
    let count = || -> Result<CountTokensResponse, ApiError> {
        let body: CountTokensBody = validate::parse(&body?.0)?;
        validate::check_count_tokens_body(&body)?;
        let prepared = prepare_chat(&state, convert::count_chat_body(body)?)?;
        let input_tokens = prepared.prompt_token_ids.len();
        Ok(CountTokensResponse {
            input_tokens,
            context_management: ContextManagement { original_input_tokens: input_tokens },
        })
    };
    match count() {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => anthropic_error(error),
    }
}
