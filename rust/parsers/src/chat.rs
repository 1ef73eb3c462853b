//! One chat choice's output read as vLLM 0.33's chat endpoint reads it:
//! reasoning split off first (when a reasoning parser is set), then tool
//! calls read from the rest as the request's `tool_choice` says:
//!
//! - `auto`: the configured tool parser reads calls in the model's format;
//! - a named function: the output (constrained to the function's parameter
//!   schema) is that function's arguments;
//! - `required`: the output (constrained to [`required_tools_schema`]) is a
//!   JSON array of `{"name", "parameters"}`, one call each;
//! - `none`: no calls are read.
//!
//! Whole ([`ChatOutputParser::parse`]) or streamed
//! ([`ChatOutputParser::stream`]), with vLLM's deltas.

use serde_json::{json, Map, Value};

use crate::ids::IdKind;
use crate::pyjson::dumps;
use crate::reasoning::{ReasoningParser, ReasoningStream};
use crate::tool::{ToolParser, ToolParserStream};
use crate::types::{DeltaMessage, DeltaToolCall, ToolCall};

/// How tool calls are read from an output.
#[derive(Debug, Clone)]
pub enum ToolMode {
    /// No calls (`tool_choice: none`, no tools, or no auto tool parser).
    None,
    /// `auto`: the parser reads calls in the model's own format.
    Auto(ToolParser),
    /// A named function: the output is its arguments.
    Named(String),
    /// `required`: the output is a JSON array of `{"name", "parameters"}`.
    Required,
}

/// A whole output, read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatOutput {
    /// The reasoning text (vLLM's `reasoning`).
    pub reasoning: Option<String>,
    /// The content (`""` rather than `None` for a named or required choice, as vLLM).
    pub content: Option<String>,
    /// The calls read.
    pub tool_calls: Vec<ToolCall>,
}

/// Reads one chat choice's output.
#[derive(Debug, Clone)]
pub struct ChatOutputParser {
    reasoning: Option<ReasoningParser>,
    tools: ToolMode,
    parallel_tool_calls: bool,
}

impl ChatOutputParser {
    /// A reader for one request; `parallel_tool_calls: false` keeps only the
    /// first call (vLLM's `maybe_filter_parallel_tool_calls`).
    pub fn new(reasoning: Option<ReasoningParser>, tools: ToolMode, parallel_tool_calls: bool) -> Self {
        ChatOutputParser { reasoning, tools, parallel_tool_calls }
    }

    /// Whether the choice is forced to call (named or required).
    fn forced(&self) -> bool {
        matches!(self.tools, ToolMode::Named(_) | ToolMode::Required)
    }

    /// Reasoning, content and tool calls of a whole output.
    pub fn parse(&self, text: &str) -> ChatOutput {
        let (reasoning, content) = match &self.reasoning {
            Some(parser) => {
                let split = parser.parse(text);
                (split.reasoning, split.content)
            }
            None => (None, Some(text.to_owned())),
        };
        let (mut tool_calls, mut content) = match &self.tools {
            ToolMode::None => (Vec::new(), content),
            ToolMode::Auto(parser) => {
                let extracted = parser.parse(content.as_deref().unwrap_or(""));
                if extracted.tools_called {
                    let content = extracted.content.filter(|c| !c.trim().is_empty());
                    (extracted.tool_calls, content)
                } else {
                    (Vec::new(), content)
                }
            }
            ToolMode::Named(name) => match content {
                Some(arguments) if !arguments.trim().is_empty() => {
                    (vec![ToolCall { id: IdKind::Chatcmpl.make(), name: name.clone(), arguments }], None)
                }
                _ => (Vec::new(), None),
            },
            ToolMode::Required => (required_calls(content.as_deref().unwrap_or("")), None),
        };
        if self.forced() {
            content.get_or_insert_with(String::new);
        }
        if !self.parallel_tool_calls {
            tool_calls.truncate(1);
        }
        ChatOutput { reasoning, content, tool_calls }
    }

