//! `POST /v1/chat/completions`.

use super::answer::{answer, AnswerFormat};
use super::error::ApiError;
use super::params::{common_params, CommonParams, JsonObject, Params};
use super::sse::{ChunkHeader, ChunkWriter};
use super::state::SharedState;
use super::submit::{check_model, stop_reason_json, submit, Endpoint};
use crate::generate::{Delta, Usage};
use crate::tokenizer::ChatMessage;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// Handles a chat completion request, streamed or not.
pub async fn create_chat_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Response {
    match chat_completion(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A chat request whose parameters are all read and checked.
#[derive(Debug)]
pub struct ChatRequest {
    /// The parameters shared with completions.
    pub common: CommonParams,
    /// The conversation, each content flattened to text.
    pub messages: Vec<ChatMessage>,
    /// End the prompt with the assistant's turn.
    pub add_generation_prompt: bool,
}

/// Reads every parameter of a chat body, or a 4xx naming the first bad one.
/// Needs neither the model nor the tokenizer, so it never fails otherwise.
pub fn parse_chat_request(body: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let p = Params(body);
    let common = common_params(&p, &["max_completion_tokens", "max_tokens"])?;
    if p.get("logprobs").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::invalid_param("logprobs", "`logprobs` is not supported"));
    }
    if p.get("tools").is_some_and(|v| v.as_array().is_none_or(|t| !t.is_empty())) {
        return Err(ApiError::invalid_param("tools", "`tools` is not supported"));
    }
    if p.get("response_format").is_some_and(|v| v.get("type").and_then(Value::as_str) != Some("text")) {
        return Err(ApiError::invalid_param("response_format", "only the `text` response format is supported"));
    }
    let messages = messages(&p)?;
    let add_generation_prompt = p.bool("add_generation_prompt")?.unwrap_or(true);
    Ok(ChatRequest { common, messages, add_generation_prompt })
}

async fn chat_completion(
    state: SharedState,
    headers: HeaderMap,
    body: Map<String, Value>,
) -> Result<Response, ApiError> {
    let ChatRequest { common, messages, add_generation_prompt } = parse_chat_request(&body)?;
    check_model(&state, common.model.as_deref())?;
    let prompt = state
        .tokenizer
        .apply_chat_template(&messages, add_generation_prompt)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}")))?;
    let prompt_token_ids = state
        .tokenizer
        .encode(&prompt, false)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize the messages: {e}")))?;
    let (stream, include_usage) = (common.stream, common.include_usage);
    let role = response_role(&state.config.chat.response_role, &messages, add_generation_prompt);
    let submitted = submit(&state, &headers, Endpoint::Chat, prompt_token_ids, common)?;
    let stream_role = role.clone();
    let format = AnswerFormat {
        object: "chat.completion",
        chunk_object: "chat.completion.chunk",
        writer: move |header| ChatChunks { header, role: stream_role },
        content: move |text| ("message", json!({"role": role, "content": text})),
    };
    answer(&state, submitted, stream, include_usage, format).await
}

/// The role of the answer, as vLLM picks it: `response_role` when the prompt
/// ends with the generation prompt, else the last message's role (the model
/// continues that message).
fn response_role(configured: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    match messages.last() {
        Some(last) if !add_generation_prompt => last.role.clone(),
        _ => configured.to_owned(),
    }
}

/// The `messages` parameter, each content flattened to text.
fn messages(p: &Params) -> Result<Vec<ChatMessage>, ApiError> {
    let bad = |why: String| ApiError::invalid_param("messages", why);
    let items = p
        .get("messages")
        .ok_or_else(|| bad("`messages` is required".into()))?
        .as_array()
        .ok_or_else(|| bad("`messages` must be a list".into()))?;
    if items.is_empty() {
        return Err(bad("`messages` must not be empty".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let role = item
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("messages[{i}].role must be a string")))?;
            let content = match item.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|part| {
                        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(text)) => Ok(text),
                            _ => Err(bad(format!("messages[{i}].content: only text parts are supported"))),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                Some(_) => return Err(bad(format!("messages[{i}].content must be a string or a list of parts"))),
            };
            Ok(ChatMessage { role: role.to_string(), content })
        })
        .collect()
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: ChunkDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Value>,
}

#[derive(Serialize)]
struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    content: &'a str,
}

struct ChatChunks {
    header: ChunkHeader,
    /// The role the first chunk announces.
    role: String,
}

impl ChunkWriter for ChatChunks {
    fn opening(&self) -> Option<Bytes> {
        let delta = ChunkDelta { role: Some(&self.role), content: "" };
        Some(
            self.header.event(
                vec![ChunkChoice { index: 0, delta, logprobs: None, finish_reason: None, stop_reason: None }],
                None,
            ),
        )
    }

    fn delta(&self, delta: &Delta) -> Bytes {
        let choice = ChunkChoice {
            index: 0,
            delta: ChunkDelta { role: None, content: &delta.text },
            logprobs: None,
            finish_reason: delta.finish.as_ref().map(|f| f.reason.as_str()),
            stop_reason: delta.finish.as_ref().map(|f| stop_reason_json(&f.stop_reason)),
        };
        self.header.event(vec![choice], None)
    }

    fn usage(&self, usage: Usage) -> Bytes {
        self.header.event::<ChunkChoice>(Vec::new(), Some(usage))
    }
}
