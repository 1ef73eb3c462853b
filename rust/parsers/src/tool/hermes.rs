//! `hermes` (also vLLM's `qwen3_json`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! Whole: every `<tool_call>` block (the last may be unclosed) must be a JSON
//! object with `name` and `arguments`, else the whole text is content; the
//! content is the text before the first block. Streamed: the content before
//! the first block (a possible partial `<tool_call>` held back), then per
//! block the name once its string is whole and the arguments as the model
//! writes them, as vLLM streams them.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::Format;
use crate::pyjson::dumps;
use crate::stream::{partial_tag_overlap, CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

static BLOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<tool_call>(.*?)</tool_call>|<tool_call>(.*)").expect("valid regex"));
static NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#""name"\s*:\s*"([^"]+)""#).expect("valid regex"));
static ARGUMENTS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#""arguments"\s*:\s*"#).expect("valid regex"));

pub(super) struct Hermes;

/// A block's call, or `None` when it is not `{"name": str, "arguments": any}`.
fn block_call(json: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(json).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = dumps(value.get("arguments")?);
    Some(ToolCall { id: String::new(), name, arguments })
}

impl Format for Hermes {
    fn parse(&self, text: &str, _tools: &[Tool]) -> ExtractedToolCalls {
        let Some(first) = text.find(START) else { return ExtractedToolCalls::content_only(text) };
        let calls: Option<Vec<ToolCall>> = BLOCK
            .captures_iter(text)
            .map(|c| block_call(c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str())))
            .collect();
        match calls {
            Some(tool_calls) => ExtractedToolCalls {
                tools_called: true,
                content: Some(text[..first].to_owned()).filter(|c| !c.is_empty()),
                tool_calls,
            },
            None => ExtractedToolCalls::content_only(text),
        }
    }

    fn snapshot(&self, text: &str, finished: bool, _tools: &[Tool]) -> Snapshot {
        let content_end = match text.find(START) {
            Some(at) => at,
            None if finished => text.len(),
            None => text.len() - partial_tag_overlap(text, START),
        };
        let mut snapshot = Snapshot { content: text[..content_end].to_owned(), calls: Vec::new() };
        for (json, complete) in blocks(text) {
            let Some(name) = NAME.captures(json).map(|c| c[1].to_owned()) else { break };
            let arguments = match ARGUMENTS.find(json) {
                Some(m) => {
                    let raw = &json[m.end()..];
                    if complete {
                        let raw = raw.trim_end();
                        raw.strip_suffix('}').unwrap_or(raw).trim_end().to_owned()
                    } else {
                        raw.to_owned()
                    }
                }
                None => String::new(),
            };
            snapshot.calls.push(CallSnapshot { name: Some(name), arguments, settled: true });
        }
        snapshot
    }
}

/// The JSON text of every `<tool_call>` block so far and whether it is whole
/// (closed, or valid JSON already).
fn blocks(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(start) = text[pos..].find(START).map(|i| pos + i) {
        let body = start + START.len();
        match text[body..].find(END) {
            Some(end) => {
                out.push((text[body..body + end].trim(), true));
                pos = body + end + END.len();
            }
            None => {
                let raw = &text[body..];
                let raw = raw[..raw.len() - partial_tag_overlap(raw, END)].trim();
                let complete = !raw.is_empty() && serde_json::from_str::<Value>(raw).is_ok();
                out.push((raw, complete));
                break;
            }
        }
    }
    out
}
