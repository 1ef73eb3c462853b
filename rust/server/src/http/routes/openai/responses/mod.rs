//! `POST /v1/responses`, as vLLM 0.33 serves it without a response store:
//! text or message input, one assistant message of text out, unstreamed (the
//! response object) or streamed as vLLM's typed events (`response.created`
//! ... `response.completed`). `chat_template_kwargs` and `reasoning.effort`
//! reach the chat template as in chat completions. What this server does not
//! do (tools, background mode, stored responses, structured output) is a 400
//! naming the field, never dropped.
//!
//! The request as sent and the objects and events answered (`types`), its
//! checks (`validate`), the prompt it renders and the answer it streams or
//! returns (`convert`); `stored` serves the stored-response routes.

pub mod convert;
pub mod stored;
pub mod types;
pub mod validate;

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::failure::generation_error;
use crate::http::generation::submit::{submit, Endpoint, Submitted};
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use convert::{item_status, message_item, model, prepare, random_item_id, response_status, stream_events, usage};
use types::{Answer, ResponsesBody};

/// Handles a responses request, streamed or not.
pub async fn create_response(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<ResponsesBody>,
) -> Response {
    match response(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn response(state: SharedState, headers: HeaderMap, body: ResponsesBody) -> Result<Response, ApiError> {
    let (common, prompt_token_ids, echo) = prepare(&state, body)?;
    let max_tokens = common.sampling.max_tokens;
    let stream = common.stream;
    let submitted = submit(&state, &headers, Endpoint::Responses, prompt_token_ids, common)?;
    let answer =
        Answer { echo, max_tokens, id: submitted.id.clone(), created_at: submitted.created, model: model(&state) };
    if stream {
        return Ok(stream_events(submitted, answer));
    }
    let Submitted { mut generation, .. } = submitted;
    let (text, finish) = generation.collect().await.map_err(|e| generation_error(&e))?;
    // Unstreamed, vLLM always answers one message item (empty content when there is no text).
    let output = vec![message_item(&random_item_id(), &text, item_status(&finish))];
    Ok(Json(answer.object(response_status(&finish), output, Some(usage(generation.usage())))).into_response())
}
