//! Tool-call parsers by vLLM's `--tool-call-parser` names.

mod deepseek_v3;
mod hermes;
mod llama3_json;
mod mistral;
mod pythonic;
mod qwen3_xml;

use std::sync::Arc;

use crate::ids::IdKind;
use crate::stream::{Differ, Snapshot};
use crate::types::{DeltaMessage, ExtractedToolCalls, Tool, UnknownParser};

/// The names [`ToolParser::new`] accepts, as vLLM 0.33 registers them
/// (`llama4_json` and `qwen3_json` are vLLM's aliases of `llama3_json` and
/// `hermes`; `qwen3_coder` and `qwen3_xml` are one parser in vLLM 0.33).
pub const TOOL_PARSER_NAMES: &[&str] = &[
    "deepseek_v3",
    "hermes",
    "llama3_json",
    "llama4_json",
    "mistral",
    "pythonic",
    "qwen3_coder",
    "qwen3_json",
    "qwen3_xml",
];

/// One model family's tool-call syntax.
trait Format: Send + Sync {
    /// The whole output, as vLLM's `extract_tool_calls` reads it (ids not yet set).
    fn parse(&self, text: &str, tools: &[Tool]) -> ExtractedToolCalls;
    /// The output so far, for streaming; `finished` when it is all there.
    fn snapshot(&self, text: &str, finished: bool, tools: &[Tool]) -> Snapshot;
    /// Which ids its calls get.
    fn id_kind(&self) -> IdKind {
        IdKind::Chatcmpl
    }
}

/// A tool-call parser for one request: its format and the request's tools.
#[derive(Clone)]
pub struct ToolParser {
    name: &'static str,
    format: Arc<dyn Format>,
    tools: Arc<[Tool]>,
}

impl std::fmt::Debug for ToolParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolParser").field("name", &self.name).field("tools", &self.tools.len()).finish()
    }
}

impl ToolParser {
    /// The parser vLLM registers as `name`, for a request offering `tools`
    /// (only `qwen3_xml`/`qwen3_coder` read them, to type arguments).
    pub fn new(name: &str, tools: Vec<Tool>) -> Result<Self, UnknownParser> {
        let (name, format): (&'static str, Arc<dyn Format>) = match name {
            "hermes" | "qwen3_json" => ("hermes", Arc::new(hermes::Hermes)),
            "llama3_json" | "llama4_json" => ("llama3_json", Arc::new(llama3_json::Llama3Json)),
            "mistral" => ("mistral", Arc::new(mistral::Mistral)),
            "qwen3_xml" | "qwen3_coder" => ("qwen3_xml", Arc::new(qwen3_xml::Qwen3Xml)),
            "deepseek_v3" => ("deepseek_v3", Arc::new(deepseek_v3::DeepSeekV3)),
            "pythonic" => ("pythonic", Arc::new(pythonic::Pythonic)),
            other => {
                return Err(UnknownParser {
                    kind: "tool call",
                    name: other.to_owned(),
                    supported: TOOL_PARSER_NAMES.join(", "),
                })
            }
        };
        Ok(ToolParser { name, format, tools: tools.into() })
    }

    /// The parser's canonical name (aliases resolved).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether a `required` or named `tool_choice` is read from JSON
    /// constrained by structured outputs (vLLM's `supports_required_and_named`);
    /// `mistral` reads them in its own format, as `auto`.
    pub fn supports_required_and_named(&self) -> bool {
        self.name != "mistral"
    }

    /// Content and tool calls of a whole output; malformed calls leave the
    /// whole text as content, as vLLM does.
    pub fn parse(&self, text: &str) -> ExtractedToolCalls {
        let mut out = self.format.parse(text, &self.tools);
        for call in &mut out.tool_calls {
            call.id = self.format.id_kind().make();
        }
        out
    }

    /// A streaming parser: feed it the output's text deltas in order.
    pub fn stream(&self) -> ToolParserStream {
        ToolParserStream {
            parser: self.clone(),
            text: String::new(),
            differ: Differ::new(self.format.id_kind()),
            finished: false,
        }
    }
}

/// Streams one output's tool calls: [`push`](Self::push) each text delta,
/// then [`finish`](Self::finish) once.
#[derive(Debug)]
pub struct ToolParserStream {
    parser: ToolParser,
    text: String,
    differ: Differ,
    finished: bool,
}

impl ToolParserStream {
    /// What `delta` adds: content, new calls (index, id, type, name) and
    /// argument fragments; `None` when nothing can be sent yet (text that
    /// may still become a marker is held back).
    pub fn push(&mut self, delta: &str) -> Option<DeltaMessage> {
        if self.finished {
            return None;
        }
        self.text.push_str(delta);
        let snapshot = self.parser.format.snapshot(&self.text, false, &self.parser.tools);
        self.differ.diff(&snapshot)
    }

    /// Whatever was held back, once the output is complete. Later calls
    /// return `None`.
    pub fn finish(&mut self) -> Option<DeltaMessage> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        let snapshot = self.parser.format.snapshot(&self.text, true, &self.parser.tools);
        self.differ.diff(&snapshot)
    }

    /// Whether a tool call was streamed (the response's `finish_reason` is
    /// then `tool_calls`).
    pub fn tools_called(&self) -> bool {
        self.differ.any_call_sent()
    }

    /// The whole text pushed so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}
