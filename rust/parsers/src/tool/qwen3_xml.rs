//! `qwen3_xml` / `qwen3_coder` (one parser in vLLM 0.33):
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Each `<parameter=NAME>` value loses one wrapping newline on each side and
//! becomes a string, converted to the type the request's tool schema gives
//! the parameter (integer, number, boolean, null, object, array), as vLLM's
//! `coerce_to_schema_type` does; the arguments are `json.dumps` of them in
//! order. Content is the text outside the calls, stripped when there are
//! calls. Streamed: content before the first call (unstripped, as vLLM) (a possible partial tag
//! held back), names once `<function=NAME>` is closed, arguments as far as
//! two successive readings agree and whole at `</function>`.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::Format;
use crate::pyjson::dumps;
use crate::stream::{partial_overlap_any, CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

const TOOL_START: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";
const FUNC_PREFIX: &str = "<function=";
const FUNC_END: &str = "</function>";

static PARAM_OPEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<\s*parameter\s*=\s*([^>]*)>").expect("valid regex"));
static PARAM_CLOSE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"<\s*/\s*parameter\s*>").expect("valid regex"));

pub(super) struct Qwen3Xml;

/// One function block as far as the text goes.
struct Block<'a> {
    name: Option<&'a str>,
    body: &'a str,
    closed: bool,
}

/// The text outside calls and the function blocks, in order.
fn scan(text: &str) -> (String, Vec<Block<'_>>) {
    let mut content = String::new();
    let mut blocks = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &text[pos..];
        let next = [TOOL_START, FUNC_PREFIX].iter().filter_map(|m| rest.find(m).map(|at| (at, *m))).min();
        let Some((at, marker)) = next else {
            content.push_str(rest);
            break;
        };
        content.push_str(&rest[..at]);
        let mut cursor = pos + at + marker.len();
        if marker == TOOL_START {
            let inner = &text[cursor..];
            match inner.find(FUNC_PREFIX) {
                Some(f) if inner.find(TOOL_END).is_none_or(|e| f < e) => cursor += f + FUNC_PREFIX.len(),
                _ => {
                    // A block with no function: skipped up to its end.
                    match inner.find(TOOL_END) {
                        Some(e) => {
                            pos = cursor + e + TOOL_END.len();
                            continue;
                        }
                        None => break,
                    }
                }
            }
        }
        let after = &text[cursor..];
        let Some(gt) = after.find('>') else {
            blocks.push(Block { name: None, body: "", closed: false });
            break;
        };
        let name = &after[..gt];
        let body_start = cursor + gt + 1;
        let body_text = &text[body_start..];
        let end = [FUNC_END, FUNC_PREFIX, TOOL_START].iter().filter_map(|m| body_text.find(m).map(|at| (at, *m))).min();
        match end {
            Some((e, FUNC_END)) => {
                blocks.push(Block { name: Some(name), body: &body_text[..e], closed: true });
                pos = body_start + e + FUNC_END.len();
                // The `</tool_call>` that closes the block, and whitespace before it.
                let tail = &text[pos..];
                let trimmed = tail.trim_start();
                if let Some(after_end) = trimmed.strip_prefix(TOOL_END) {
                    pos = text.len() - after_end.len();
                }
            }
            Some((e, _)) => {
                blocks.push(Block { name: Some(name), body: &body_text[..e], closed: true });
                pos = body_start + e;
            }
            None => {
                let body = body_text.strip_suffix(TOOL_END).unwrap_or(body_text);
                blocks.push(Block { name: Some(name), body, closed: false });
                break;
            }
        }
    }
    (content, blocks)
}

/// Strips one leading and one trailing newline (the template's markup).
fn trim_wrapping_newlines(value: &str) -> &str {
    let value = value.strip_prefix('\n').unwrap_or(value);
    value.strip_suffix('\n').unwrap_or(value)
}

/// The parameters of a function body; `partial` keeps an unclosed last one,
/// whose name comes back too.
fn parameters(body: &str, partial: bool) -> (Map<String, Value>, Option<String>) {
    let mut out = Map::new();
    let mut open_key = None;
    let opens: Vec<_> = PARAM_OPEN.captures_iter(body).collect();
    for (i, open) in opens.iter().enumerate() {
        let whole = open.get(0).expect("group 0");
        let value_start = whole.end();
        let next_open = opens.get(i + 1).map(|c| c.get(0).expect("group 0").start());
        let region = &body[value_start..next_open.unwrap_or(body.len())];
        let value = match PARAM_CLOSE.find(region) {
            Some(close) => &region[..close.start()],
            None if next_open.is_some() => region,
            // An open value: a `<` not yet closed by `>` may begin its end tag.
            None if partial && !open[1].is_empty() => {
                open_key = Some(open[1].to_owned());
                match region.rfind('<') {
                    Some(lt) if !region[lt..].contains('>') => &region[..lt],
                    _ => region,
                }
            }
            None => continue,
        };
        let name = open[1].to_owned();
        if !out.contains_key(&name) {
            out.insert(name, Value::String(trim_wrapping_newlines(value).to_owned()));
        }
    }
    (out, open_key)
}

/// The JSON-schema types a parameter may take (vLLM's `extract_types_from_schema`).
fn schema_types(schema: &Value) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        if !types.iter().any(|x| x == t) {
            types.push(t.to_owned());
        }
    };
    match schema.get("type") {
        Some(Value::String(t)) => add(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).for_each(&mut add),
        _ => {}
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        for v in values {
            add(match v {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_f64() => "number",
                Value::Number(_) => "integer",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            });
        }
    }
    for choice in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(options)) = schema.get(choice) {
            for option in options {
                schema_types(option).iter().for_each(|t| add(t));
            }
        }
    }
    if types.is_empty() {
        types.push("string".into());
    }
    types
}