    /// A streaming reader: feed it the output's text deltas in order.
    pub fn stream(&self) -> ChatOutputStream {
        let tools = match &self.tools {
            ToolMode::None => ToolStream::None,
            ToolMode::Auto(parser) => ToolStream::Auto(Box::new(parser.stream())),
            ToolMode::Named(name) => ToolStream::Named { name: name.clone(), announced: false },
            ToolMode::Required => ToolStream::Required { text: String::new() },
        };
        ChatOutputStream {
            reasoning: self.reasoning.as_ref().map(ReasoningParser::stream),
            tools,
            parallel_tool_calls: self.parallel_tool_calls,
            calls_sent: false,
            finished: false,
        }
    }
}

/// The calls of a `required` output: a JSON array of `{"name", "parameters"}`
/// (vLLM's `list[FunctionDefinition]`); anything else reads as no call.
fn required_calls(text: &str) -> Vec<ToolCall> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    let mut calls = Vec::with_capacity(items.len());
    for item in items {
        let Some(name) = item.get("name").and_then(Value::as_str) else { return Vec::new() };
        let parameters = item.get("parameters").cloned().unwrap_or(Value::Null);
        if !(parameters.is_object() || parameters.is_null()) {
            return Vec::new();
        }
        calls.push(ToolCall { id: IdKind::Chatcmpl.make(), name: name.to_owned(), arguments: dumps(&parameters) });
    }
    calls
}

enum ToolStream {
    None,
    Auto(Box<ToolParserStream>),
    Named { name: String, announced: bool },
    Required { text: String },
}

/// Streams one output: [`push`](Self::push) each text delta, then
/// [`finish`](Self::finish) once.
pub struct ChatOutputStream {
    reasoning: Option<ReasoningStream>,
    tools: ToolStream,
    parallel_tool_calls: bool,
    calls_sent: bool,
    finished: bool,
}

impl std::fmt::Debug for ChatOutputStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatOutputStream").field("calls_sent", &self.calls_sent).finish()
    }
}

impl ChatOutputStream {
    /// What `delta` adds (reasoning, content, tool call parts); `None` when
    /// nothing can be sent yet.
    pub fn push(&mut self, delta: &str) -> Option<DeltaMessage> {
        if self.finished {
            return None;
        }
        self.step(delta, false)
    }

    /// Whatever was held back, once the output is complete. Later calls
    /// return `None`.
    pub fn finish(&mut self) -> Option<DeltaMessage> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        self.step("", true)
    }

    /// Whether a tool call was streamed.
    pub fn tools_called(&self) -> bool {
        self.calls_sent
    }

    fn step(&mut self, delta: &str, finished: bool) -> Option<DeltaMessage> {
        let (reasoning, content) = match &mut self.reasoning {
            Some(stream) => {
                let out = if finished { stream.finish() } else { stream.push(delta) };
                out.map_or((None, None), |d| (d.reasoning, d.content))
            }
            None => (None, (!delta.is_empty()).then(|| delta.to_owned())),
        };
        let mut out = self.tool_step(content, finished);
        out.reasoning = reasoning;
        if !self.parallel_tool_calls {
            out.tool_calls.retain(|call| call.index == 0);
        }
        if !out.tool_calls.is_empty() {
            self.calls_sent = true;
        }
        (!out.is_empty()).then_some(out)
    }

    fn tool_step(&mut self, content: Option<String>, finished: bool) -> DeltaMessage {
        match &mut self.tools {
            ToolStream::None => DeltaMessage { content, ..Default::default() },
            ToolStream::Auto(stream) => {
                let mut out = content.and_then(|c| stream.push(&c)).unwrap_or_default();
                if finished {
                    if let Some(rest) = stream.finish() {
                        append(&mut out.content, rest.content);
                        merge_calls(&mut out.tool_calls, rest.tool_calls);
                    }
                }
                out
            }
            ToolStream::Named { name, announced } => {
                let Some(arguments) = content.filter(|c| !c.is_empty()) else { return DeltaMessage::default() };
                let first = !std::mem::replace(announced, true);
                let call = DeltaToolCall {
                    index: 0,
                    id: first.then(|| IdKind::Chatcmpl.make()),
                    kind: first.then_some("function"),
                    name: first.then(|| name.clone()),
                    arguments: Some(arguments),
                };
                DeltaMessage { tool_calls: vec![call], ..Default::default() }
            }
            ToolStream::Required { text } => {
                let sent = text.len();
                if let Some(c) = content {
                    text.push_str(&c);
                }
                DeltaMessage { tool_calls: required_deltas(text, sent), ..Default::default() }
            }
        }
    }
}

