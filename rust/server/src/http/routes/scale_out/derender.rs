//! The derender routes: a generate answer's token ids back into the chat or
//! completions answer, decoded and parsed as those routes would.

use super::answer;
use super::types::{DerenderChatBody, DerenderCompletionBody};
use crate::http::body::{parse_body, JsonRequest};
use crate::http::error::ApiError;
use crate::http::generation::message::ResponseMessage;
use crate::http::generation::submit::check_model;
use crate::http::generation::tools::{finish_reason, output_parser, read_chat_tools, whole_message};
use crate::http::routes::openai::chat_completions::types::ChatBody;
use crate::http::routes::openai::completions::types::CompletionBody;
use crate::http::rules::RULES;
use crate::http::state::{unix_now, AppState, SharedState};
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use vllm_rs_chat::DecodeOptions;
use vllm_rs_engine::ids::random_hex;

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

/// The value of a required field, or the 400 naming it.
fn required<T>(param: &str, value: Option<T>) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::invalid_param(param, format!("`{param}` is required")))
}

/// How the rendered request said to decode (vLLM's defaults where it did not).
fn decode_options(skip_special_tokens: Option<bool>, spaces_between_special_tokens: Option<bool>) -> DecodeOptions {
    DecodeOptions {
        skip_special_tokens: skip_special_tokens.unwrap_or(true),
        spaces_between_special_tokens: spaces_between_special_tokens.unwrap_or(true),
    }
}

/// The usage of a derendered answer.
fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens, "prompt_tokens_details": null})
}

/// 400 for a streamed derender.
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
pub async fn derender_chat(
    State(state): State<SharedState>,
    JsonRequest(body): JsonRequest<DerenderChatBody>,
) -> Response {
    let derender = || -> Result<Value, ApiError> {
        refuse_stream(body.stream)?;
        check_model(&state, body.model.as_deref())?;
        let generated = required("generate_response", body.generate_response)?;
        let mut chat = match body.chat_request {
            Some(request) => parse_body::<ChatBody>(&serde_json::to_vec(&request).expect("JSON serializes"))?,
            None => ChatBody::default(),
        };
        let tools = read_chat_tools(&chat.take_tools(), &state.config.chat)?;
        let decode_options =
            decode_options(chat.sampling.skip_special_tokens, chat.sampling.spaces_between_special_tokens);
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
pub async fn derender_completion(
    State(state): State<SharedState>,
    JsonRequest(body): JsonRequest<DerenderCompletionBody>,
) -> Response {
    let derender = || -> Result<Value, ApiError> {
        refuse_stream(body.stream)?;
        check_model(&state, body.model.as_deref())?;
        let generated = required("generate_responses", body.generate_responses)?;
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
        let decode_options =
            decode_options(request.sampling.skip_special_tokens, request.sampling.spaces_between_special_tokens);
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
