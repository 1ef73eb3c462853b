//! Answering a submitted completion or chat request: a server-sent-event
//! stream, or one JSON body once the generation finished.

use super::error::ApiError;
use super::sse::{sse_response, ChunkHeader, ChunkWriter};
use super::state::AppState;
use super::submit::{stop_reason_json, Submitted};
use crate::generate::GenerationError;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// How one endpoint shapes its answers.
pub struct AnswerFormat<MakeWriter, Content> {
    /// `object` of the whole answer.
    pub object: &'static str,
    /// `object` of each streamed chunk.
    pub chunk_object: &'static str,
    /// Makes the chunk writer for a stream.
    pub writer: MakeWriter,
    /// The choice field holding the text (`text`, or `message`) and its value.
    pub content: Content,
}

/// The HTTP error for a generation that failed after it started, as vLLM's
/// frontend maps it: a `RequestError` with code `validation_error` is a 400,
/// a retryable one a 503, any other a 500, each with the engine's message;
/// ERROR without a reason is a 500; engines that became unusable (dead, hung,
/// disconnected) a 503.
pub fn generation_error(error: &GenerationError) -> ApiError {
    match error {
        GenerationError::Engine => ApiError::internal(error.to_string()),
        GenerationError::Rejected(e) if e.code == "validation_error" => ApiError::bad_request(e.message.clone()),
        GenerationError::Rejected(e) if e.retryable => ApiError::unavailable(e.message.clone()),
        GenerationError::Rejected(e) => ApiError::internal(e.message.clone()),
        GenerationError::Unavailable(reason) => ApiError::unavailable(reason.clone()),
    }
}

/// Streams `submitted` or waits for it and answers in one body. A stream
/// ends with usage when the request asked for it or the server forces it
/// (`enable_force_include_usage`).
pub async fn answer<W, MakeWriter, Content>(
    state: &AppState,
    mut submitted: Submitted,
    stream: bool,
    include_usage: bool,
    format: AnswerFormat<MakeWriter, Content>,
) -> Result<Response, ApiError>
where
    W: ChunkWriter,
    MakeWriter: FnOnce(ChunkHeader) -> W,
    Content: FnOnce(String) -> (&'static str, Value),
{
    let include_usage = include_usage || state.config.enable_force_include_usage;
    let model = state.config.primary_model_name().to_string();
    if stream {
        let header = ChunkHeader { id: submitted.id, object: format.chunk_object, created: submitted.created, model };
        return Ok(sse_response(submitted.generation, (format.writer)(header), include_usage).await);
    }
    let (text, finish) = submitted.generation.collect().await.map_err(|e| generation_error(&e))?;
    let mut choice = json!({
        "index": 0,
        "logprobs": null,
        "finish_reason": finish.reason.as_str(),
        "stop_reason": stop_reason_json(&finish.stop_reason),
    });
    let (key, content) = (format.content)(text);
    choice[key] = content;
    Ok(Json(json!({
        "id": submitted.id,
        "object": format.object,
        "created": submitted.created,
        "model": model,
        "choices": [choice],
        "usage": submitted.generation.usage(),
    }))
    .into_response())
}