fn append(to: &mut Option<String>, more: Option<String>) {
    if let Some(more) = more {
        to.get_or_insert_with(String::new).push_str(&more);
    }
}

/// Adds `more` to `calls`, joining argument fragments of a call already there.
fn merge_calls(calls: &mut Vec<DeltaToolCall>, more: Vec<DeltaToolCall>) {
    for call in more {
        match calls.iter_mut().find(|c| c.index == call.index) {
            Some(existing) => append(&mut existing.arguments, call.arguments),
            None => calls.push(call),
        }
    }
}

/// Where one element of a `required` array sits in the text (byte offsets,
/// the same for every prefix of the text: vLLM's `_RequiredToolCallSpan`).
#[derive(Debug, Default)]
struct RequiredSpan {
    name: Option<String>,
    name_end: usize,
    args_start: Option<usize>,
    args_end: Option<usize>,
}

impl RequiredSpan {
    fn ready(&self) -> bool {
        self.name.is_some() && self.args_start.is_some()
    }

    /// Whether the first `length` bytes already made this call streamable.
    fn ready_at(&self, length: usize) -> bool {
        self.name.is_some() && self.name_end <= length && self.args_start.is_some_and(|s| s < length)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Key,
    Colon,
    Value,
    InString,
    InContainer,
    InScalar,
    AfterValue,
}

/// Every call of a (possibly partial) `required` array, as vLLM's
/// `_scan_required_tool_calls` finds them: one string- and nesting-aware pass.
fn scan_required(text: &str) -> Vec<RequiredSpan> {
    let mut spans: Vec<RequiredSpan> = Vec::new();
    let (mut depth, mut in_string, mut escaped, mut string_start) = (0usize, false, false, 0usize);
    let mut current = false;
    let mut expect = Expect::Key;
    let mut key: Option<&str> = None;
    let mut value_start = 0usize;
    let end_value =
        |spans: &mut Vec<RequiredSpan>, key: Option<&str>, expect: Expect, value_start: usize, pos: usize| {
            let span = spans.last_mut().expect("a current span");
            if key == Some("parameters") {
                span.args_end = Some(pos);
            } else if key == Some("name") && expect == Expect::InString {
                span.name = serde_json::from_str::<String>(&text[value_start..pos]).ok();
                span.name_end = pos;
            }
        };
    for (i, ch) in text.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if ch == '\\' {
                escaped = true;
            } else if ch == '"' {
                in_string = false;
                if depth == 2 && current {
                    if expect == Expect::Key {
                        key = Some(&text[string_start + 1..i]);
                        expect = Expect::Colon;
                    } else if expect == Expect::InString {
                        end_value(&mut spans, key, expect, value_start, i + 1);
                        expect = Expect::AfterValue;
                    }
                }
            }
            continue;
        }
        let start_value = |spans: &mut Vec<RequiredSpan>, key: Option<&str>| {
            if key == Some("parameters") {
                spans.last_mut().expect("a current span").args_start = Some(i);
            }
        };
        match ch {
            '"' => {
                in_string = true;
                string_start = i;
                if depth == 2 && current && expect == Expect::Value {
                    value_start = i;
                    start_value(&mut spans, key);
                    expect = Expect::InString;
                }
            }
            '{' | '[' => {
                if depth == 0 && ch != '[' || depth == 1 && ch != '{' {
                    return spans;
                }
                if depth == 1 {
                    spans.push(RequiredSpan::default());
                    current = true;
                    expect = Expect::Key;
                    key = None;
                } else if depth == 2 && current && expect == Expect::Value {
                    value_start = i;
                    start_value(&mut spans, key);
                    expect = Expect::InContainer;
                }
                depth += 1;
            }
            '}' | ']' => {
                if depth == 2 && current && expect == Expect::InScalar {
                    end_value(&mut spans, key, expect, value_start, i);
                    expect = Expect::AfterValue;
                }
                depth = depth.saturating_sub(1);
                if depth == 2 && current && expect == Expect::InContainer {
                    end_value(&mut spans, key, expect, value_start, i + 1);
                    expect = Expect::AfterValue;
                } else if depth == 1 {
                    current = false;
                } else if depth == 0 {
                    return spans;
                }
            }
            _ if depth != 2 || !current => {}
            ':' if expect == Expect::Colon => expect = Expect::Value,
            ':' => {}
            ',' => {
                if expect == Expect::InScalar {
                    end_value(&mut spans, key, expect, value_start, i);
                }
                expect = Expect::Key;
                key = None;
            }
            c if c.is_whitespace() && expect == Expect::InScalar => {
                end_value(&mut spans, key, expect, value_start, i);
                expect = Expect::AfterValue;
            }
            c if c.is_whitespace() => {}
            _ if expect == Expect::Value => {
                value_start = i;
                start_value(&mut spans, key);
                expect = Expect::InScalar;
            }
            _ => {}
        }
    }
    spans
}

