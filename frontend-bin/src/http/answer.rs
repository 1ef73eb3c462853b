//! Answering a submitted completion or chat request: a server-sent-event
//! stream, or one JSON body once the generation finished.

use super::error::ApiError;
use super::sse::{choices_sse_response, sse_response, ChunkHeader, ChunkWriter};
use super::state::AppState;
use super::submit::{stop_reason_json, Submitted};
use crate::generate::{Finish, Generation, GenerationError, Usage};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use serde_json::{json, Value};

/// How one endpoint shapes its answers.
pub struct AnswerFormat<MakeWriter, Content> {
    /// `object` of the whole answer.
    pub object: &'static str,
    /// `object` of each streamed chunk.
    pub chunk_object: &'static str,
    /// Makes the chunk writer of one choice of a stream: (header, index).
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
    mut format: AnswerFormat<MakeWriter, Content>,
) -> Result<Response, ApiError>
where
    W: ChunkWriter,
    MakeWriter: FnMut(ChunkHeader, u32) -> W,
    Content: FnMut(String) -> (&'static str, Value),
{
    let include_usage = include_usage || state.config.enable_force_include_usage;
    let model = state.config.primary_model_name().to_string();
    if stream {
        let header = ChunkHeader { id: submitted.id, object: format.chunk_object, created: submitted.created, model };
        return Ok(
            stream_choices(submitted.generation, submitted.more_choices, header, include_usage, format.writer).await
        );
    }
    let (choices, usage) = whole_choices(&mut submitted, |index, text, finish| {
        let mut choice = json!({
            "index": index,
            "logprobs": null,
            "finish_reason": finish.reason.as_str(),
            "stop_reason": stop_reason_json(&finish.stop_reason),
        });
        let (key, content) = (format.content)(text);
        choice[key] = content;
        choice
    })
    .await?;
    Ok(Json(whole_answer(&submitted, format.object, &model, choices, usage)).into_response())
}

/// The body of a whole answer holding `choices` (moved in, not copied).
pub fn whole_answer(submitted: &Submitted, object: &str, model: &str, choices: Vec<Value>, usage: Usage) -> Value {
    let mut body = json!({
        "id": submitted.id,
        "object": object,
        "created": submitted.created,
        "model": model,
        "choices": null,
        "usage": usage,
    });
    body["choices"] = Value::Array(choices);
    body
}

/// Streams the choices of a request (`first`, then `more`, as `Submitted`
/// holds them), each through the writer `writer(header, index)` makes.
pub async fn stream_choices<W: ChunkWriter>(
    first: Generation,
    more: Vec<Generation>,
    header: ChunkHeader,
    include_usage: bool,
    mut writer: impl FnMut(ChunkHeader, u32) -> W,
) -> Response {
    if more.is_empty() {
        return sse_response(first, writer(header, 0), include_usage).await;
    }
    let mut generations = more;
    generations.insert(0, first);
    let writers = (0..generations.len() as u32).map(|index| writer(header.clone(), index)).collect();
    choices_sse_response(generations, writers, include_usage)
}

/// Runs every choice of `submitted` to its end, concurrently, and makes each
/// one's JSON with `choice(index, text, finish)`: the choices by index and
/// the usage of all of them. The first failure fails the whole answer (the
/// other choices are aborted when `submitted` is dropped).
pub async fn whole_choices(
    submitted: &mut Submitted,
    mut choice: impl FnMut(u32, String, Finish) -> Value,
) -> Result<(Vec<Value>, Usage), ApiError> {
    if submitted.more_choices.is_empty() {
        let (text, finish) = submitted.generation.collect().await.map_err(|e| generation_error(&e))?;
        return Ok((vec![choice(0, text, finish)], submitted.generation.usage()));
    }
    let generations = std::iter::once(&mut submitted.generation).chain(submitted.more_choices.iter_mut());
    let wholes = try_join_all(generations.map(Generation::collect)).await.map_err(|e| generation_error(&e))?;
    let choices = wholes.into_iter().zip(0..).map(|((text, finish), index)| choice(index, text, finish)).collect();
    let mut usage = Usage::default();
    for generation in std::iter::once(&submitted.generation).chain(&submitted.more_choices) {
        usage.add_choice(generation.usage());
    }
    Ok((choices, usage))
}
