//! Streaming answers as server-sent events: `data: {json}` per chunk, an
//! error chunk if the generation fails, then `data: [DONE]`. Dropping the
//! body (client gone) drops the generation, which aborts the request.

use crate::http::generation::failure::generation_error;
use crate::http::generation::usage::UsageInfo;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use vllm_rs_generate::{Delta, Generation, GenerationError, Usage};

/// Formats the chunks of one kind of streamed answer. `usage`, when given,
/// is the choice's usage so far, for `stream_options.continuous_usage_stats`.
/// A final delta comes as vLLM's frontend streams it: its text (if any) in
/// one delta, then a delta with the finish alone ([`Delta::split_finish`]).
pub trait ChunkWriter: Send + 'static {
    /// The chunk sent before any text, if any (chat: the assistant role).
    fn opening(&self, usage: Option<UsageInfo>) -> Option<Bytes>;
    /// The chunk for one delta.
    fn delta(&self, delta: &Delta, usage: Option<UsageInfo>) -> Bytes;
    /// The final usage chunk.
    fn usage(&self, usage: UsageInfo) -> Bytes;
}

/// The chunks of one delta through `writer`, each with `usage`: a final
/// delta's text and its finish in chunks of their own.
fn delta_chunks<W: ChunkWriter>(writer: &W, delta: Delta, usage: Option<UsageInfo>) -> Bytes {
    match delta.split_finish() {
        (Some(delta), None) => writer.delta(&delta, usage),
        (content, Some(finish)) => {
            let mut both = content.map(|c| writer.delta(&c, usage).to_vec()).unwrap_or_default();
            both.extend_from_slice(&writer.delta(&finish, usage));
            Bytes::from(both)
        }
        (None, None) => Bytes::new(),
    }
}

/// One `data:` event holding `value` as JSON.
pub fn event<T: Serialize>(value: &T) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, value).expect("serializing a chunk");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What every chunk of one streamed answer repeats: id, object, created,
/// model, kept as the JSON text that opens each chunk's event, so that a
/// stream serializes (and escapes) them once, not once per engine output.
#[derive(Clone)]
pub struct ChunkHeader {
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":`
    prefix: Arc<[u8]>,
}

#[derive(Serialize)]
struct HeaderFields<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
}

impl ChunkHeader {
    /// The header of the chunks of the answer `id` (what the client sees),
    /// of kind `object` (`text_completion` or `chat.completion.chunk`),
    /// created at `created` (unix seconds), from `model` (the name reported).
    pub fn new(id: &str, object: &'static str, created: u64, model: &str) -> ChunkHeader {
        let mut prefix = b"data: ".to_vec();
        serde_json::to_writer(&mut prefix, &HeaderFields { id, object, created, model }).expect("serializing a header");
        // The object's closing brace gives way to the fields that follow.
        prefix.pop();
        prefix.extend_from_slice(b",\"choices\":");
        ChunkHeader { prefix: prefix.into() }
    }

    /// The event for a chunk with these `choices` and, when given, `usage`.
    pub fn event<C: Serialize>(&self, choices: &[C], usage: Option<UsageInfo>) -> Bytes {
        self.event_with_prompt(choices, usage, None)
    }

    /// `event`, with the prompt's token ids on the chunk itself (chat's first
    /// chunk, `return_token_ids`): the fields in the order vLLM's frontend
    /// sends them (id, object, created, model, choices, usage, prompt_token_ids).
    pub fn event_with_prompt<C: Serialize>(
        &self,
        choices: &[C],
        usage: Option<UsageInfo>,
        prompt_token_ids: Option<&[u32]>,
    ) -> Bytes {
        let mut out = Vec::with_capacity(self.prefix.len() + 192);
        out.extend_from_slice(&self.prefix);
        serde_json::to_writer(&mut out, choices).expect("serializing a chunk");
        if let Some(usage) = usage {
            out.extend_from_slice(b",\"usage\":");
            serde_json::to_writer(&mut out, &usage).expect("serializing a chunk");
        }
        if let Some(ids) = prompt_token_ids {
            out.extend_from_slice(b",\"prompt_token_ids\":");
            serde_json::to_writer(&mut out, ids).expect("serializing a chunk");
        }
        out.extend_from_slice(b"}\n\n");
        Bytes::from(out)
    }
}

/// When a stream carries usage: a last chunk of its own, and on every chunk too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// A usage chunk ends the stream (`include_usage`, or the server forces it).
    pub last: bool,
    /// Every chunk carries the usage so far (`continuous_usage_stats`).
    pub continuous: bool,
    /// The last usage chunk has `prompt_tokens_details` (`enable_prompt_tokens_details`).
    pub prompt_details: bool,
}

