//! The token usage of an answer, as vLLM's frontend writes it (its
//! `UsageInfo`), on whole answers and streamed chunks alike.

use serde::Serialize;
use vllm_rs_generate::Usage;

/// vLLM's `PromptTokenUsageInfo`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens the engine found in its prefix cache.
    pub cached_tokens: Option<usize>,
}

/// vLLM's `UsageInfo` as its frontend sends it: the details are always
/// there. `prompt_tokens_details` is `{"cached_tokens": N}` on a whole
/// answer and on a stream's last usage chunk when the server has
/// `enable_prompt_tokens_details`, null otherwise (and on the running usage
/// of every chunk); `completion_tokens_details` is `{"reasoning_tokens": N}`,
/// N the tokens the reasoning parser classified as reasoning (0 without
/// one).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct UsageInfo {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt and completion tokens.
    pub total_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Details of the prompt tokens.
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Details of the generated tokens (`{"reasoning_tokens": N}`).
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// vLLM's `CompletionTokenUsageInfo`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CompletionTokensDetails {
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: usize,
}

impl UsageInfo {
    /// `usage` as vLLM's frontend shows it, with `prompt_tokens_details`
    /// when `prompt_details` (the server reports them, and this is a whole
    /// answer or a stream's last usage chunk).
    pub fn of(usage: Usage, prompt_details: bool) -> Self {
        UsageInfo {
            prompt_tokens: usage.prompt_tokens,
            total_tokens: usage.total_tokens,
            completion_tokens: usage.completion_tokens,
            prompt_tokens_details: prompt_details
                .then_some(PromptTokensDetails { cached_tokens: Some(usage.cached_tokens) }),
            completion_tokens_details: Some(CompletionTokensDetails { reasoning_tokens: usage.reasoning_tokens }),
        }
    }
}
