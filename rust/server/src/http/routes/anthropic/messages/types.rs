//! Anthropic's Messages API as vLLM 0.33 models it (`vllm/entrypoints/anthropic/protocol.py`),
//! with the fields of Anthropic's API that vLLM leaves out declared too, so
//! that each one is honoured or refused by name (`validate.rs`) instead of
//! being dropped unseen.

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// A `/v1/messages` body as sent (vLLM's `AnthropicMessagesRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MessagesBody {
    /// The model asked for (required).
    pub model: Option<String>,
    /// The conversation (required).
    pub messages: Option<Vec<MessageIn>>,
    /// The token limit (required, positive).
    pub max_tokens: Option<i64>,
    /// The system prompt: a string or text blocks.
    pub system: Option<TextOrBlocks>,
    /// Strings that end the answer.
    pub stop_sequences: Option<Vec<String>>,
    /// Stream the answer as Anthropic's events.
    pub stream: Option<bool>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus mass.
    pub top_p: Option<f64>,
    /// Top-k cut-off.
    pub top_k: Option<i64>,
    /// About the request's end user (`user_id`); accepted, never sent to an engine.
    pub metadata: Option<Map<String, Value>>,
    /// Tools the model may call.
    pub tools: Option<Vec<ToolIn>>,
    /// `auto`, `any`, `tool` (with `name`) or `none`.
    pub tool_choice: Option<ToolChoiceIn>,
    /// Extended thinking: `enabled` (with `budget_tokens`), `disabled`.
    pub thinking: Option<ThinkingIn>,
    /// vLLM's: `effort` and a JSON-schema `format`.
    pub output_config: Option<OutputConfigIn>,
    /// vLLM's: variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM's: KV transfer for disaggregated serving (refused).
    pub kv_transfer_params: Option<IgnoredAny>,
    /// Anthropic's: `auto` or `standard_only` (one tier here, so both are served alike).
    pub service_tier: Option<String>,
    /// Anthropic's code-execution container (refused).
    pub container: Option<IgnoredAny>,
    /// Anthropic's MCP servers (refused).
    pub mcp_servers: Option<IgnoredAny>,
    /// Anthropic's context editing (refused).
    pub context_management: Option<IgnoredAny>,
    /// Anthropic's request-wide prompt-caching marker: accepted, since prefix caching needs no marker here.
    pub cache_control: Option<IgnoredAny>,
    /// Anthropic's data-residency choice (refused: nothing here chooses where it runs).
    pub inference_geo: Option<IgnoredAny>,
    /// Anthropic's output speed mode (refused).
    pub speed: Option<IgnoredAny>,
    /// Anthropic's diagnostics (refused).
    pub diagnostics: Option<IgnoredAny>,
    /// Anthropic's end-user profile (refused: no profiles here).
    pub user_profile_id: Option<IgnoredAny>,
    /// Anthropic's workspace (refused: no workspaces here).
    pub workspace_id: Option<IgnoredAny>,
}

/// A `/v1/messages/count_tokens` body as sent (vLLM's `AnthropicCountTokensRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CountTokensBody {
    /// The model asked for (required).
    pub model: Option<String>,
    /// The conversation (required).
    pub messages: Option<Vec<MessageIn>>,
    /// The system prompt.
    pub system: Option<TextOrBlocks>,
    /// Tools, as the template gets them.
    pub tools: Option<Vec<ToolIn>>,
    /// The tool choice.
    pub tool_choice: Option<ToolChoiceIn>,
    /// Extended thinking (changes the template's `enable_thinking`).
    pub thinking: Option<ThinkingIn>,
    /// vLLM's: variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// One message as sent.
#[derive(Debug, Deserialize)]
pub struct MessageIn {
    /// `user` or `assistant` (`system` as vLLM takes it; `ctx` and `msg` read as `user`, as in vLLM).
    pub role: String,
    /// A string or content blocks.
    pub content: TextOrBlocks,
}

/// A message's content, the system prompt, a tool result's content: a string or blocks.
#[derive(Debug)]
pub enum TextOrBlocks {
    /// Text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<BlockIn>),
}

/// Read by hand rather than as an untagged enum, so that an error inside a
/// block keeps its path (`messages.0.content.1.text`), not just `content`.
impl<'de> Deserialize<'de> for TextOrBlocks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextOrBlocksVisitor;
        impl<'de> Visitor<'de> for TextOrBlocksVisitor {
            type Value = TextOrBlocks;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of content blocks")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<TextOrBlocks, E> {
                Ok(TextOrBlocks::Text(text.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextOrBlocks, A::Error> {
                let mut blocks = Vec::new();
                while let Some(block) = seq.next_element()? {
                    blocks.push(block);
                }
                Ok(TextOrBlocks::Blocks(blocks))
            }
        }
        deserializer.deserialize_any(TextOrBlocksVisitor)
    }
}

