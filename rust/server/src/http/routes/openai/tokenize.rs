//! `POST /tokenize` and `POST /detokenize`, as vLLM serves them: a prompt or
//! chat messages to token ids (with the count and the model length), and
//! token ids back to text.

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::submit::check_model;
use crate::http::generation::template_kwargs::read_template_kwargs;
use crate::http::routes::openai::chat_completions::types::MessageInput;
use crate::http::routes::openai::chat_completions::validate::messages;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A `/tokenize` body: vLLM's completion form (`prompt`) or chat form (`messages`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenizeInput {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<MessageInput>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    return_token_strs: Option<bool>,
    chat_template_kwargs: Option<Map<String, Value>>,
    tools: Option<Vec<IgnoredAny>>,
    chat_template: Option<IgnoredAny>,
    media_io_kwargs: Option<IgnoredAny>,
    mm_processor_kwargs: Option<IgnoredAny>,
}

/// Handles `POST /tokenize`.
pub async fn tokenize(State(state): State<SharedState>, JsonRequest(body): JsonRequest<TokenizeInput>) -> Response {
    match tokenize_body(&state, body) {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => error.into_response(),
    }
}

fn tokenize_body(state: &SharedState, input: TokenizeInput) -> Result<Tokenized, ApiError> {
    check_model(state, input.model.as_deref())?;
    let unsupported = [
        ("chat_template", input.chat_template.is_some()),
        ("media_io_kwargs", input.media_io_kwargs.is_some()),
        ("mm_processor_kwargs", input.mm_processor_kwargs.is_some()),
        ("tools", input.tools.is_some_and(|tools| !tools.is_empty())),
    ];
    if let Some((param, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(RULES.refuse(param, "field_unsupported", &[("param", param)]));
    }
    let tokens = match (input.prompt, input.messages) {
        // vLLM tries the completion form first: a prompt wins.
        (Some(prompt), _) => state
            .tokenizer
            .encode(&prompt, input.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}")))?,
        (None, Some(items)) => {
            let add_generation_prompt = input.add_generation_prompt.unwrap_or(true);
            if input.continue_final_message == Some(true) {
                let key = if add_generation_prompt {
                    "continue_with_generation_prompt"
                } else {
                    "continue_final_message_unsupported"
                };
                return Err(RULES.refuse("continue_final_message", key, &[]));
            }
            let messages = messages(Some(items))?;
            let kwargs =
                read_template_kwargs(input.chat_template_kwargs.as_ref(), &state.config.chat.default_template_kwargs)?;
            let text = state
                .tokenizer
                .apply_chat_template_with_tools(&messages, add_generation_prompt, None, &kwargs)
                .map_err(|e| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}")))?;
            state
                .tokenizer
                .encode(&text, input.add_special_tokens.unwrap_or(false))
                .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize the messages: {e}")))?
        }
        (None, None) => return Err(RULES.refuse("prompt", "tokenize_input_missing", &[])),
    };
    let token_strs = input.return_token_strs.unwrap_or(false).then(|| state.tokenizer.token_strings(&tokens));
    Ok(Tokenized { count: tokens.len(), max_model_len: state.max_model_len, tokens, token_strs })
}

/// `/tokenize`'s answer, as vLLM's `TokenizeResponse` writes it.
#[derive(Debug, Serialize)]
struct Tokenized {
    count: usize,
    max_model_len: Option<u64>,
    tokens: Vec<u32>,
    token_strs: Option<Vec<String>>,
}

/// `/detokenize`'s answer.
#[derive(Debug, Serialize)]
struct Detokenized {
    prompt: String,
}

/// A `/detokenize` body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeInput {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    tokens: Option<Vec<i64>>,
}

/// Handles `POST /detokenize`: the text of `tokens`, special tokens kept.
pub async fn detokenize(State(state): State<SharedState>, JsonRequest(body): JsonRequest<DetokenizeInput>) -> Response {
    match detokenize_body(&state, body) {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => error.into_response(),
    }
}

fn detokenize_body(state: &SharedState, input: DetokenizeInput) -> Result<Detokenized, ApiError> {
    check_model(state, input.model.as_deref())?;
    let tokens = input.tokens.ok_or_else(|| RULES.wrong_type("tokens"))?;
    let vocab_size = state.tokenizer.vocab_size() as i64;
    if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t >= vocab_size) {
        return Err(RULES.refuse("tokens", "token_out_of_vocab", &[("token_id", &bad.to_string())]));
    }
    // In the vocabulary, so each fits a u32.
    let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let prompt = state.tokenizer.decode(&ids).map_err(|e| ApiError::invalid_param("tokens", format!("{e}")))?;
    Ok(Detokenized { prompt })
}
