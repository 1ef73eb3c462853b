//! vLLM 0.33's scale-out routes, served with `--enable-scale-out` (`403`
//! naming the flag without it, as vLLM's Rust frontend answers):
//!
//! - render: `/v1/chat/completions/render`, `/v1/completions/render`,
//!   `/v1/messages/render` answer the prompt's token ids and sampling
//!   parameters the request would run with, without running it;
//! - derender: `/v1/chat/completions/derender`, `/v1/completions/derender`
//!   turn a generate answer's token ids into a chat or completions answer;
//! - tokens in, tokens out: `/inference/v1/generate` runs token ids through
//!   the completions pipeline and answers token ids; `/abort_requests` (also
//!   at `/inference/v1/abort_requests`) ends requests in flight.
//!
//! Each builds on the route it mirrors (`prepare_chat`, the completions
//! pipeline, the Messages conversion), so a rendered request is exactly what
//! that route would run.

pub mod convert;
pub mod types;

use super::chat::{prepare_chat, ChatBody};
use super::completions::{completion, prompt_token_ids, CompletionBody};
use super::error::ApiError;
use super::message::ResponseMessage;
use super::messages::{convert as messages_convert, error::anthropic_error, validate as messages_validate};
use super::params::{parse_body, CommonParams, JsonBody, JsonRequest};
use super::rules::RULES;
use super::state::{unix_now, AppState, SharedState};
use super::submit::{chat_default_max_tokens, check_model, DEFAULT_COMPLETION_MAX_TOKENS};
use super::tools::{finish_reason, output_parser, read_chat_tools, whole_message};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use types::{AbortBody, DerenderChatBody, DerenderCompletionBody, GenerateBody, RenderedRequest};
use vllm_rs_chat::DecodeOptions;
use vllm_rs_engine::ids::random_hex;

/// The scale-out routes, each answering 403 unless the server was started with `--enable-scale-out`.
pub fn routes(state: &SharedState) -> Router<SharedState> {
    Router::new()
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/messages/render", post(render_messages))
        .route("/v1/chat/completions/derender", post(derender_chat))
        .route("/v1/completions/derender", post(derender_completion))
        .route("/inference/v1/generate", post(generate))
        .route("/abort_requests", post(abort_requests))
        .route("/inference/v1/abort_requests", post(abort_requests))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_scale_out))
}

/// 403 naming the flag unless scale-out is enabled.
async fn require_scale_out(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    if state.config.enable_scale_out {
        return next.run(request).await;
    }
    let route = request.uri().path().to_owned();
    ApiError::new(StatusCode::FORBIDDEN, RULES.message("scale_out_disabled", &[("route", &route)])).into_response()
}

/// `Ok` as JSON, `Err` as the error response.
fn answer<T: serde::Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

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
    Ok(RenderedRequest {
        request_id: format!("chatcmpl-{}", random_hex(32)),
        sampling_params: convert::sampling_params(common, max_tokens),
        model: common.model.clone(),
        stream: common.stream,
        stream_options: stream_options(common),
        token_ids: prepared.prompt_token_ids,
        features: None,
        cache_salt: None,
        priority: 0,
        kv_transfer_params: None,
    })
}

/// Handles `POST /v1/chat/completions/render`.
async fn render_chat(State(state): State<SharedState>, JsonRequest(body): JsonRequest<ChatBody>) -> Response {
    answer(rendered_chat(&state, body))
}

/// Handles `POST /v1/messages/render`: the Messages request as the chat request it runs as; errors in Anthropic's shape.
async fn render_messages(State(state): State<SharedState>, body: Result<JsonBody, ApiError>) -> Response {
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
async fn render_completion(
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
        Ok(vec![RenderedRequest {
            request_id: format!("cmpl-{}", random_hex(32)),
            sampling_params: convert::sampling_params(common, Some(max_tokens)),
            model: common.model.clone(),
            stream: common.stream,
            stream_options: stream_options(common),
            token_ids,
            features: None,
            cache_salt: None,
            priority: 0,
            kv_transfer_params: None,
        }])
    };
    answer(render())
}

/// Handles `POST /inference/v1/generate`: token ids in, token ids out, through the completions pipeline.
async fn generate(State(state): State<SharedState>, headers: HeaderMap, body: Result<JsonBody, ApiError>) -> Response {
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
        Ok(convert::generate_response(request_id, &completion))
    };
    answer(run.await)
}

/// Handles `POST /abort_requests`: ends the requests named by the id each was
/// given (a generate request's `request_id`, or the id a response carries);
/// each finishes as `abort` with what it generated. 200 with no body, as in vLLM.
async fn abort_requests(State(state): State<SharedState>, JsonRequest(body): JsonRequest<AbortBody>) -> Response {
    let Some(ids) = body.request_ids else {
        return ApiError::invalid_param("request_ids", "Missing 'request_ids' in request body").into_response();
    };
    // The completions pipeline runs a generate request as `cmpl-<request_id>`.
    let prefixed: Vec<String> = ids.iter().map(|id| format!("cmpl-{id}")).collect();
    let names: Vec<&str> = ids.iter().chain(&prefixed).map(String::as_str).collect();
    state.engines.abort_by_external_id(&names);
    StatusCode::OK.into_response()
}

