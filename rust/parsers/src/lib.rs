//! vLLM 0.33's tool-call parsers and reasoning parsers, shared by both
//! frontends (the `vllm-rs` binary links this crate; the Python API server
//! reaches it through `vllm_rs._core`).
//!
//! A tool parser turns a model's whole output into content and tool calls
//! ([`ToolParser::parse`]), or, fed one text delta at a time
//! ([`ToolParser::stream`]), yields the deltas vLLM's chat endpoint streams:
//! content first, then per call its id, type and name, then argument
//! fragments. A reasoning parser splits the reasoning text (vLLM's
//! `reasoning` field) from the content the same two ways. Parsers are looked
//! up by vLLM's names ([`TOOL_PARSER_NAMES`], [`REASONING_PARSER_NAMES`]).
//!
//! Malformed model output never fails: like vLLM, a parser then returns the
//! whole text as content.

pub mod chat;
mod ids;
mod partial;
mod pyjson;
mod pyliteral;
pub mod reasoning;
mod stream;
pub mod tool;
mod types;

pub use chat::{
    named_tool_schema, required_tools_schema, ChatOutput, ChatOutputParser, ChatOutputStream, ToolMode, ToolSchemaError,
};
pub use reasoning::{ReasoningParser, ReasoningStream, ReasoningTokenTally, REASONING_PARSER_NAMES};
pub use tool::{ToolParser, ToolParserStream, TOOL_PARSER_NAMES};
pub use types::{DeltaMessage, DeltaToolCall, ExtractedToolCalls, Reasoning, Tool, ToolCall, UnknownParser};