/// One content block, with the fields of every kind (vLLM's `AnthropicContentBlock`);
/// `validate.rs` checks that a block has what its `type` needs.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct BlockIn {
    /// The block's kind (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `text` blocks.
    pub text: Option<String>,
    /// `tool_use`: the call's id.
    pub id: Option<String>,
    /// `tool_use`: the tool's name.
    pub name: Option<String>,
    /// `tool_use`: the arguments.
    pub input: Option<Map<String, Value>>,
    /// `tool_result`: the call it answers.
    pub tool_use_id: Option<String>,
    /// `tool_result`: a string or text blocks.
    pub content: Option<TextOrBlocks>,
    /// `tool_result`: whether the tool failed (the template sees the content either way).
    pub is_error: Option<bool>,
    /// `thinking`: the reasoning text.
    pub thinking: Option<String>,
    /// `thinking`: its signature (not checked: nothing here signs thinking).
    pub signature: Option<String>,
    /// `redacted_thinking`: opaque data, skipped as vLLM skips it.
    pub data: Option<String>,
    /// Prompt-caching marker: accepted, since prefix caching needs no marker here.
    pub cache_control: Option<IgnoredAny>,
    /// Citations of a text block an assistant wrote: accepted and not templated.
    pub citations: Option<IgnoredAny>,
    /// An image's source (refused: no multimodal input).
    pub source: Option<IgnoredAny>,
}

/// One tool as sent (vLLM's `AnthropicTool`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolIn {
    /// `custom` or absent; Anthropic's server tools (`bash_...`, `web_search_...`) are refused.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tool's name (required).
    pub name: Option<String>,
    /// What it does.
    pub description: Option<String>,
    /// Its arguments' JSON schema (required; `type` defaults to `object`, as in vLLM).
    pub input_schema: Option<Map<String, Value>>,
    /// Prompt-caching marker: accepted.
    pub cache_control: Option<IgnoredAny>,
    /// Strict schema adherence (refused when true: calls are parsed, not constrained, under `auto`).
    pub strict: Option<bool>,
}

/// `tool_choice` as sent (vLLM's `AnthropicToolChoice`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolChoiceIn {
    /// `auto`, `any`, `tool` or `none` (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tool of `tool`.
    pub name: Option<String>,
    /// At most one call (chat's `parallel_tool_calls: false`).
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking` as sent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ThinkingIn {
    /// `enabled`, `disabled` or `adaptive` (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Tokens the thinking may take (with `enabled`: at least 1024 and below `max_tokens`, as Anthropic checks).
    pub budget_tokens: Option<i64>,
}

/// vLLM's `output_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct OutputConfigIn {
    /// The reasoning effort (chat's `reasoning_effort`).
    pub effort: Option<String>,
    /// `{"type": "json_schema", "schema": {...}}`.
    pub format: Option<Map<String, Value>>,
}

/// An answer (vLLM's `AnthropicMessagesResponse`).
#[derive(Debug, Serialize, PartialEq)]
pub struct MessagesResponse {
    /// The request's id (the chat id, as vLLM gives it).
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The blocks: thinking, then text, then tool calls.
    pub content: Vec<Value>,
    /// The served model name.
    pub model: String,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended the answer.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessagesUsage,
}

/// Token counts of an answer.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct MessagesUsage {
    /// Prompt tokens, less those read from the prefix cache (Anthropic counts those apart).
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the prefix cache, when the server reports them
    /// (`enable_prompt_tokens_details`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

impl MessagesUsage {
    /// The counts of a chat `usage` object, as vLLM 0.33 builds them (`_build_anthropic_usage`).
    pub fn of(usage: &serde_json::Value) -> Self {
        let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
        MessagesUsage {
            input_tokens: prompt.saturating_sub(cached.unwrap_or(0)),
            output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
            cache_read_input_tokens: cached,
        }
    }
}

/// `/v1/messages/count_tokens`'s answer (vLLM's `AnthropicCountTokensResponse`).
#[derive(Debug, Serialize)]
pub struct CountTokensResponse {
    /// The prompt's tokens.
    pub input_tokens: usize,
    /// As vLLM writes it: the same count.
    pub context_management: ContextManagement,
}

/// `context_management` of a count.
#[derive(Debug, Serialize)]
pub struct ContextManagement {
    /// The prompt's tokens before any context editing (none here).
    pub original_input_tokens: usize,
}
