//! The `/v1/responses` request as sent and as read and checked, and the
//! response objects, items and streamed events answered, in vLLM's key order.

use crate::http::sampling::{SamplingFields, SamplingRequest};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use vllm_rs_chat::ChatMessage;

/// A `/v1/responses` body as sent: the shared sampling fields and [`ResponsesFields`].
pub type ResponsesBody = SamplingRequest<ResponsesFields>;

/// The fields of a `/v1/responses` body its own, as sent (the sampling fields aside).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ResponsesFields {
    /// Text, or a list of input items.
    pub input: Option<Value>,
    /// The system message.
    pub instructions: Option<String>,
    /// The token limit.
    pub max_output_tokens: Option<i64>,
    /// Refused when not empty.
    pub tools: Option<Vec<IgnoredAny>>,
    /// Only `auto` or `none` (there are no tools).
    pub tool_choice: Option<Value>,
    /// Refused: there is no response store.
    pub background: Option<bool>,
    /// Read with `background`.
    pub store: Option<bool>,
    /// Not found: there is no response store.
    pub previous_response_id: Option<String>,
    /// Refused when it names anything.
    pub include: Option<Vec<String>>,
    /// Only the `text` format.
    pub text: Option<TextConfig>,
    /// `disabled`, or refused `auto`.
    pub truncation: Option<String>,
    /// Repeated in the response object.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Repeated in the response object.
    pub user: Option<String>,
    /// Repeated in the response object.
    pub parallel_tool_calls: Option<bool>,
    /// Repeated in the response object.
    pub max_tool_calls: Option<i64>,
    /// Repeated in the response object.
    pub service_tier: Option<String>,
    /// Repeated in the response object.
    pub prompt_cache_key: Option<String>,
    /// Repeated in the response object.
    pub safety_identifier: Option<String>,
    /// Refused when true.
    pub enable_response_messages: Option<bool>,
    /// Checked and repeated; its `effort` reaches the template.
    pub reasoning: Option<Value>,
    /// Variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Refused when present and non-null (see `unsupported`).
    pub prompt: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub previous_input_messages: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub structured_outputs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub kv_transfer_params: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub vllm_xargs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub mm_processor_kwargs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub media_io_kwargs: Option<IgnoredAny>,
}

/// `text`: only its format matters.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TextConfig {
    pub(super) format: Option<TextFormat>,
}

/// `text.format`: only its type matters.
#[derive(Debug, Deserialize)]
pub(super) struct TextFormat {
    #[serde(rename = "type")]
    pub(super) kind: String,
}

/// A responses request whose parameters are all read and checked.
pub(super) struct ResponsesRequest {
    pub(super) sampling: SamplingFields,
    pub(super) input: ResponsesBody,
    pub(super) messages: Vec<ChatMessage>,
    /// `reasoning` as the response object repeats it (null when not given).
    pub(super) reasoning: Option<ReasoningEcho>,
    /// The requested `reasoning.effort`, before the server's map.
    pub(super) reasoning_effort: Option<String>,
    /// The template kwargs: the server's defaults, the request's own, its effort.
    pub(super) template_kwargs: Map<String, Value>,
}

/// `reasoning` as vLLM's response object repeats it: every field of
/// OpenAI's `Reasoning`, null when not given, in vLLM's order.
#[derive(Debug, Default, PartialEq, Serialize)]
pub(super) struct ReasoningEcho {
    pub(super) context: Option<String>,
    pub(super) effort: Option<String>,
    pub(super) generate_summary: Option<String>,
    pub(super) mode: Option<String>,
    pub(super) summary: Option<String>,
}

/// The request fields a response object repeats, with vLLM's defaults.
pub(super) struct Echo {
    pub(super) instructions: Option<String>,
    pub(super) metadata: Option<BTreeMap<String, String>>,
    pub(super) temperature: f64,
    pub(super) top_p: f64,
    pub(super) presence_penalty: f64,
    pub(super) frequency_penalty: f64,
    pub(super) parallel_tool_calls: bool,
    pub(super) max_tool_calls: Option<i64>,
    pub(super) service_tier: String,
    pub(super) truncation: String,
    pub(super) user: Option<String>,
    pub(super) prompt_cache_key: Option<String>,
    pub(super) safety_identifier: Option<String>,
    /// `text`, repeated as `{"format": {"type": "text"}}` when it had a format.
    pub(super) text: Option<TextEcho>,
    pub(super) reasoning: Option<ReasoningEcho>,
}

/// `text` as a response object repeats it.
#[derive(Serialize)]
pub(super) struct TextEcho {
    pub(super) format: OutputType,
}

/// An object that is only its `type`.
#[derive(Serialize)]
pub(super) struct OutputType {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
}

/// What every response object of one request shares.
pub(super) struct Answer {
    pub(super) echo: Echo,
    pub(super) max_tokens: Option<u64>,
    pub(super) id: String,
    pub(super) created_at: u64,
    pub(super) model: String,
}

