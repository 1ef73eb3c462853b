//! `llama3_json` (and `llama4_json`): `{"name": ..., "parameters": {...}}`,
//! optionally after `<|python_tag|>`, several joined by `; `.
//!
//! Whole: every JSON object in the text (from each `{` not inside an earlier
//! one) must decode and have `name` and `arguments` or `parameters`, else
//! the whole text is content; text around the objects is dropped. Streamed:
//! an output that does not begin with `<|python_tag|>` or `{` is content;
//! otherwise the objects are read as partial JSON, each call's name sent
//! once whole and its arguments (`json.dumps` of the partial value) as far as
//! two successive readings agree, as vLLM does.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::Format;
use crate::partial::parse_partial_json;
use crate::pyjson::dumps;
use crate::stream::{CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

const BOT: &str = "<|python_tag|>";

static NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""name"\s*:\s*"((?:[^"\\]|\\.)*)""#).expect("valid regex"));

pub(super) struct Llama3Json;

/// The first JSON value at the start of `text` and where it ends.
fn raw_decode(text: &str) -> Result<(Value, usize), serde_json::Error> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Ok((value, values.byte_offset())),
        Some(Err(e)) => Err(e),
        None => Err(serde::de::Error::custom("no JSON value")),
    }
}

/// Where the next call starts after a whole one that ends at byte `end`:
/// past the two characters of the `; ` separator, counted in characters as
/// vLLM's parser (Python) counts them, so a multi-byte character after a
/// call is skipped whole, never cut (past the end of `body` for none).
fn after_separator(body: &str, end: usize) -> usize {
    body[end..].char_indices().nth("; ".chars().count()).map_or(body.len(), |(i, _)| end + i)
}

/// `arguments`, else `parameters`, of a call object.
fn arguments(object: &Value) -> Option<&Value> {
    object.get("arguments").or_else(|| object.get("parameters"))
}

impl Format for Llama3Json {
    fn parse(&self, text: &str, _tools: &[Tool]) -> ExtractedToolCalls {
        if !(text.contains(BOT) || text.contains('{')) {
            return ExtractedToolCalls::content_only(text);
        }
        let mut calls = Vec::new();
        let mut end = 0;
        for (start, _) in text.match_indices('{') {
            if start < end {
                continue;
            }
            let Ok((object, length)) = raw_decode(&text[start..]) else {
                return ExtractedToolCalls::content_only(text);
            };
            end = start + length;
            let name = object.get("name").and_then(Value::as_str);
            let (Some(name), Some(args)) = (name, arguments(&object)) else {
                return ExtractedToolCalls::content_only(text);
            };
            calls.push(ToolCall { id: String::new(), name: name.to_owned(), arguments: dumps(args) });
        }
        if calls.is_empty() {
            return ExtractedToolCalls::content_only(text);
        }
        ExtractedToolCalls { tools_called: true, content: None, tool_calls: calls }
    }

    fn snapshot(&self, text: &str, finished: bool, _tools: &[Tool]) -> Snapshot {
        let body = match text.strip_prefix(BOT) {
            Some(rest) => rest,
            None if text.starts_with('{') => text,
            // The marker split across deltas: wait for the rest of it.
            None if !finished && BOT.starts_with(text) => return Snapshot::default(),
            None => return Snapshot { content: text.to_owned(), calls: Vec::new() },
        };
        let mut calls = Vec::new();
        let mut pos = 0;
        while pos < body.len() {
            let rest = &body[pos..];
            let (object, complete, next) = match raw_decode(rest) {
                Ok((object, length)) => (object, true, after_separator(body, pos + length)),
                Err(e) if e.is_eof() => match parse_partial_json(rest) {
                    Some(object) => (object, false, body.len()),
                    None => break,
                },
                Err(_) => break,
            };
            // The name is sent only once its string is whole.
            let name = if complete {
                object.get("name").and_then(Value::as_str).map(str::to_owned)
            } else {
                NAME.captures(rest).and_then(|_| object.get("name").and_then(Value::as_str).map(str::to_owned))
            };
            let arguments = arguments(&object).map(dumps).unwrap_or_default();
            calls.push(CallSnapshot { name, arguments, settled: complete });
            pos = next;
        }
        Snapshot { content: String::new(), calls }
    }
}
