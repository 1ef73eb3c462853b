//! A pooling request's inputs made token ids and checked before anything
//! reaches an engine, each refusal a 400 naming the parameter at fault, in
//! vLLM's words where vLLM has them.

use super::types::{PoolInput, TextOrTexts};
use crate::http::error::ApiError;
use crate::http::generation::template_kwargs::read_template_kwargs;
use crate::http::routes::openai::chat_completions::types::MessageInput;
use crate::http::routes::openai::chat_completions::validate::messages;
use crate::http::state::AppState;
use serde_json::{Map, Value};

/// What the inputs are for, as vLLM's length error names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `/v1/embeddings`, `/pooling`.
    Embedding,
    /// `/classify`.
    Classification,
    /// `/score`, `/rerank`.
    Score,
}

impl Purpose {
    fn words(self) -> &'static str {
        match self {
            Purpose::Embedding => "embedding generation",
            Purpose::Classification => "classification",
            Purpose::Score => "score",
        }
    }
}

/// The token ids of `input`: texts tokenized (`add_special_tokens`, vLLM's
/// default true), token ids checked against the vocabulary. An empty list
/// is refused.
pub fn input_prompts(state: &AppState, input: PoolInput, add_special_tokens: bool) -> Result<Vec<Vec<u32>>, ApiError> {
    let vocab_size = state.tokenizer.vocab_size() as i64;
    let ids = |tokens: Vec<i64>| -> Result<Vec<u32>, ApiError> {
        match tokens.iter().find(|&&t| t < 0 || t >= vocab_size) {
            Some(bad) => Err(ApiError::invalid_param(
                "input",
                format!("token id {bad} is out of vocabulary (vocab size {vocab_size})"),
            )),
            None => Ok(tokens.into_iter().map(|t| t as u32).collect()),
        }
    };
    let prompts = match input {
        PoolInput::Text(text) => vec![encode(state, &text, add_special_tokens, "input")?],
        PoolInput::Texts(texts) => {
            texts.iter().map(|t| encode(state, t, add_special_tokens, "input")).collect::<Result<_, _>>()?
        }
        PoolInput::Tokens(tokens) => vec![ids(tokens)?],
        PoolInput::TokenLists(lists) => lists.into_iter().map(ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid_param("input", "Input cannot be empty"));
    }
    Ok(prompts)
}

/// The token ids of one conversation rendered with the chat template
/// (vLLM's chat form of `/v1/embeddings`).
pub fn chat_prompt(
    state: &AppState,
    items: Vec<MessageInput>,
    add_generation_prompt: bool,
    template_kwargs: Option<&Map<String, Value>>,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    let messages = messages(Some(items))?;
    let kwargs = read_template_kwargs(template_kwargs, &state.config.chat.default_template_kwargs)?;
    let text = state
        .tokenizer
        .apply_chat_template_with_tools(&messages, add_generation_prompt, None, &kwargs)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}")))?;
    encode(state, &text, add_special_tokens, "messages")
}

/// One text or several, as a list (refused when empty).
pub fn texts(value: Option<TextOrTexts>, param: &str) -> Result<Vec<String>, ApiError> {
    let texts = match value {
        None => return Err(ApiError::invalid_param(param, format!("`{param}` is required"))),
        Some(TextOrTexts::One(text)) => vec![text],
        Some(TextOrTexts::Many(texts)) => texts,
    };
    if texts.is_empty() {
        return Err(ApiError::invalid_param(param, format!("`{param}` must not be empty")));
    }
    Ok(texts)
}

/// `text`'s token ids, or a 400 naming `param`.
pub fn encode(state: &AppState, text: &str, add_special_tokens: bool, param: &str) -> Result<Vec<u32>, ApiError> {
    state
        .tokenizer
        .encode(text, add_special_tokens)
        .map_err(|e| ApiError::invalid_param(param, format!("cannot tokenize the {param}: {e}")))
}

/// Which end of a prompt truncation drops (vLLM's `truncation_side`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Keep the first tokens (vLLM's default, `right`).
    End,
    /// Keep the last tokens (`left`: Cohere's `truncate: START`).
    Start,
}

/// Cuts each prompt to `truncate_prompt_tokens` tokens (-1: the model
/// length) at the `cut` end, then refuses an empty prompt or one longer
/// than the model.
pub fn fit_prompts(
    state: &AppState,
    prompts: &mut [Vec<u32>],
    (truncate_prompt_tokens, cut): (Option<i64>, Cut),
    purpose: Purpose,
) -> Result<(), ApiError> {
    let keep = match (truncate_prompt_tokens, state.max_model_len) {
        (None, _) => None,
        (Some(-1), max_len) => max_len,
        (Some(k), Some(max_len)) if k > 0 && k as u64 > max_len => {
            return Err(ApiError::invalid_param(
                "truncate_prompt_tokens",
                format!("truncate_prompt_tokens={k} cannot be greater than max_model_len = {max_len}. Please request a smaller truncation size."),
            ))
        }
        (Some(k), _) if k >= 1 => Some(k as u64),
        (Some(k), _) => {
            return Err(ApiError::invalid_param(
                "truncate_prompt_tokens",
                format!("truncate_prompt_tokens must be -1 or at least 1, got {k}"),
            ))
        }
    };
    for (index, prompt) in prompts.iter_mut().enumerate() {
        if let Some(keep) = keep {
            let keep = usize::try_from(keep).unwrap_or(usize::MAX);
            match cut {
                Cut::End => prompt.truncate(keep),
                Cut::Start => drop(prompt.drain(..prompt.len().saturating_sub(keep))),
            }
        }
        if prompt.is_empty() {
            return Err(ApiError::invalid_param("input", format!("The prompt (input {index}) is empty")));
        }
        if let Some(max_len) = state.max_model_len {
            let len = prompt.len() as u64;
            if len > max_len {
                return Err(ApiError::invalid_param(
                    "input",
                    format!(
                        "This model's maximum context length is {max_len} tokens. However, you requested {len} tokens in the input for {}. Please reduce the length of the input.",
                        purpose.words()
                    ),
                ));
            }
        }
    }
    Ok(())
}