/// vLLM's `ResponsesResponse` as it writes it: the fields it sets, in its
/// order; `()` is a field vLLM always writes as null here.
#[derive(Serialize)]
pub(super) struct ResponseObject<'a> {
    pub(super) id: &'a str,
    pub(super) created_at: u64,
    pub(super) incomplete_details: Option<IncompleteDetails>,
    pub(super) instructions: Option<&'a str>,
    pub(super) metadata: Option<&'a BTreeMap<String, String>>,
    pub(super) model: &'a str,
    pub(super) object: &'static str,
    pub(super) output: Vec<MessageItem>,
    pub(super) parallel_tool_calls: bool,
    pub(super) temperature: f64,
    pub(super) tool_choice: &'static str,
    pub(super) tools: [(); 0],
    pub(super) top_p: f64,
    pub(super) background: bool,
    pub(super) max_output_tokens: Option<u64>,
    pub(super) max_tool_calls: Option<i64>,
    pub(super) previous_response_id: (),
    pub(super) prompt: (),
    pub(super) prompt_cache_options: (),
    pub(super) prompt_cache_key: Option<&'a str>,
    pub(super) prompt_cache_retention: (),
    pub(super) reasoning: Option<&'a ReasoningEcho>,
    pub(super) safety_identifier: Option<&'a str>,
    pub(super) service_tier: &'a str,
    pub(super) status: &'static str,
    pub(super) text: Option<&'a TextEcho>,
    pub(super) top_logprobs: (),
    pub(super) truncation: &'a str,
    pub(super) usage: Option<ResponseUsage>,
    pub(super) user: Option<&'a str>,
    pub(super) presence_penalty: f64,
    pub(super) frequency_penalty: f64,
    pub(super) kv_transfer_params: (),
    pub(super) ec_transfer_params: (),
    pub(super) input_messages: (),
    pub(super) output_messages: (),
}

/// Why a response is incomplete (only its token limit here).
#[derive(Serialize)]
pub(super) struct IncompleteDetails {
    pub(super) reason: &'static str,
}

/// An `output_text` content part.
#[derive(Clone, Serialize)]
pub(super) struct TextPart {
    pub(super) annotations: [(); 0],
    pub(super) text: String,
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    /// `[]` while streaming, null in the finished part.
    pub(super) logprobs: Option<[(); 0]>,
}

impl TextPart {
    pub(super) fn new(text: &str, logprobs: Option<[(); 0]>) -> Self {
        TextPart { annotations: [], text: text.to_owned(), kind: "output_text", logprobs }
    }
}

/// The assistant message item.
#[derive(Clone, Serialize)]
pub(super) struct MessageItem {
    pub(super) id: String,
    pub(super) content: Vec<TextPart>,
    pub(super) role: &'static str,
    pub(super) status: &'static str,
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) phase: (),
}

/// The usage object: one turn, nothing cached, no reasoning or tool tokens.
#[derive(Serialize)]
pub(super) struct ResponseUsage {
    pub(super) input_tokens: usize,
    pub(super) input_tokens_details: InputTokensDetails,
    pub(super) output_tokens: usize,
    pub(super) output_tokens_details: OutputTokensDetails,
    pub(super) total_tokens: usize,
}

#[derive(Serialize)]
pub(super) struct InputTokensDetails {
    pub(super) cached_tokens: usize,
    pub(super) cache_write_tokens: usize,
    pub(super) input_tokens_per_turn: [usize; 1],
    pub(super) cached_tokens_per_turn: [usize; 1],
}

#[derive(Serialize)]
pub(super) struct OutputTokensDetails {
    pub(super) reasoning_tokens: usize,
    pub(super) tool_output_tokens: usize,
    pub(super) output_tokens_per_turn: [usize; 1],
    pub(super) tool_output_tokens_per_turn: [usize; 1],
}

/// One streamed event: its fields, then `type` and `sequence_number` (the
/// order vLLM writes them in).
#[derive(Serialize)]
pub(super) struct Event<'a, B> {
    #[serde(flatten)]
    pub(super) body: B,
    #[serde(rename = "type")]
    pub(super) kind: &'a str,
    pub(super) sequence_number: u64,
}

/// `response.output_item.added` / `.done`.
#[derive(Serialize)]
pub(super) struct ItemEvent<'a> {
    pub(super) item: &'a MessageItem,
    pub(super) output_index: u32,
}

/// `response.content_part.added` / `.done`.
#[derive(Serialize)]
pub(super) struct PartEvent<'a> {
    pub(super) content_index: u32,
    pub(super) item_id: &'a str,
    pub(super) output_index: u32,
    pub(super) part: TextPart,
}

/// `response.output_text.delta`.
#[derive(Serialize)]
pub(super) struct TextDeltaEvent<'a> {
    pub(super) content_index: u32,
    pub(super) delta: &'a str,
    pub(super) item_id: &'a str,
    pub(super) logprobs: [(); 0],
    pub(super) output_index: u32,
}

/// `response.output_text.done`.
#[derive(Serialize)]
pub(super) struct TextDoneEvent<'a> {
    pub(super) content_index: u32,
    pub(super) item_id: &'a str,
    pub(super) logprobs: [(); 0],
    pub(super) output_index: u32,
    pub(super) text: &'a str,
}

/// `response.created`, `.in_progress`, `.completed`, `.incomplete`.
#[derive(Serialize)]
pub(super) struct ResponseEvent<'a> {
    pub(super) response: &'a ResponseObject<'a>,
}

/// `error`: a generation that failed mid-stream.
#[derive(Serialize)]
pub(super) struct ErrorEvent<'a> {
    pub(super) code: String,
    pub(super) message: &'a str,
    pub(super) param: Option<&'a str>,
}
