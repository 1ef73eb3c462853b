//! Streaming answers as server-sent events: `data: {json}` per chunk, an
//! error chunk if the generation fails, then `data: [DONE]`. Dropping the
//! body (client gone) drops the generation, which aborts the request.

use super::answer::generation_error;
use crate::generate::{Delta, Generation, GenerationError, Usage};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use serde::Serialize;
use std::convert::Infallible;

/// Formats the chunks of one kind of streamed answer.
pub trait ChunkWriter: Send + 'static {
    /// The chunk sent before any text, if any (chat: the assistant role).
    fn opening(&self) -> Option<Bytes>;
    /// The chunk for one delta.
    fn delta(&self, delta: &Delta) -> Bytes;
    /// The final usage chunk.
    fn usage(&self, usage: Usage) -> Bytes;
}

/// One `data:` event holding `value` as JSON.
pub fn event<T: Serialize>(value: &T) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, value).expect("serializing a chunk");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What every chunk of one streamed answer repeats: id, object, created, model.
#[derive(Clone)]
pub struct ChunkHeader {
    /// The id the client sees.
    pub id: String,
    /// `text_completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Creation time (unix seconds).
    pub created: u64,
    /// The model name reported.
    pub model: String,
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

impl ChunkHeader {
    /// The event for a chunk with these `choices` and, when given, `usage`.
    pub fn event<C: Serialize>(&self, choices: Vec<C>, usage: Option<Usage>) -> Bytes {
        event(&Chunk { id: &self.id, object: self.object, created: self.created, model: &self.model, choices, usage })
    }
}

const DONE: &[u8] = b"data: [DONE]\n\n";

enum Phase {
    Opening,
    Deltas,
    Finished,
    End,
}

struct StreamState<W> {
    generation: Generation,
    writer: W,
    include_usage: bool,
    phase: Phase,
    /// The first delta, awaited before the response started.
    first: Option<Option<Result<Delta, GenerationError>>>,
}

/// The error chunk for a generation that failed mid-stream: the error answer
/// the request would have had unstreamed.
pub fn error_event(error: &GenerationError) -> Bytes {
    event(&generation_error(error).body())
}

/// A `text/event-stream` response that streams `generation` through `writer`.
///
/// Resolves once the first delta (or failure) is there, so that the response
/// head, the opening chunk and the first delta leave in one write instead of
/// three: with many streams, writes to the clients are most of the work.
pub async fn sse_response<W: ChunkWriter>(mut generation: Generation, writer: W, include_usage: bool) -> Response {
    let first = Some(generation.next_delta().await);
    let state = StreamState { generation, writer, include_usage, phase: Phase::Opening, first };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            match s.phase {
                Phase::Opening => {
                    s.phase = Phase::Deltas;
                    if let Some(chunk) = s.writer.opening() {
                        return Some((Ok::<Bytes, Infallible>(chunk), s));
                    }
                }
                Phase::Deltas => match match s.first.take() {
                    Some(first) => first,
                    None => s.generation.next_delta().await,
                } {
                    Some(Ok(delta)) => {
                        let chunk = s.writer.delta(&delta);
                        if delta.finish.is_none() {
                            // The usual case: the chunk goes out as it is, no copy.
                            return Some((Ok(chunk), s));
                        }
                        let mut last = chunk.to_vec();
                        if s.include_usage {
                            last.extend_from_slice(&s.writer.usage(s.generation.usage()));
                        }
                        last.extend_from_slice(DONE);
                        s.phase = Phase::End;
                        return Some((Ok(Bytes::from(last)), s));
                    }
                    Some(Err(error)) => {
                        s.phase = Phase::Finished;
                        return Some((Ok(error_event(&error)), s));
                    }
                    None => s.phase = Phase::Finished,
                },
                Phase::Finished => {
                    s.phase = Phase::End;
                    return Some((Ok(Bytes::from_static(DONE)), s));
                }
                Phase::End => return None,
            }
        }
    });
    event_stream_response(Body::from_stream(body))
}

fn event_stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// One output of one choice of an answer with n > 1: the choice's index,
/// its delta or failure, and its token counts so far.
type ChoiceOutput = (usize, Result<Delta, GenerationError>, Usage);

/// The outputs of one choice, up to and including its last delta or failure.
fn choice_outputs(index: usize, generation: Generation) -> BoxStream<'static, ChoiceOutput> {
    stream::unfold(Some(generation), move |generation| async move {
        let mut generation = generation?;
        let output = generation.next_delta().await?;
        let running = matches!(&output, Ok(delta) if delta.finish.is_none());
        let usage = generation.usage();
        // A finished (or failed) choice's generation goes; the others run on.
        Some(((index, output, usage), running.then_some(generation)))
    })
    .boxed()
}

struct ChoicesState<W> {
    /// Every running choice's outputs, merged as they come.
    outputs: SelectAll<BoxStream<'static, ChoiceOutput>>,
    /// One writer per choice, by index.
    writers: Vec<W>,
    include_usage: bool,
    /// The usage of the choices that finished.
    usage: Usage,
    /// The openings of every choice, sent first.
    opening: Option<Vec<u8>>,
    ended: bool,
}

/// A `text/event-stream` response for an answer with n > 1 choices: every
/// choice's opening, then each choice's chunks as they come (each choice
/// ends with its own finish chunk), then the usage of all of them. A
/// failure of one choice ends the stream with its error; dropping the body
/// (client gone) drops every generation, which aborts each one.
pub fn choices_sse_response<W: ChunkWriter>(
    generations: Vec<Generation>,
    writers: Vec<W>,
    include_usage: bool,
) -> Response {
    let opening = writers.iter().filter_map(ChunkWriter::opening).fold(Vec::new(), |mut all, chunk| {
        all.extend_from_slice(&chunk);
        all
    });
    let outputs = stream::select_all(
        generations.into_iter().enumerate().map(|(index, generation)| choice_outputs(index, generation)),
    );
    let state =
        ChoicesState { outputs, writers, include_usage, usage: Usage::default(), opening: Some(opening), ended: false };
    let body = stream::unfold(state, |mut s| async move {
        if let Some(opening) = s.opening.take().filter(|o| !o.is_empty()) {
            return Some((Ok::<Bytes, Infallible>(Bytes::from(opening)), s));
        }
        if s.ended {
            return None;
        }
        loop {
            let Some((index, output, usage)) = s.outputs.next().await else {
                let mut last = Vec::new();
                if s.include_usage {
                    last.extend_from_slice(&s.writers[0].usage(s.usage));
                }
                last.extend_from_slice(DONE);
                s.ended = true;
                return Some((Ok(Bytes::from(last)), s));
            };
            match output {
                Ok(delta) => {
                    if delta.finish.is_some() {
                        s.usage.add_choice(usage);
                    }
                    let chunk = s.writers[index].delta(&delta);
                    if !chunk.is_empty() {
                        return Some((Ok(chunk), s));
                    }
                }
                Err(error) => {
                    let mut last = error_event(&error).to_vec();
                    last.extend_from_slice(DONE);
                    s.outputs = SelectAll::new(); // aborts the other choices now
                    s.ended = true;
                    return Some((Ok(Bytes::from(last)), s));
                }
            }
        }
    });
    event_stream_response(Body::from_stream(body))
}
