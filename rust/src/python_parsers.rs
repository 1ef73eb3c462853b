//! `vllm_rs._core`'s tool-call and reasoning parsers: a thin typed layer over
//! the `vllm-rs-parsers` crate, so the Python API server parses model output
//! with the same code as the `vllm-rs` binary.

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
        let tools = match tools_json {
            None => Vec::new(),
            Some(text) => {
                let value: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| PyValueError::new_err(format!("tools_json is not JSON: {e}")))?;
                parsers::Tool::from_request_tools(&value)
            }
        };
        let inner = parsers::ToolParser::new(name, tools).map_err(|e| PyValueError::new_err(e.to_string()))?;
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
        let tool_calls = out
            .tool_calls
            .into_iter()
            .map(|c| Py::new(py, ToolCall { id: c.id, name: c.name, arguments: c.arguments }))
            .collect::<PyResult<_>>()?;
        Ok(ExtractedToolCalls { tools_called: out.tools_called, content: out.content, tool_calls })
    }

    /// A streaming parser for one output.
    fn stream(&self) -> ToolParserStream {
        ToolParserStream { inner: self.inner.stream() }
    }
}

/// Streams one output's tool calls: `push` each text delta, then `finish`.
#[pyclass(name = "ToolParserStream", module = "vllm_rs._core")]
pub struct ToolParserStream {
    inner: parsers::ToolParserStream,
}

#[pymethods]
impl ToolParserStream {
    /// What `delta` adds, or None when nothing can be sent yet.
    fn push(&mut self, py: Python<'_>, delta: &str) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.push(delta))
    }

    /// What was held back, once the output is complete (None after).
    fn finish(&mut self, py: Python<'_>) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.finish())
    }

    /// Whether a tool call was streamed (finish_reason `tool_calls`).
    #[getter]
    fn tools_called(&self) -> bool {
        self.inner.tools_called()
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

    /// A streaming parser for one output.
    fn stream(&self) -> ReasoningStream {
        ReasoningStream { inner: self.inner.stream() }
    }
}

/// Streams one output's reasoning split: `push` each delta, then `finish`.
#[pyclass(name = "ReasoningStream", module = "vllm_rs._core")]
pub struct ReasoningStream {
    inner: parsers::ReasoningStream,
}

#[pymethods]
impl ReasoningStream {
    /// What `delta` adds, or None when nothing yet.
    fn push(&mut self, py: Python<'_>, delta: &str) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.push(delta))
    }

    /// What was held back, once the output is complete (None after).
    fn finish(&mut self, py: Python<'_>) -> PyResult<Option<DeltaMessage>> {
        delta_to_py(py, self.inner.finish())
    }
}

/// Adds the parser classes and the name lists to `_core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ToolCall>()?;
    m.add_class::<ExtractedToolCalls>()?;
    m.add_class::<DeltaToolCall>()?;
    m.add_class::<DeltaMessage>()?;
    m.add_class::<ToolParser>()?;
    m.add_class::<ToolParserStream>()?;
    m.add_class::<ReasoningParser>()?;
    m.add_class::<ReasoningStream>()?;
    m.add("TOOL_PARSER_NAMES", parsers::TOOL_PARSER_NAMES.to_vec())?;
    m.add("REASONING_PARSER_NAMES", parsers::REASONING_PARSER_NAMES.to_vec())?;
    Ok(())
}
