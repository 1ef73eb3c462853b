//! The chunks of a streamed chat answer, as vLLM's frontend streams them:
//! every choice's opening chunks (the role, the echoed message) and the
//! writer of plain text choices (`tools` has the one that parses tool calls
//! and reasoning).

use crate::http::generation::sse::{ChunkHeader, ChunkWriter};
use crate::http::generation::submit::stop_reason_json;
use crate::http::generation::usage::UsageInfo;
use axum::body::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;
use vllm_rs_generate::logprobs::Rendering;
use vllm_rs_generate::Delta;

/// vLLM's `ChatCompletionResponseStreamChoice` as it streams it.
#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: ChunkDelta<'a>,
    logprobs: Option<Box<RawValue>>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Value>,
    /// Set on every chunk after the opening ones, null unless asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Option<&'a [u32]>>,
}

#[derive(Serialize)]
struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    /// Left out of a chunk that only carries logprobs (vLLM's empty `DeltaMessage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// The first chunks of every choice of a streamed chat answer, as vLLM sends
/// them: the role (with the prompt's token ids when asked for), then the
/// echoed last message (`echo`).
pub struct ChatOpening {
    /// The role of the answer.
    pub role: String,
    /// The echoed text, when there is some.
    pub echo: Option<String>,
    /// The prompt's token ids (`return_token_ids`).
    pub prompt_token_ids: Option<Arc<[u32]>>,
}

impl ChatOpening {
    /// The opening chunks of choice `index`; `usage` (prompt only) when
    /// every chunk carries usage.
    pub fn chunks(&self, header: &ChunkHeader, index: u32, usage: Option<UsageInfo>) -> Bytes {
        let opening = |delta| ChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
            token_ids: None,
        };
        let role = opening(ChunkDelta { role: Some(&self.role), content: Some("") });
        let first = header.event_with_prompt(&[role], usage, self.prompt_token_ids.as_deref());
        let Some(echo) = &self.echo else { return first };
        let mut both = first.to_vec();
        both.extend_from_slice(&header.event(&[opening(ChunkDelta { role: None, content: Some(echo) })], usage));
        Bytes::from(both)
    }
}

/// The chunks of one choice of a streamed chat answer.
pub struct ChatChunks {
    /// The stream's chunk header.
    pub header: ChunkHeader,
    /// The first chunks.
    pub opening: Arc<ChatOpening>,
    /// The choice's index (streams of n > 1 choices interleave them).
    pub index: u32,
    /// How logprobs are shown, when the request asked for them.
    pub rendering: Option<Arc<Rendering>>,
}

impl ChunkWriter for ChatChunks {
    fn opening(&self, usage: Option<UsageInfo>) -> Option<Bytes> {
        Some(self.opening.chunks(&self.header, self.index, usage))
    }

    fn delta(&self, delta: &Delta, usage: Option<UsageInfo>) -> Bytes {
        let choice = ChunkChoice {
            index: self.index,
            // The finish comes alone, with an empty delta (as vLLM's frontend sends it).
            delta: ChunkDelta { role: None, content: (!delta.text.is_empty()).then_some(delta.text.as_str()) },
            logprobs: self.rendering.as_ref().and_then(|r| r.chat_logprobs(delta.scored.as_deref())),
            finish_reason: delta.finish.as_ref().map(|f| f.reason.as_str()),
            stop_reason: delta.finish.as_ref().map(|f| stop_reason_json(&f.stop_reason)),
            token_ids: Some(delta.token_ids.as_deref()),
        };
        self.header.event(&[choice], usage)
    }

    fn usage(&self, usage: UsageInfo) -> Bytes {
        self.header.event::<ChunkChoice>(&[], Some(usage))
    }
}