impl StreamUsage {
    /// The usage on a chunk of a stream with continuous usage stats, when
    /// it has them: no prompt details (vLLM's frontend sends them on the
    /// last usage chunk only).
    fn running(&self, usage: impl FnOnce() -> Usage) -> Option<UsageInfo> {
        self.continuous.then(|| UsageInfo::of(usage(), false))
    }

    /// The last usage chunk's usage.
    fn last(&self, usage: Usage) -> UsageInfo {
        UsageInfo::of(usage, self.prompt_details)
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
    usage: StreamUsage,
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
pub async fn sse_response<W: ChunkWriter>(mut generation: Generation, writer: W, usage: StreamUsage) -> Response {
    let first = Some(generation.next_delta().await);
    let state = StreamState { generation, writer, usage, phase: Phase::Opening, first };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            match s.phase {
                Phase::Opening => {
                    s.phase = Phase::Deltas;
                    let running = s.usage.running(|| s.generation.usage_before_output());
                    if let Some(chunk) = s.writer.opening(running) {
                        return Some((Ok::<Bytes, Infallible>(chunk), s));
                    }
                }
                Phase::Deltas => match match s.first.take() {
                    Some(first) => first,
                    None => s.generation.next_delta().await,
                } {
                    Some(Ok(delta)) => {
                        let running = s.usage.running(|| s.generation.usage());
                        if delta.finish.is_none() {
                            // The usual case: the chunk goes out as it is, no copy.
                            return Some((Ok(s.writer.delta(&delta, running)), s));
                        }
                        let mut last = delta_chunks(&s.writer, delta, running).to_vec();
                        if s.usage.last {
                            last.extend_from_slice(&s.writer.usage(s.usage.last(s.generation.usage())));
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
    stream_usage: StreamUsage,
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
    stream_usage: StreamUsage,
) -> Response {
    let opening = writers.iter().zip(&generations).fold(Vec::new(), |mut all, (writer, generation)| {
        let running = stream_usage.running(|| generation.usage_before_output());
        all.extend_from_slice(&writer.opening(running).unwrap_or_default());
        all
    });
    let outputs = stream::select_all(
        generations.into_iter().enumerate().map(|(index, generation)| choice_outputs(index, generation)),
    );
    let state =
        ChoicesState { outputs, writers, stream_usage, usage: Usage::default(), opening: Some(opening), ended: false };
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
                if s.stream_usage.last {
                    last.extend_from_slice(&s.writers[0].usage(s.stream_usage.last(s.usage)));
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
                    let chunk = delta_chunks(&s.writers[index], delta, s.stream_usage.running(|| usage));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The event's JSON, checked to be one `data:` line.
    fn parsed(event: &Bytes) -> Value {
        let text = std::str::from_utf8(event).unwrap();
        let json = text.strip_prefix("data: ").and_then(|t| t.strip_suffix("\n\n")).expect("one data: event");
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_chunk_is_the_header_then_choices_usage_and_prompt_ids_in_order() {
        // Quotes, a backslash and a control character in the id and the
        // model name: the prefix is serialized JSON, escapes and all.
        let header = ChunkHeader::new("cmpl-\"a\\b\u{1}", "text_completion", 1_700_000_000, "org/m\"odel");
        let choices = [json!({"index": 0, "text": "hi"})];
        let usage = UsageInfo::of(Usage { prompt_tokens: 3, completion_tokens: 1, ..Default::default() }, false);
        let event = header.event_with_prompt(&choices, Some(usage), Some(&[7, 8]));
        let want = json!({
            "id": "cmpl-\"a\\b\u{1}",
            "object": "text_completion",
            "created": 1_700_000_000u64,
            "model": "org/m\"odel",
            "choices": [{"index": 0, "text": "hi"}],
            "usage": serde_json::to_value(usage).unwrap(),
            "prompt_token_ids": [7, 8],
        });
        assert_eq!(parsed(&event), want);
        let text = std::str::from_utf8(&event).unwrap();
        let keys =
            ["\"id\"", "\"object\"", "\"created\"", "\"model\"", "\"choices\"", "\"usage\"", "\"prompt_token_ids\""];
        let places: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(places.windows(2).all(|w| w[0] < w[1]), "fields out of order: {text}");
    }

    #[test]
    fn a_chunk_without_usage_or_prompt_ids_has_neither_field() {
        let header = ChunkHeader::new("chatcmpl-1", "chat.completion.chunk", 5, "toy");
        let event = header.event::<Value>(&[], None);
        assert_eq!(
            std::str::from_utf8(&event).unwrap(),
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":5,\"model\":\"toy\",\"choices\":[]}\n\n"
        );
    }
}
