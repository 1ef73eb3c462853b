//! Reads and checks every parameter of a `/v1/completions` body: the 400s.

use super::types::{CompletionBody, CompletionRequest, Prompt, PromptInput};
use crate::http::body::parse_body;
use crate::http::error::ApiError;
use crate::http::generation::structured::{read_structured_outputs, wire_params};
use crate::http::rules::RULES;

/// Reads every parameter of a completion body, or a 4xx naming the first bad
/// one. Needs neither the model nor the tokenizer, so it never fails otherwise.
pub fn parse_completion_request(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    parse_body::<CompletionBody>(body)?.validate()
}

impl CompletionBody {
    /// Checks every parameter by the rule table, or a 4xx naming the first bad one.
    pub fn validate(mut self) -> Result<CompletionRequest, ApiError> {
        let mut sampling = std::mem::take(&mut self.sampling);
        let input = self;
        if let Some(logprobs) = input.route.logprobs {
            RULES.check_int("logprobs", logprobs)?;
        }
        let echo = input.route.echo == Some(true);
        // vLLM's `echo_without_generation`: the engine is asked for one token;
        // without echo, 0 stays a 400 (max_tokens must be at least 1).
        let prompt_only = echo && sampling.max_tokens == Some(0);
        if prompt_only {
            sampling.max_tokens = Some(1);
        }
        let max_tokens = sampling.max_tokens.map(|n| ("max_tokens", n));
        let mut common = sampling.check(max_tokens)?;
        common.sampling.logprobs = input.route.logprobs;
        if echo && common.sampling.prompt_logprobs.is_none() {
            // vLLM scores an echoed prompt as it scores the completion.
            common.sampling.prompt_logprobs = input.route.logprobs;
        }
        common.sampling.structured_outputs =
            read_structured_outputs(input.route.structured_outputs.as_ref(), input.route.response_format.as_ref())?
                .map(|fields| wire_params(&fields));
        if input.route.suffix.is_some() {
            return Err(RULES.refuse("suffix", "suffix_unsupported", &[]));
        }
        if input.route.prompt_embeds.is_some() {
            return Err(ApiError::invalid_param(
                "prompt_embeds",
                "prompt_embeds is not supported: this server takes text or token id prompts only",
            ));
        }
        let prompt = match input.route.prompt {
            None => return Err(RULES.refuse("prompt", "prompt_missing", &[])),
            Some(PromptInput::Text(text)) if text.is_empty() => {
                return Err(RULES.refuse("prompt", "prompt_missing", &[]))
            }
            Some(PromptInput::Text(text)) => Prompt::Text(text),
            Some(PromptInput::TokenIds(ids)) => Prompt::TokenIds(ids),
            Some(PromptInput::Texts(mut texts)) if texts.len() == 1 => Prompt::Text(texts.remove(0)),
            Some(PromptInput::TokenIdLists(mut lists)) if lists.len() == 1 => Prompt::TokenIds(lists.remove(0)),
            Some(PromptInput::Texts(_) | PromptInput::TokenIdLists(_)) => {
                return Err(RULES.refuse("prompt", "one_prompt_only", &[]))
            }
        };
        Ok(CompletionRequest { common, prompt, echo, prompt_only })
    }
}
