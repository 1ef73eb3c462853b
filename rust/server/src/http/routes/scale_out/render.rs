//! The render routes: a request's prompt token ids and sampling parameters,
//! as the route it mirrors would run it, without running it.

use super::answer;
use super::convert;
use super::types::RenderedRequest;
use crate::http::body::{JsonBody, JsonRequest};
use crate::http::error::ApiError;
use crate::http::generation::submit::{chat_default_max_tokens, check_model, DEFAULT_COMPLETION_MAX_TOKENS};
use crate::http::routes::anthropic::messages::{
    convert as messages_convert, error::anthropic_error, validate as messages_validate,
};
use crate::http::routes::openai::chat_completions::convert::prepare_chat;
use crate::http::routes::openai::chat_completions::types::ChatBody;
use crate::http::routes::openai::completions::convert::prompt_token_ids;
use crate::http::routes::openai::completions::types::CompletionBody;
use crate::http::routes::openai::responses::convert::render_response;
use crate::http::routes::openai::responses::types::ResponsesBody;
use crate::http::sampling::CommonParams;
use crate::http::state::{AppState, SharedState};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use vllm_rs_engine::ids::random_hex;

/// `stream_options` as render writes them: only for a streamed request.
fn stream_options(common: &CommonParams) -> Option<Map<String, Value>> {
    let options = json!({"include_usage": common.include_usage, "continuous_usage_stats": common.continuous_usage});
    common.stream.then(|| options.as_object().cloned()).flatten()
}

/// The rendered form of a chat body.
fn rendered_chat(state: &AppState, body: ChatBody) -> Result<RenderedRequest, ApiError> {
    let prepared = prepare_chat(state, body)?;
    let common = &prepared.request.common;
    let max_tokens = chat_default_max_tokens(state, prepared.prompt_token_ids.len() as u64);
    Ok(rendered(format!("chatcmpl-{}", random_hex(32)), common, prepared.prompt_token_ids, max_tokens))
}

/// The rendered request of `common` and its prompt, under `request_id`;
/// `max_tokens` when the request gave none.
fn rendered(
    request_id: String,
    common: &CommonParams,
    token_ids: Vec<u32>,
    max_tokens: Option<u64>,
) -> RenderedRequest {
    RenderedRequest {
        request_id,
        sampling_params: convert::sampling_params(common, max_tokens),
        model: common.model.clone(),
        stream: common.stream,
        stream_options: stream_options(common),
        token_ids,
        features: None,
        cache_salt: None,
        priority: 0,
        kv_transfer_params: None,
    }
}

/// Handles `POST /v1/chat/completions/render`.
pub async fn render_chat(State(state): State<SharedState>, JsonRequest(body): JsonRequest<ChatBody>) -> Response {
    answer(rendered_chat(&state, body))
}

/// Handles `POST /v1/messages/render`: the Messages request as the chat request it runs as; errors in Anthropic's shape.
pub async fn render_messages(State(state): State<SharedState>, body: Result<JsonBody, ApiError>) -> Response {
    let render = || {
        let body = messages_validate::parse(&body?.0)?;
        messages_validate::check_messages_body(&body)?;
        rendered_chat(&state, messages_convert::chat_body(body)?)
    };
    match render() {
        Ok(rendered) => Json(rendered).into_response(),
        Err(error) => anthropic_error(error),
    }
}

/// Handles `POST /v1/completions/render`: one rendered request per prompt (one here).
pub async fn render_completion(
    State(state): State<SharedState>,
    JsonRequest(body): JsonRequest<CompletionBody>,
) -> Response {
    let render = || -> Result<Vec<RenderedRequest>, ApiError> {
        let request = body.validate()?;
        check_model(&state, request.common.model.as_deref())?;
        let (_, token_ids) = prompt_token_ids(&state, request.prompt)?;
        let left = state.max_model_len.map(|max_len| max_len.saturating_sub(token_ids.len() as u64));
        let max_tokens = DEFAULT_COMPLETION_MAX_TOKENS.min(left.unwrap_or(u64::MAX));
        let common = &request.common;
        Ok(vec![rendered(format!("cmpl-{}", random_hex(32)), common, token_ids, Some(max_tokens))])
    };
    answer(render())
}

/// Handles `POST /v1/responses/render`: the Responses request's prompt as `/v1/responses` runs it.
pub async fn render_responses(
    State(state): State<SharedState>,
    JsonRequest(body): JsonRequest<ResponsesBody>,
) -> Response {
    let render = || -> Result<RenderedRequest, ApiError> {
        let (common, token_ids) = render_response(&state, body)?;
        Ok(rendered(format!("resp_{}", random_hex(32)), &common, token_ids, None))
    };
    answer(render())
}
