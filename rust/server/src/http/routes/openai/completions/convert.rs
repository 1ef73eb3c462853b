//! A completion request to the engine's prompt, and the engine's output to
//! the OpenAI completion: the whole choice and the streamed chunks.

use super::types::{ChunkChoice, Prompt};
use crate::http::error::ApiError;
use crate::http::generation::answer::{ChoiceBody, Fields};
use crate::http::generation::sse::{ChunkHeader, ChunkWriter};
use crate::http::generation::submit::stop_reason_json;
use crate::http::generation::usage::UsageInfo;
use crate::http::state::AppState;
use axum::body::Bytes;
use serde_json::Value;
use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use vllm_rs_generate::logprobs::render::CompletionPieces;
use vllm_rs_generate::logprobs::Rendering;
use vllm_rs_generate::{Delta, Whole};

/// The prompt's text (when it came as text) and token ids.
pub fn prompt_token_ids(state: &AppState, prompt: Prompt) -> Result<(Option<String>, Vec<u32>), ApiError> {
    Ok(match prompt {
        Prompt::Text(text) => {
            let ids = state
                .tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}")))?;
            (Some(text), ids)
        }
        Prompt::TokenIds(ids) => (None, ids),
    })
}

/// The fields of a whole completion choice: text and logprobs, then (after
/// `token_ids`) prompt logprobs and prompt token ids, null when not asked for.
pub(super) fn completion_choice(
    whole: Whole,
    rendering: Option<Arc<Rendering>>,
    prompt_token_ids: Option<&[u32]>,
) -> ChoiceBody {
    let mut fields = Fields::default();
    let mut tail = Fields::default();
    match rendering {
        None => {
            fields.put("text", &whole.text);
            fields.put("logprobs", &());
            tail.put("prompt_logprobs", &());
        }
        Some(rendering) => {
            let (text, logprobs) = CompletionPieces::new(rendering.clone()).piece(&whole.text, whole.scored.as_deref());
            fields.put("text", &text);
            fields.put_raw("logprobs", logprobs);
            let positions = whole.scored.as_deref().and_then(|s| s.prompt_logprobs.as_deref());
            tail.put_raw(
                "prompt_logprobs",
                rendering.prompt_logprobs.then(|| rendering.prompt_logprobs_json(positions)),
            );
        }
    }
    tail.put("prompt_token_ids", &prompt_token_ids);
    ChoiceBody { fields, tail, response_prompt_logprobs: None }
}

/// The chunks of one choice of a streamed completion.
pub(super) struct CompletionChunks {
    pub(super) header: ChunkHeader,
    /// The choice's index (streams of n > 1 choices interleave them).
    pub(super) index: u32,
    /// Echo and logprobs, when the request asked for either.
    pub(super) pieces: Option<CompletionPieces>,
    /// The prompt's token ids until the first chunk took them (`return_token_ids`).
    pub(super) prompt_token_ids: Mutex<Option<Arc<[u32]>>>,
}

impl ChunkWriter for CompletionChunks {
    fn opening(&self, _usage: Option<UsageInfo>) -> Option<Bytes> {
        None
    }

    fn delta(&self, delta: &Delta, usage: Option<UsageInfo>) -> Bytes {
        let (text, logprobs) = match &self.pieces {
            Some(pieces) => pieces.piece(&delta.text, delta.scored.as_deref()),
            None => (Cow::Borrowed(delta.text.as_str()), None),
        };
        let prompt_token_ids = self.prompt_token_ids.lock().unwrap_or_else(|e| e.into_inner()).take();
        let choice = ChunkChoice {
            index: self.index,
            text,
            logprobs,
            finish_reason: delta.finish.as_ref().map(|f| f.reason.as_str()),
            stop_reason: delta.finish.as_ref().map(|f| stop_reason_json(&f.stop_reason)).unwrap_or(Value::Null),
            prompt_token_ids: prompt_token_ids.as_deref(),
            token_ids: delta.token_ids.as_deref(),
        };
        self.header.event(&[choice], usage)
    }

    fn usage(&self, usage: UsageInfo) -> Bytes {
        self.header.event::<ChunkChoice>(&[], Some(usage))
    }
}
