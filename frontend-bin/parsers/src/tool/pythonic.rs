//! `pythonic`: a Python list of calls, `[get_weather(city="Paris"), ...]`.
//!
//! Whole: the text must match vLLM's pre-check expression and parse as one
//! Python list of calls whose keyword values are literals
//! ([`crate::pyliteral`]); the arguments are `json.dumps` of the keywords.
//! Anything else is content. Streamed: an output not beginning with `[` is
//! content; otherwise the partial list is closed and read after each delta,
//! names sent once a call's `(` is there, arguments as far as two successive
//! readings agree, as vLLM does.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::Format;
use crate::partial::completions;
use crate::pyjson::dumps;
use crate::pyliteral::{parse_call_list, PyCall};
use crate::stream::{CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

/// vLLM's `TOOL_CALL_REGEX`, anchored as `re.match` anchors it.
static SHAPE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?s)^\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    )
    .expect("valid regex")
});

pub(super) struct Pythonic;

fn arguments(call: &PyCall) -> String {
    dumps(&Value::Object(call.keywords.clone()))
}

impl Format for Pythonic {
    fn parse(&self, text: &str, _tools: &[Tool]) -> ExtractedToolCalls {
        if !SHAPE.is_match(text) {
            return ExtractedToolCalls::content_only(text);
        }
        match parse_call_list(text) {
            Ok(calls) => ExtractedToolCalls {
                tools_called: true,
                content: None,
                tool_calls: calls
                    .iter()
                    .map(|c| ToolCall { id: String::new(), name: c.name.clone(), arguments: arguments(c) })
                    .collect(),
            },
            Err(_) => ExtractedToolCalls::content_only(text),
        }
    }

    fn snapshot(&self, text: &str, finished: bool, tools: &[Tool]) -> Snapshot {
        if !text.starts_with('[') {
            return Snapshot { content: text.to_owned(), calls: Vec::new() };
        }
        if finished {
            let whole = self.parse(text, tools);
            if whole.tools_called {
                let calls = whole
                    .tool_calls
                    .into_iter()
                    .map(|c| CallSnapshot { name: Some(c.name), arguments: c.arguments, settled: true })
                    .collect();
                return Snapshot { content: String::new(), calls };
            }
        }
        let Some(calls) = completions(text, true).iter().find_map(|c| parse_call_list(c).ok()) else {
            return Snapshot::default();
        };
        let last = calls.len().saturating_sub(1);
        let calls = calls
            .iter()
            .enumerate()
            // Every call but the last is closed in the text: its arguments are final.
            .map(|(i, c)| CallSnapshot { name: Some(c.name.clone()), arguments: arguments(c), settled: i < last })
            .collect();
        Snapshot { content: String::new(), calls }
    }
}
