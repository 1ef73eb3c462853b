//! `mistral`: `[TOOL_CALLS]name[ARGS]{...}` (tokenizers v11 and later, one
//! marker per call) or `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
//! (earlier tokenizers); ids are 9 letters and digits, as Mistral requires.
//!
//! Whole: the content is the text before the first marker (`None` when
//! blank); each call's arguments are `json.dumps` of the JSON the model
//! wrote (its text when it is not JSON). An array after the marker that
//! holds no call leaves it as content. Streamed: the content up to the
//! marker (a possible partial marker held back), each name once `[ARGS]` or
//! the argument JSON begins, then the argument text as written.

use serde_json::Value;

use super::Format;
use crate::ids::IdKind;
use crate::pyjson::dumps;
use crate::stream::{partial_tag_overlap, CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

pub(super) struct Mistral;

/// The calls of an earlier tokenizer's JSON: a call object or a list of them.
fn json_calls(value: &Value) -> Vec<ToolCall> {
    let items = match value {
        Value::Array(items) => items.as_slice(),
        Value::Object(_) => std::slice::from_ref(value),
        _ => return Vec::new(),
    };
    items
        .iter()
        .filter(|item| item.get("name").is_some() || item.get("arguments").is_some())
        .map(|item| ToolCall {
            id: String::new(),
            name: item.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
            arguments: match item.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => dumps(v),
                None => "{}".to_owned(),
            },
        })
        .collect()
}

/// A v11 call segment's name and argument text (`name[ARGS]args` or `name{...}`).
fn split_segment(segment: &str) -> Option<(&str, &str)> {
    if let Some(at) = segment.find(ARGS) {
        return Some((&segment[..at], &segment[at + ARGS.len()..]));
    }
    segment.find('{').map(|at| (&segment[..at], &segment[at..]))
}

/// The first JSON value at the start of `text`, if any.
fn first_json(text: &str) -> Option<Value> {
    serde_json::Deserializer::from_str(text).into_iter::<Value>().next()?.ok()
}

fn v11_arguments(raw: &str) -> String {
    let raw = raw.trim();
    match first_json(raw) {
        Some(value) => dumps(&value),
        None => raw.to_owned(),
    }
}

fn is_pre_v11(after_marker: &str) -> bool {
    matches!(after_marker.trim_start().chars().next(), Some('[' | '{'))
}

impl Format for Mistral {
    fn id_kind(&self) -> IdKind {
        IdKind::Mistral
    }

    fn parse(&self, text: &str, _tools: &[Tool]) -> ExtractedToolCalls {
        let Some(first) = text.find(TOOL_CALLS) else { return ExtractedToolCalls::content_only(text) };
        let content = text[..first].trim();
        let content = (!content.is_empty()).then(|| text[..first].to_owned());
        let segments: Vec<&str> = text[first + TOOL_CALLS.len()..].split(TOOL_CALLS).collect();
        let tool_calls = if is_pre_v11(segments[0]) {
            let json = segments.iter().map(|s| s.trim()).find(|s| !s.is_empty()).unwrap_or_default();
            match first_json(json) {
                Some(value) => {
                    let calls = json_calls(&value);
                    if calls.is_empty() {
                        return ExtractedToolCalls::content_only(json);
                    }
                    calls
                }
                None => return ExtractedToolCalls::content_only(json),
            }
        } else {
            segments
                .iter()
                .filter_map(|segment| split_segment(segment))
                .filter(|(name, _)| !name.trim().is_empty())
                .map(|(name, args)| ToolCall {
                    id: String::new(),
                    name: name.trim().to_owned(),
                    arguments: v11_arguments(args),
                })
                .collect::<Vec<_>>()
        };
        if tool_calls.is_empty() {
            return ExtractedToolCalls::content_only(text);
        }
        ExtractedToolCalls { tools_called: true, content: content.map(|c| c.trim().to_owned()), tool_calls }
    }

    fn snapshot(&self, text: &str, finished: bool, tools: &[Tool]) -> Snapshot {
        let Some(first) = text.find(TOOL_CALLS) else {
            let end = if finished { text.len() } else { text.len() - partial_tag_overlap(text, TOOL_CALLS) };
            return Snapshot { content: text[..end].to_owned(), calls: Vec::new() };
        };
        let content = text[..first].to_owned();
        let after = &text[first + TOOL_CALLS.len()..];
        if is_pre_v11(after) {
            // Earlier tokenizers: the calls are one JSON value; sent once whole.
            let whole = if finished || first_json(after.trim()).is_some() {
                self.parse(text, tools)
            } else {
                ExtractedToolCalls::default()
            };
            let calls = whole
                .tool_calls
                .into_iter()
                .map(|c| CallSnapshot { name: Some(c.name), arguments: c.arguments, settled: true })
                .collect();
            return Snapshot { content, calls };
        }
        let segments: Vec<&str> = after.split(TOOL_CALLS).collect();
        let mut calls = Vec::new();
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let Some((name, args)) = split_segment(segment) else { break };
            if name.trim().is_empty() {
                continue;
            }
            let args =
                if last && !finished { &args[..args.len() - partial_tag_overlap(args, TOOL_CALLS)] } else { args };
            calls.push(CallSnapshot {
                name: Some(name.trim().to_owned()),
                arguments: args.trim_start().to_owned(),
                settled: true,
            });
        }
        Snapshot { content, calls }
    }
}