/// The text of generated `token_ids`, decoded as a generation decodes them.
fn decode(state: &AppState, token_ids: &[u32], options: DecodeOptions) -> Result<String, ApiError> {
    let vocab_size = state.tokenizer.vocab_size();
    if let Some(bad) = token_ids.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(RULES.refuse("token_ids", "token_out_of_vocab", &[("token_id", &bad.to_string())]));
    }
    let mut decoder = state.tokenizer.decoder(&[], options);
    let mut text = decoder.push(token_ids);
    text.push_str(&decoder.flush());
    Ok(text)
}

/// The usage of a derendered answer.
fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens, "prompt_tokens_details": null})
}

fn refuse_stream(stream: Option<bool>) -> Result<(), ApiError> {
    match stream {
        Some(true) => {
            Err(ApiError::invalid_param("stream", "streamed derender is not supported: send the whole generate answer"))
        }
        _ => Ok(()),
    }
}

/// Handles `POST /v1/chat/completions/derender`: a generate answer as the
/// chat answer, its text read by the chat request's tool and reasoning parsers.
async fn derender_chat(State(state): State<SharedState>, JsonRequest(body): JsonRequest<DerenderChatBody>) -> Response {
    let derender = || -> Result<Value, ApiError> {
        refuse_stream(body.stream)?;
        check_model(&state, body.model.as_deref())?;
        let generated = body
            .generate_response
            .ok_or_else(|| ApiError::invalid_param("generate_response", "`generate_response` is required"))?;
        let mut chat = match body.chat_request {
            Some(request) => parse_body::<ChatBody>(&serde_json::to_vec(&request).expect("JSON serializes"))?,
            None => ChatBody::default(),
        };
        let tools = read_chat_tools(&chat.take_tools(), &state.config.chat)?;
        let decode_options = DecodeOptions {
            skip_special_tokens: chat.skip_special_tokens.unwrap_or(true),
            spaces_between_special_tokens: chat.spaces_between_special_tokens.unwrap_or(true),
        };
        let parser = output_parser(&tools, &state.config.chat, true);
        let mut completion_tokens = 0;
        let mut choices = Vec::new();
        for choice in &generated.choices {
            let token_ids = choice.token_ids.clone().unwrap_or_default();
            completion_tokens += token_ids.len() as u64;
            let text = decode(&state, &token_ids, decode_options)?;
            let engine_reason = choice.finish_reason.clone().unwrap_or_else(|| "stop".into());
            let (message, called) = match &parser {
                Some(parser) => whole_message(parser, "assistant", &text),
                None => (ResponseMessage::new("assistant", Some(text)), false),
            };
            let reason = if engine_reason == "stop" {
                finish_reason("stop", tools.mode, called).to_owned()
            } else {
                engine_reason
            };
            choices.push(json!({"index": choice.index, "message": message, "logprobs": choice.logprobs,
                "finish_reason": reason, "stop_reason": null, "token_ids": null}));
        }
        Ok(json!({"id": format!("chatcmpl-{}", generated.request_id), "object": "chat.completion",
            "created": unix_now(), "model": body.model.unwrap_or_else(|| state.config.primary_model_name().to_owned()),
            "choices": choices, "system_fingerprint": null,
            "usage": usage(body.prompt_tokens.unwrap_or(0), completion_tokens)}))
    };
    answer(derender())
}

/// Handles `POST /v1/completions/derender`: generate answers (one per
/// prompt) as the completions answer, decoded as the completion request says.
async fn derender_completion(
    State(state): State<SharedState>,
    JsonRequest(body): JsonRequest<DerenderCompletionBody>,
) -> Response {
    let derender = || -> Result<Value, ApiError> {
        refuse_stream(body.stream)?;
        check_model(&state, body.model.as_deref())?;
        let generated = body
            .generate_responses
            .ok_or_else(|| ApiError::invalid_param("generate_responses", "`generate_responses` is required"))?;
        let prompt_tokens = body.prompt_tokens.unwrap_or_else(|| vec![0; generated.len()]);
        if prompt_tokens.len() != generated.len() {
            return Err(ApiError::invalid_param(
                "prompt_tokens",
                format!(
                    "prompt_tokens length ({}) must equal generate_responses length ({})",
                    prompt_tokens.len(),
                    generated.len()
                ),
            ));
        }
        let request = match body.completion_request {
            Some(request) => parse_body::<CompletionBody>(&serde_json::to_vec(&request).expect("JSON serializes"))?,
            None => CompletionBody::default(),
        };
        let decode_options = DecodeOptions {
            skip_special_tokens: request.skip_special_tokens.unwrap_or(true),
            spaces_between_special_tokens: request.spaces_between_special_tokens.unwrap_or(true),
        };
        let mut choices = Vec::new();
        let mut completion_tokens = 0;
        for response in &generated {
            for choice in &response.choices {
                let token_ids = choice.token_ids.clone().unwrap_or_default();
                completion_tokens += token_ids.len() as u64;
                choices.push(json!({"index": choices.len(), "text": decode(&state, &token_ids, decode_options)?,
                    "logprobs": choice.logprobs, "finish_reason": choice.finish_reason.as_deref().unwrap_or("stop"),
                    "stop_reason": null, "prompt_logprobs": null}));
            }
        }
        let id = generated.first().map(|r| r.request_id.clone()).unwrap_or_else(|| random_hex(32));
        Ok(json!({"id": format!("cmpl-{id}"), "object": "text_completion", "created": unix_now(),
            "model": body.model.unwrap_or_else(|| state.config.primary_model_name().to_owned()),
            "choices": choices, "system_fingerprint": null,
            "usage": usage(prompt_tokens.iter().sum(), completion_tokens)}))
    };
    answer(derender())
}
