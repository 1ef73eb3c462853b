//! What the parsers return, in the shape of vLLM's protocol classes.

use serde_json::Value;

/// A complete tool call (vLLM's `ToolCall`): `arguments` is a JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `chatcmpl-tool-` + 16 hex digits, or 9 letters and digits for `mistral`.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as a JSON text (an object for every format but
    /// `deepseek_v3`, which passes the model's text through).
    pub arguments: String,
}

/// A whole output split into content and tool calls (vLLM's
/// `ExtractedToolCallInformation`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtractedToolCalls {
    /// Whether the output was read as a tool call (vLLM's `tools_called`);
    /// `deepseek_v3` says so for a call block it could not read, as vLLM.
    pub tools_called: bool,
    /// Text outside the calls; the whole output when none was found; `None`
    /// when empty.
    pub content: Option<String>,
    /// The calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl ExtractedToolCalls {
    /// The output as plain content: no tool call.
    pub(crate) fn content_only(text: &str) -> Self {
        ExtractedToolCalls { tools_called: false, content: Some(text.to_owned()), tool_calls: Vec::new() }
    }
}

/// One tool call's part of a streamed delta (vLLM's `DeltaToolCall`): the
/// first one for an index carries `id`, `type` and `name`, later ones
/// argument fragments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaToolCall {
    /// The call's position among this response's calls.
    pub index: usize,
    /// Present on the call's first delta.
    pub id: Option<String>,
    /// `"function"` on the call's first delta.
    pub kind: Option<&'static str>,
    /// Present on the call's first delta.
    pub name: Option<String>,
    /// The next fragment of the arguments' JSON text.
    pub arguments: Option<String>,
}

/// One streamed delta (vLLM's `DeltaMessage`, without `role`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeltaMessage {
    /// New content text.
    pub content: Option<String>,
    /// New reasoning text (vLLM 0.33's field is `reasoning`).
    pub reasoning: Option<String>,
    /// New tool call parts.
    pub tool_calls: Vec<DeltaToolCall>,
}

impl DeltaMessage {
    /// Whether the delta carries nothing.
    pub fn is_empty(&self) -> bool {
        self.content.is_none() && self.reasoning.is_none() && self.tool_calls.is_empty()
    }
}

/// A whole output split by a reasoning parser.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reasoning {
    /// The reasoning text (vLLM's `reasoning`), `None` when there is none.
    pub reasoning: Option<String>,
    /// The rest, `None` when empty.
    pub content: Option<String>,
}

/// A function the request offers (`tools[].function`): the parsers that
/// convert argument types (`qwen3_xml`) read its parameter schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// Its `parameters` JSON schema (`Value::Null` when absent).
    pub parameters: Value,
}

impl Tool {
    /// Reads the tools of a request body (`tools`: a list of
    /// `{"type": "function", "function": {"name", "parameters"}}`); entries
    /// of another shape are skipped, as vLLM's parsers skip them.
    pub fn from_request_tools(tools: &Value) -> Vec<Tool> {
        let Some(list) = tools.as_array() else { return Vec::new() };
        list.iter()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?.to_owned();
                let parameters = function.get("parameters").cloned().unwrap_or(Value::Null);
                Some(Tool { name, parameters })
            })
            .collect()
    }
}

/// A parser name that vLLM 0.33 has but this crate does not implement, or
/// that vLLM does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} parser {name:?}; supported: {supported}")]
pub struct UnknownParser {
    /// `tool call` or `reasoning`.
    pub kind: &'static str,
    /// The name asked for.
    pub name: String,
    /// The names that work, comma-separated.
    pub supported: String,
}
