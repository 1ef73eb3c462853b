//! `vllm_rs._core`'s tool-call and reasoning parsers: a thin typed layer over
//! the `vllm-rs-parsers` crate, so Python parses model output with the same
//! code as the `vllm-rs` binary.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use vllm_rs_parsers as parsers;

/// A complete tool call (`arguments` is JSON text).
#[pyclass(name = "ToolCall", module = "vllm_rs._core", frozen, get_all)]
pub struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// A whole output split into content and tool calls.
#[pyclass(name = "ExtractedToolCalls", module = "vllm_rs._core", frozen, get_all)]
pub struct ExtractedToolCalls {
    tools_called: bool,
    content: Option<String>,
    tool_calls: Vec<Py<ToolCall>>,
}

/// One call's part of a streamed delta.
#[pyclass(name = "DeltaToolCall", module = "vllm_rs._core", frozen, get_all)]
pub struct DeltaToolCall {
    index: usize,
    id: Option<String>,
    #[pyo3(name = "type")]
    kind: Option<&'static str>,
    name: Option<String>,
    arguments: Option<String>,
}

/// One streamed delta: content, reasoning and tool call parts.
#[pyclass(name = "DeltaMessage", module = "vllm_rs._core", frozen, get_all)]
pub struct DeltaMessage {
    content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Vec<Py<DeltaToolCall>>,
}

fn tool_calls_to_py(py: Python<'_>, calls: Vec<parsers::ToolCall>) -> PyResult<Vec<Py<ToolCall>>> {
    calls.into_iter().map(|c| Py::new(py, ToolCall { id: c.id, name: c.name, arguments: c.arguments })).collect()
}

/// The request's `tools` from their JSON text (none when absent).
fn request_tools(tools_json: Option<&str>) -> PyResult<Vec<parsers::Tool>> {
    let Some(text) = tools_json else { return Ok(Vec::new()) };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("tools_json is not JSON: {e}")))?;
    Ok(parsers::Tool::from_request_tools(&value))
}

fn delta_to_py(py: Python<'_>, delta: Option<parsers::DeltaMessage>) -> PyResult<Option<DeltaMessage>> {
    let Some(delta) = delta else { return Ok(None) };
    let tool_calls = delta
        .tool_calls
        .into_iter()
        .map(|c| {
            Py::new(py, DeltaToolCall { index: c.index, id: c.id, kind: c.kind, name: c.name, arguments: c.arguments })
        })
        .collect::<PyResult<_>>()?;
    Ok(Some(DeltaMessage { content: delta.content, reasoning: delta.reasoning, tool_calls }))
}

/// A tool-call parser by vLLM's `--tool-call-parser` name, for one request.
#[pyclass(name = "ToolParser", module = "vllm_rs._core", frozen)]
pub struct ToolParser {
    inner: parsers::ToolParser,
}

#[pymethods]
impl ToolParser {
    /// `tools_json`: the request's `tools` list as JSON text (its function
    /// schemas type `qwen3_xml` arguments). ValueError for an unknown name
    /// or tools that are not JSON.
    #[new]
    #[pyo3(signature = (name, tools_json=None))]
    fn new(name: &str, tools_json: Option<&str>) -> PyResult<Self> {
        let inner = parsers::ToolParser::new(name, request_tools(tools_json)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(ToolParser { inner })
    }

    /// The parser's canonical name (aliases resolved).
    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// Content and tool calls of a whole output.
    fn parse(&self, py: Python<'_>, text: &str) -> PyResult<ExtractedToolCalls> {
        let out = self.inner.parse(text);
        let tool_calls = tool_calls_to_py(py, out.tool_calls)?;
        Ok(ExtractedToolCalls { tools_called: out.tools_called, content: out.content, tool_calls })
    }

    /// A streaming parser for one output (a chat reader with only this parser).
    fn stream(&self) -> ChatOutputStream {
        let reader = parsers::ChatOutputParser::new(None, parsers::ToolMode::Auto(self.inner.clone()), true);
        ChatOutputStream { inner: reader.stream() }
    }
}

/// A reasoning parser by vLLM's `--reasoning-parser` name.
#[pyclass(name = "ReasoningParser", module = "vllm_rs._core", frozen)]
pub struct ReasoningParser {
    inner: parsers::ReasoningParser,
}

#[pymethods]
impl ReasoningParser {
    /// `thinking`: the chat template's `enable_thinking` (qwen3 reads it).
    /// ValueError for an unknown name.
    #[new]
    #[pyo3(signature = (name, thinking=true))]
    fn new(name: &str, thinking: bool) -> PyResult<Self> {
        let inner = parsers::ReasoningParser::new(name).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(ReasoningParser { inner: inner.with_thinking(thinking) })
    }

    /// The parser's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// `(reasoning, content)` of a whole output.
    fn parse(&self, text: &str) -> (Option<String>, Option<String>) {
        let out = self.inner.parse(text);
        (out.reasoning, out.content)
    }

