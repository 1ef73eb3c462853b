//! `pythonic`: a Python list of calls, `[get_weather(city="Paris"), ...]`.
//!
//! Whole: the text must match vLLM's pre-check expression and parse as one
//! Python list of calls whose keyword values are literals
//! ([`crate::pyliteral`]); the arguments are `json.dumps` of the keywords.
//! Anything else is content. Streamed: an output not beginning with `[` is
//! content; otherwise the partial list is closed as vLLM's
//! `make_valid_python` closes it (not at all while a parameter name or
//! value is still open) and read after each delta, names sent once a call
//! reads, arguments as far as two successive
//! readings agree, as vLLM does.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::Format;
use crate::pyjson::dumps;
use crate::pyliteral::{parse_call_list, parse_call_list_without_sets, PyCall};
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
        // As vLLM, a set in a text whose closing `}` was added is a dict still being written.
        let read = |(candidate, closed_brace): (String, bool)| {
            if closed_brace {
                parse_call_list_without_sets(&candidate).ok()
            } else {
                parse_call_list(&candidate).ok()
            }
        };
        let Some(calls) = make_valid_python(text).and_then(read) else {
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

/// vLLM's `make_valid_python`: `text` with its open quotes and brackets
/// closed (and whether a `}` was added), or `None` while it is too
/// incomplete to read (mid parameter, mid dict key, unbalanced brackets).
fn make_valid_python(text: &str) -> Option<(String, bool)> {
    let mut stack: Vec<char> = Vec::new();
    let mut escaped = false;
    for c in text.chars() {
        if let Some(&q) = stack.last().filter(|q| **q == '\'' || **q == '"') {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                stack.pop();
            }
            continue;
        }
        match c {
            '[' | '(' | '{' | '\'' | '"' => stack.push(c),
            ']' | ')' | '}' => {
                let open = match c {
                    ']' => '[',
                    ')' => '(',
                    _ => '{',
                };
                if stack.pop() != Some(open) {
                    return None;
                }
            }
            _ => {}
        }
    }
    let mut text = text.trim_end();
    if text.ends_with('=') || text.ends_with(':') {
        return None;
    }
    let top = stack.last().copied();
    let before_last = |open: char| &text[..text.rfind(open).unwrap_or(0)];
    if top == Some('{') {
        let before = before_last('{');
        if before.matches(':').count() <= before.matches(',').count() {
            return None;
        }
    }
    if top == Some('(') {
        let before = before_last('(');
        if before.matches('=').count() <= before.matches(',').count() {
            return None;
        }
    }
    text = text.strip_suffix(',').unwrap_or(text);
    if top == Some('[') && !text.ends_with('[') && !text.ends_with(')') {
        return None;
    }
    let closers: String = stack
        .iter()
        .rev()
        .map(|c| match c {
            '[' => ']',
            '(' => ')',
            '{' => '}',
            q => *q,
        })
        .collect();
    let closed_brace = closers.contains('}');
    Some((format!("{text}{closers}"), closed_brace))
}