/// The call parts a `required` array's text adds past its first `sent`
/// bytes (vLLM's `extract_required_tool_call_streaming`): a call's first part
/// has its id, name and the arguments so far, later ones new argument text.
fn required_deltas(text: &str, sent: usize) -> Vec<DeltaToolCall> {
    let mut parts = Vec::new();
    for (index, span) in scan_required(text).iter().enumerate() {
        if !span.ready() {
            break;
        }
        let start = span.args_start.expect("ready");
        let end = span.args_end.unwrap_or(text.len());
        if span.ready_at(sent) {
            let from = end.min(sent);
            if end > from {
                parts.push(DeltaToolCall {
                    index,
                    id: None,
                    kind: None,
                    name: None,
                    arguments: Some(text[from..end].to_owned()),
                });
            }
            continue;
        }
        parts.push(DeltaToolCall {
            index,
            id: Some(IdKind::Chatcmpl.make()),
            kind: Some("function"),
            name: span.name.clone(),
            arguments: Some(text[start..end].to_owned()),
        });
    }
    parts
}

/// A request's tools whose function parameters could not be combined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolSchemaError(pub String);

/// A function's `parameters`, or an empty object schema when it has none
/// (vLLM's `_params_or_empty_object`): the structured-outputs schema of a
/// named `tool_choice`.
pub fn named_tool_schema(parameters: Option<&Value>) -> Value {
    match parameters {
        Some(Value::Object(map)) if !map.is_empty() => Value::Object(map.clone()),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The structured-outputs schema vLLM 0.33 builds for `tool_choice:
/// "required"` (`_get_json_schema_from_tools`): an array of at least one
/// `{"name", "parameters"}` object, one shape per function, at most one item
/// when `parallel_tool_calls` is false, the functions' `$defs` merged.
/// `functions` are `(name, parameters)` of the request's function tools.
pub fn required_tools_schema(
    functions: &[(String, Option<Value>)],
    parallel_tool_calls: bool,
) -> Result<Value, ToolSchemaError> {
    let mut defs = Map::new();
    let mut shapes = Vec::with_capacity(functions.len());
    for (name, parameters) in functions {
        let mut parameters = parameters.clone();
        if let Some(Value::Object(map)) = &mut parameters {
            match map.remove("$defs") {
                None => {}
                Some(Value::Object(found)) => {
                    for (def_name, schema) in found {
                        if defs.get(&def_name).is_some_and(|known| known != &schema) {
                            return Err(ToolSchemaError(format!(
                                "Tool definition '{def_name}' has multiple schemas, which is not supported."
                            )));
                        }
                        defs.insert(def_name, schema);
                    }
                }
                Some(other) => {
                    return Err(ToolSchemaError(format!(
                        "`$defs` in the parameters of tool '{name}' must be an object, got {}.",
                        python_type_name(&other)
                    )))
                }
            }
        }
        shapes.push(json!({
            "properties": {
                "name": {"type": "string", "enum": [name]},
                "parameters": named_tool_schema(parameters.as_ref()),
            },
            "required": ["name", "parameters"],
        }));
    }
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": shapes}});
    if !parallel_tool_calls {
        schema["maxItems"] = json!(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

fn python_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(deltas: &[DeltaMessage]) -> (String, String, Vec<(String, String)>) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut calls: Vec<(String, String)> = Vec::new();
        for d in deltas {
            reasoning.push_str(d.reasoning.as_deref().unwrap_or(""));
            content.push_str(d.content.as_deref().unwrap_or(""));
            for c in &d.tool_calls {
                if let Some(name) = &c.name {
                    assert_eq!(c.index, calls.len());
                    calls.push((name.clone(), String::new()));
                }
                calls[c.index].1.push_str(c.arguments.as_deref().unwrap_or(""));
            }
        }
        (reasoning, content, calls)
    }

    fn stream_by_chars(parser: &ChatOutputParser, text: &str) -> (Vec<DeltaMessage>, bool) {
        let mut stream = parser.stream();
        let mut out: Vec<DeltaMessage> = text.chars().filter_map(|c| stream.push(&c.to_string())).collect();
        out.extend(stream.finish());
        (out, stream.tools_called())
    }

    #[test]
    fn required_arrays_parse_whole_and_streamed() {
        let parser = ChatOutputParser::new(None, ToolMode::Required, true);
        let text = r#"[{"name": "f", "parameters": {"a": [1, "}"]}}, {"name":"g","parameters":{}}]"#;
        let whole = parser.parse(text);
        assert_eq!(whole.content.as_deref(), Some(""));
        let calls: Vec<_> = whole.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(calls, [("f", r#"{"a": [1, "}"]}"#), ("g", "{}")]);
        let (deltas, called) = stream_by_chars(&parser, text);
        assert!(called);
        let (_, content, calls) = joined(&deltas);
        assert_eq!(content, "");
        assert_eq!(calls, [("f".into(), r#"{"a": [1, "}"]}"#.into()), ("g".into(), "{}".into())]);
        assert!(parser.parse("not json").tool_calls.is_empty());
        let single = ChatOutputParser::new(None, ToolMode::Required, false);
        assert_eq!(single.parse(text).tool_calls.len(), 1);
    }

    #[test]
    fn named_choice_takes_the_output_as_arguments() {
        let parser = ChatOutputParser::new(None, ToolMode::Named("f".into()), true);
        let whole = parser.parse("{\"x\": 1}");
        assert_eq!((whole.tool_calls[0].name.as_str(), whole.tool_calls[0].arguments.as_str()), ("f", "{\"x\": 1}"));
        let (deltas, _) = stream_by_chars(&parser, "{\"x\": 1}");
        assert!(deltas[0].tool_calls[0].id.as_deref().unwrap().starts_with("chatcmpl-tool-"));
        assert_eq!(joined(&deltas).2, [("f".into(), "{\"x\": 1}".into())]);
    }

    #[test]
    fn reasoning_then_auto_tool_calls() {
        let reasoning = ReasoningParser::new("deepseek_r1").unwrap();
        let tools = ToolMode::Auto(ToolParser::new("hermes", Vec::new()).unwrap());
        let parser = ChatOutputParser::new(Some(reasoning), tools, true);
        let text = "hmm</think>ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
        let whole = parser.parse(text);
        assert_eq!((whole.reasoning.as_deref(), whole.content.as_deref()), (Some("hmm"), Some("ok ")));
        assert_eq!(whole.tool_calls[0].arguments, "{\"a\": 1}");
        let (deltas, called) = stream_by_chars(&parser, text);
        assert!(called);
        let (r, c, calls) = joined(&deltas);
        assert_eq!((r.as_str(), c.as_str()), ("hmm", "ok "));
        assert_eq!(calls, [("f".into(), "{\"a\": 1}".into())]);
    }

    #[test]
    fn required_schema_is_vllms() {
        let functions = vec![
            ("f".to_owned(), Some(json!({"type": "object", "$defs": {"D": {"type": "integer"}}}))),
            ("g".to_owned(), None),
        ];
        let schema = required_tools_schema(&functions, false).unwrap();
        assert_eq!(schema["maxItems"], 1);
        assert_eq!(schema["$defs"], json!({"D": {"type": "integer"}}));
        assert_eq!(
            schema["items"]["anyOf"][1]["properties"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        let clash = vec![
            ("f".to_owned(), Some(json!({"$defs": {"D": {"type": "integer"}}}))),
            ("g".to_owned(), Some(json!({"$defs": {"D": {"type": "string"}}}))),
        ];
        assert!(required_tools_schema(&clash, true).is_err());
    }
}