fn normalize_type(t: &str) -> String {
    let t = t.trim().to_ascii_lowercase();
    let alias = match t.as_str() {
        "str" | "text" | "varchar" | "char" | "enum" => "string",
        "int" | "int32" | "int64" | "uint" | "uint32" | "uint64" | "long" | "short" | "unsigned" => "integer",
        "float" | "float32" | "float64" | "double" => "number",
        "bool" => "boolean",
        "dict" => "object",
        "arr" | "list" | "sequence" => "array",
        other => return other.to_owned(),
    };
    alias.to_owned()
}

/// Python's `int(value)`: optional sign, digits with single underscores, space around.
fn python_int(value: &str) -> Option<Value> {
    let v = value.trim();
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    let clean: String = v.chars().filter(|&c| c != '_').collect();
    clean.parse::<i64>().ok().map(Value::from).or_else(|| clean.parse::<u64>().ok().map(Value::from))
}

/// `value` converted as vLLM's `coerce_to_schema_type` converts it.
fn coerce(value: &str, types: &[String]) -> Value {
    let types: Vec<String> = types.iter().map(|t| normalize_type(t)).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    for candidate in ["null", "integer", "number", "boolean", "object", "array", "string"] {
        if !has(candidate) {
            continue;
        }
        match candidate {
            "null" if value.to_lowercase() == "null" => return Value::Null,
            "string" => return Value::String(value.to_owned()),
            "integer" => {
                if let Some(n) = python_int(value) {
                    return n;
                }
            }
            "number" => {
                if let Some(n) = python_int(value) {
                    return n;
                }
                if let Ok(f) = value.trim().parse::<f64>() {
                    if f.is_finite() {
                        if f.fract() == 0.0 && f.abs() < 9.0e15 {
                            return Value::from(f as i64);
                        }
                        return Value::from(f);
                    }
                }
            }
            "boolean" => match value.trim().to_lowercase().as_str() {
                "true" | "1" => return Value::Bool(true),
                "false" | "0" => return Value::Bool(false),
                _ => {}
            },
            "object" | "array" => {
                if let Ok(v) = serde_json::from_str::<Value>(value) {
                    return v;
                }
            }
            _ => {}
        }
    }
    serde_json::from_str::<Value>(value).unwrap_or_else(|_| Value::String(value.to_owned()))
}

/// The properties schema of the tool named `name`.
fn properties<'a>(tools: &'a [Tool], name: &str) -> Option<&'a Map<String, Value>> {
    tools.iter().find(|t| t.name == name)?.parameters.get("properties")?.as_object()
}

/// The parameters as JSON text, typed by the tool's schema when it has one.
/// An open value that the schema types as anything but a string is left
/// out: its JSON may still change form (`"t"` becomes `true`).
fn arguments(name: &str, body: &str, partial: bool, tools: &[Tool]) -> String {
    let (mut params, open_key) = parameters(body, partial);
    if let Some(props) = properties(tools, name) {
        if let Some(key) = open_key {
            let string_only =
                props.get(&key).is_none_or(|schema| schema_types(schema).iter().all(|t| normalize_type(t) == "string"));
            if !string_only {
                params.shift_remove(&key);
            }
        }
        for (key, value) in params.iter_mut() {
            if let (Some(schema), Value::String(s)) = (props.get(key), &*value) {
                *value = coerce(s, &schema_types(schema));
            }
        }
    }
    dumps(&Value::Object(params))
}

impl Format for Qwen3Xml {
    fn parse(&self, text: &str, tools: &[Tool]) -> ExtractedToolCalls {
        let (content, blocks) = scan(text);
        let tool_calls: Vec<ToolCall> = blocks
            .iter()
            .filter_map(|b| {
                let name = b.name?.trim();
                (!name.is_empty()).then(|| ToolCall {
                    id: String::new(),
                    name: name.to_owned(),
                    arguments: arguments(name, b.body, false, tools),
                })
            })
            .collect();
        if tool_calls.is_empty() {
            return ExtractedToolCalls {
                tools_called: false,
                content: Some(content).filter(|c| !c.is_empty()),
                tool_calls,
            };
        }
        let content = content.trim();
        ExtractedToolCalls {
            tools_called: true,
            content: (!content.is_empty()).then(|| content.to_owned()),
            tool_calls,
        }
    }

    fn snapshot(&self, text: &str, finished: bool, tools: &[Tool]) -> Snapshot {
        let first = [TOOL_START, FUNC_PREFIX].iter().filter_map(|m| text.find(m)).min();
        let content = match first {
            Some(at) => text[..at].to_owned(),
            None if finished => text.to_owned(),
            None => text[..text.len() - partial_overlap_any(text, &[TOOL_START, FUNC_PREFIX])].to_owned(),
        };
        let (_, blocks) = scan(text);
        let mut calls = Vec::new();
        for block in blocks {
            let Some(name) = block.name.map(str::trim).filter(|n| !n.is_empty()) else { break };
            let settled = block.closed || finished;
            calls.push(CallSnapshot {
                name: Some(name.to_owned()),
                arguments: arguments(name, block.body, !block.closed, tools),
                settled,
            });
        }
        Snapshot { content, calls }
    }
}
