//! `POST /v1/completions`.

use super::error::ApiError;
use super::params::{common_params, JsonObject, Params};
use super::answer::{answer, AnswerFormat};
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
pub async fn create_completion(State(state): State<SharedState>, headers: HeaderMap, JsonObject(body): JsonObject) -> Response {
    match completion(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn completion(state: SharedState, headers: HeaderMap, body: Map<String, Value>) -> Result<Response, ApiError> {
    let p = Params(&body);
    let common = common_params(&p, &["max_tokens"])?;
    check_model(&state, common.model.as_deref())?;
    p.only("echo", &Value::Bool(false), "echo is not supported")?;
    p.only("suffix", &Value::Null, "suffix is not supported")?;
    if p.get("logprobs").is_some() {
        return Err(ApiError::invalid_param("logprobs", "`logprobs` is not supported"));
    }
    let prompt_token_ids = prompt_tokens(&state, &p)?;
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

/// The prompt as token ids: a string, a list of ids, or a one-element list of either.
fn prompt_tokens(state: &SharedState, p: &Params) -> Result<Vec<u32>, ApiError> {
    let bad = || ApiError::invalid_param("prompt", "`prompt` must be a string, a list of token ids, or a list holding one of those");
    let single = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(text) => state
                .tokenizer
                .encode(text, true)
                .map_err(|e| ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}"))),
            Value::Array(items) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(bad))
                .collect(),
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
