//! The `/v1/completions` request as sent and read, and its streamed choice.

use crate::http::sampling::{CommonParams, SamplingRequest};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// The prompt of a completion request, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with the model's special tokens.
    Text(String),
    /// Token ids, sent as they are.
    TokenIds(Vec<u32>),
}

/// `prompt` as sent: text, token ids, or a list of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// One prompt of token ids.
    TokenIds(Vec<u32>),
    /// Text prompts (one is served).
    Texts(Vec<String>),
    /// Token id prompts (one is served).
    TokenIdLists(Vec<Vec<u32>>),
}

/// A `/v1/completions` body as sent: the shared sampling fields and [`CompletionFields`].
pub type CompletionBody = SamplingRequest<CompletionFields>;

/// The fields of a `/v1/completions` body its own, as sent (the sampling fields aside).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CompletionFields {
    /// The prompt.
    pub prompt: Option<PromptInput>,
    /// Show the prompt before the completion.
    pub echo: Option<bool>,
    /// Refused: vLLM has no suffix support either.
    pub suffix: Option<String>,
    /// Top logprobs per generated token (-1: the whole vocabulary).
    pub logprobs: Option<i64>,
    /// Refused: this frontend serves no prompt embeddings (vLLM without `--enable-prompt-embeds`).
    pub prompt_embeds: Option<IgnoredAny>,
    /// `json_object` / `json_schema`: a structured-outputs constraint.
    pub response_format: Option<Map<String, Value>>,
    /// vLLM's structured-outputs constraint.
    pub structured_outputs: Option<Map<String, Value>>,
}

/// A completion request whose parameters are all read and checked.
#[derive(Debug)]
pub struct CompletionRequest {
    /// The parameters shared with chat.
    pub common: CommonParams,
    /// The prompt.
    pub prompt: Prompt,
    /// Show the prompt before the completion.
    pub echo: bool,
    /// Show the prompt alone: `echo` with `max_tokens` 0, which vLLM serves
    /// by generating one token and leaving it out of the text and logprobs.
    pub prompt_only: bool,
}

/// vLLM's `CompletionResponseStreamChoice` as it streams it (the fields it
/// sets, nulls included).
#[derive(Serialize)]
pub(super) struct ChunkChoice<'a> {
    pub(super) index: u32,
    pub(super) text: Cow<'a, str>,
    pub(super) logprobs: Option<Box<RawValue>>,
    pub(super) finish_reason: Option<&'static str>,
    pub(super) stop_reason: Value,
    /// The prompt's token ids, on the choice's first chunk, when asked for.
    pub(super) prompt_token_ids: Option<&'a [u32]>,
    /// The chunk's token ids, when asked for.
    pub(super) token_ids: Option<&'a [u32]>,
}
