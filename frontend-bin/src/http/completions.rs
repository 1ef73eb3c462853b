//! `POST /v1/completions`.

use super::answer::{answer, AnswerFormat};
use super::error::ApiError;
use super::params::{common_params, CommonParams, JsonObject, Params};
use super::sse::{ChunkHeader, ChunkWriter};
use super::state::SharedState;
use super::submit::{check_model, stop_reason_json, submit, Endpoint};
use crate::generate::{Delta, Usage};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

/// Handles a completion request, streamed or not.
pub async fn create_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Response {
    match completion(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// The prompt of a completion request, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with the model's special tokens.
    Text(String),
    /// Token ids, sent as they are.
    TokenIds(Vec<u32>),
}

/// A completion request whose parameters are all read and checked.
#[derive(Debug)]
pub struct CompletionRequest {
    /// The parameters shared with chat.
    pub common: CommonParams,
    /// The prompt.
    pub prompt: Prompt,
}

/// Reads every parameter of a completion body, or a 4xx naming the first bad
/// one. Needs neither the model nor the tokenizer, so it never fails otherwise.
pub fn parse_completion_request(body: &Map<String, Value>) -> Result<CompletionRequest, ApiError> {
    let p = Params(body);
    let common = common_params(&p, &["max_tokens"])?;
    p.only("echo", &Value::Bool(false), "echo is not supported")?;
    p.only("suffix", &Value::Null, "suffix is not supported")?;
    if p.get("logprobs").is_some() {
        return Err(ApiError::invalid_param("logprobs", "`logprobs` is not supported"));
    }
    Ok(CompletionRequest { common, prompt: prompt(&p)? })
}

async fn completion(state: SharedState, headers: HeaderMap, body: Map<String, Value>) -> Result<Response, ApiError> {
    let CompletionRequest { common, prompt } = parse_completion_request(&body)?;
    check_model(&state, common.model.as_deref())?;
    let prompt_token_ids = match prompt {
        Prompt::Text(text) => state
            .tokenizer
            .encode(&text, true)
            .map_err(|e| ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}")))?,
        Prompt::TokenIds(ids) => ids,
    };
    let (stream, include_usage) = (common.stream, common.include_usage);
    let submitted = submit(&state, &headers, Endpoint::Completions, prompt_token_ids, common)?;
    let format = AnswerFormat {
        object: "text_completion",
        chunk_object: "text_completion",
        writer: CompletionChunks,
        content: |text| ("text", Value::String(text)),
    };
    answer(&state, submitted, stream, include_usage, format).await
}

/// The prompt: a string, a list of ids, or a one-element list of either.
fn prompt(p: &Params) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, a list of token ids, or a list holding one of those",
        )
    };
    let single = |v: &Value| -> Result<Prompt, ApiError> {
        match v {
            Value::String(text) => Ok(Prompt::Text(text.clone())),
            Value::Array(items) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(bad))
                .collect::<Result<_, _>>()
                .map(Prompt::TokenIds),
            _ => Err(bad()),
        }
    };
    match p.get("prompt") {
        None => Err(ApiError::invalid_param("prompt", "`prompt` is required")),
        Some(Value::Array(items)) if items.iter().any(|i| i.is_string() || i.is_array()) => match items.as_slice() {
            [one] => single(one),
            _ => Err(ApiError::invalid_param("prompt", "only one prompt per request is supported")),
        },
        Some(v) => single(v),
    }
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Value,
}

struct CompletionChunks(ChunkHeader);

impl ChunkWriter for CompletionChunks {
    fn opening(&self) -> Option<Bytes> {
        None
    }

    fn delta(&self, delta: &Delta) -> Bytes {
        let choice = ChunkChoice {
            index: 0,
            text: &delta.text,
            logprobs: None,
            finish_reason: delta.finish.as_ref().map(|f| f.reason.as_str()),
            stop_reason: delta.finish.as_ref().map(|f| stop_reason_json(&f.stop_reason)).unwrap_or(Value::Null),
        };
        self.0.event(vec![choice], None)
    }

    fn usage(&self, usage: Usage) -> Bytes {
        self.0.event::<ChunkChoice>(Vec::new(), Some(usage))
    }
}