    /// A streaming parser for one output (a chat reader with only this parser).
    fn stream(&self) -> ChatOutputStream {
        let reader = parsers::ChatOutputParser::new(Some(self.inner.clone()), parsers::ToolMode::None, true);
        ChatOutputStream { inner: reader.stream() }
    }
}

/// `(reasoning, content, tool_calls)` of a whole chat choice.
type ParsedChoice = (Option<String>, Option<String>, Vec<Py<ToolCall>>);

/// Reads one chat choice's output as vLLM's chat endpoint does: reasoning
/// split off (when `reasoning_parser` is given), then tool calls by
/// `tool_choice` mode: `none`, `auto` (through `tool_parser`), `named`
/// (`function_name`'s arguments) or `required` (a JSON array of calls).
#[pyclass(name = "ChatOutputParser", module = "vllm_rs._core", frozen)]
pub struct ChatOutputParser {
    inner: parsers::ChatOutputParser,
}

#[pymethods]
impl ChatOutputParser {
    /// ValueError for an unknown mode or parser name, `auto` without
    /// `tool_parser`, `named` without `function_name`, or tools that are not JSON.
    #[new]
    #[pyo3(signature = (mode, tool_parser=None, function_name=None, tools_json=None, reasoning_parser=None, thinking=true, parallel_tool_calls=true))]
    fn new(
        mode: &str,
        tool_parser: Option<&str>,
        function_name: Option<String>,
        tools_json: Option<&str>,
        reasoning_parser: Option<&str>,
        thinking: bool,
        parallel_tool_calls: bool,
    ) -> PyResult<Self> {
        let value_error = |e: &dyn std::fmt::Display| PyValueError::new_err(e.to_string());
        let tools = match mode {
            "none" => parsers::ToolMode::None,
            "auto" => {
                let name = tool_parser.ok_or_else(|| PyValueError::new_err("mode auto needs tool_parser"))?;
                let parser = parsers::ToolParser::new(name, request_tools(tools_json)?);
                parsers::ToolMode::Auto(parser.map_err(|e| value_error(&e))?)
            }
            "named" => parsers::ToolMode::Named(
                function_name.ok_or_else(|| PyValueError::new_err("mode named needs function_name"))?,
            ),
            "required" => parsers::ToolMode::Required,
            other => return Err(PyValueError::new_err(format!("unknown tool mode {other:?}"))),
        };
        let reasoning = reasoning_parser
            .map(|name| parsers::ReasoningParser::new(name).map(|p| p.with_thinking(thinking)))
            .transpose()
            .map_err(|e| value_error(&e))?;
        Ok(ChatOutputParser { inner: parsers::ChatOutputParser::new(reasoning, tools, parallel_tool_calls) })
    }

    /// `(reasoning, content, tool_calls)` of a whole output.
    fn parse(&self, py: Python<'_>, text: &str) -> PyResult<ParsedChoice> {
        let out = self.inner.parse(text);
        Ok((out.reasoning, out.content, tool_calls_to_py(py, out.tool_calls)?))
    }

    /// A streaming reader for one output.
    fn stream(&self) -> ChatOutputStream {
        ChatOutputStream { inner: self.inner.stream() }
    }
}

/// Streams one chat choice's output: `push` each text delta, then `finish`.
#[pyclass(name = "ChatOutputStream", module = "vllm_rs._core")]
pub struct ChatOutputStream {
    inner: parsers::ChatOutputStream,
}

#[pymethods]
impl ChatOutputStream {
    /// What `delta` adds, or None when nothing can be sent yet.
    fn push(&mut self, py: Python<'_>, delta: &str) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.push(delta))
    }

    /// What was held back, once the output is complete (None after).
    fn finish(&mut self, py: Python<'_>) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.finish())
    }

    /// Whether a tool call was streamed.
    #[getter]
    fn tools_called(&self) -> bool {
        self.inner.tools_called()
    }
}

/// The structured-outputs JSON schema (as JSON text) vLLM builds for
/// `tool_choice: "required"` from the request's `tools` (JSON text).
/// ValueError (vLLM's message) when the tools' `$defs` clash.
#[pyfunction]
#[pyo3(signature = (tools_json, parallel_tool_calls=true))]
fn required_tools_schema(tools_json: &str, parallel_tool_calls: bool) -> PyResult<String> {
    let value: serde_json::Value =
        serde_json::from_str(tools_json).map_err(|e| PyValueError::new_err(format!("tools_json is not JSON: {e}")))?;
    let functions: Vec<(String, Option<serde_json::Value>)> = parsers::Tool::from_request_tools(&value)
        .into_iter()
        .map(|t| (t.name, Some(t.parameters).filter(|p| !p.is_null())))
        .collect();
    let schema = parsers::required_tools_schema(&functions, parallel_tool_calls)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(schema.to_string())
}

/// Adds the parser classes and the name lists to `_core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ToolCall>()?;
    m.add_class::<ExtractedToolCalls>()?;
    m.add_class::<DeltaToolCall>()?;
    m.add_class::<DeltaMessage>()?;
    m.add_class::<ToolParser>()?;
    m.add_class::<ReasoningParser>()?;
    m.add_class::<ChatOutputParser>()?;
    m.add_class::<ChatOutputStream>()?;
    m.add_function(wrap_pyfunction!(required_tools_schema, m)?)?;
    m.add("TOOL_PARSER_NAMES", parsers::TOOL_PARSER_NAMES.to_vec())?;
    m.add("REASONING_PARSER_NAMES", parsers::REASONING_PARSER_NAMES.to_vec())?;
    Ok(())
}
