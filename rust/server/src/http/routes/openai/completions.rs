//! `POST /v1/completions`.

use crate::http::body::{parse_body, JsonRequest};
use crate::http::error::ApiError;
use crate::http::generation::answer::{answer, stream_usage, AnswerFormat, ChoiceBody, Fields};
use crate::http::generation::sse::{ChunkHeader, ChunkWriter};
use crate::http::generation::structured::{read_structured_outputs, wire_params};
use crate::http::generation::submit::{check_generates, check_model, stop_reason_json, submit, Endpoint};
use crate::http::generation::usage::UsageInfo;
use crate::http::rules::RULES;
use crate::http::sampling::{CommonParams, SamplingRequest};
use crate::http::state::{AppState, SharedState};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use vllm_rs_generate::logprobs::render::CompletionPieces;
use vllm_rs_generate::logprobs::{Echo, Rendering, TokenStrings};
use vllm_rs_generate::{Delta, Whole};

/// Handles a completion request, streamed or not.
pub async fn create_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<CompletionBody>,
) -> Response {
    match completion(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

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

/// Answers a completion body as `/v1/completions` does: the OpenAI response
/// or stream, or the error response. `/inference/v1/generate` answers through it too.
pub(crate) async fn completion(
    state: SharedState,
    headers: HeaderMap,
    body: CompletionBody,
) -> Result<Response, ApiError> {
    let CompletionRequest { common, prompt, echo, prompt_only } = body.validate()?;
    check_model(&state, common.model.as_deref())?;
    check_generates(&state, Endpoint::Completions)?;
    let (prompt_text, prompt_token_ids) = prompt_token_ids(&state, prompt)?;
    let rendering =
        (echo || common.sampling.logprobs.is_some() || common.sampling.prompt_logprobs.is_some()).then(|| {
            let echo = echo.then(|| Echo {
                // vLLM echoes no prompt text when it returns token ids instead.
                text: match prompt_text {
                    _ if common.return_token_ids => String::new(),
                    Some(text) => text,
                    None => state.tokenizer.decode(&prompt_token_ids).unwrap_or_default(),
                },
                token_ids: prompt_token_ids.clone(),
                prompt_only,
            });
            Arc::new(Rendering {
                strings: TokenStrings {
                    tokenizer: state.tokenizer.clone(),
                    as_ids: common.return_tokens_as_token_ids.unwrap_or(state.config.return_tokens_as_token_ids),
                },
                logprobs: common.sampling.logprobs,
                echo,
                prompt_logprobs: common.sampling.prompt_logprobs.is_some(),
            })
        });
    let (stream, usage) = (common.stream, stream_usage(&state, &common));
    let submitted = submit(&state, &headers, Endpoint::Completions, prompt_token_ids, common)?;
    let prompt_ids: Option<Arc<[u32]>> = submitted.prompt_token_ids.as_deref().map(Arc::from);
    let stream_rendering = rendering.clone();
    let stream_prompt_ids = prompt_ids.clone();
    let format = AnswerFormat {
        object: "text_completion",
        chunk_object: "text_completion",
        writer: move |header, index| CompletionChunks {
            header,
            index,
            pieces: stream_rendering.clone().map(CompletionPieces::new),
            prompt_token_ids: Mutex::new(stream_prompt_ids.clone()),
        },
        content: move |whole| completion_choice(whole, rendering.clone(), prompt_ids.as_deref()),
        chat: false,
    };
    answer(&state, submitted, stream, usage, format).await
}

/// The fields of a whole completion choice: text and logprobs, then (after
/// `token_ids`) prompt logprobs and prompt token ids, null when not asked for.
fn completion_choice(whole: Whole, rendering: Option<Arc<Rendering>>, prompt_token_ids: Option<&[u32]>) -> ChoiceBody {
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

/// vLLM's `CompletionResponseStreamChoice` as it streams it (the fields it
/// sets, nulls included).
#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    text: Cow<'a, str>,
    logprobs: Option<Box<RawValue>>,
    finish_reason: Option<&'static str>,
    stop_reason: Value,
    /// The prompt's token ids, on the choice's first chunk, when asked for.
    prompt_token_ids: Option<&'a [u32]>,
    /// The chunk's token ids, when asked for.
    token_ids: Option<&'a [u32]>,
}

/// The chunks of one choice of a streamed completion.
struct CompletionChunks {
    header: ChunkHeader,
    /// The choice's index (streams of n > 1 choices interleave them).
    index: u32,
    /// Echo and logprobs, when the request asked for either.
    pieces: Option<CompletionPieces>,
    /// The prompt's token ids until the first chunk took them (`return_token_ids`).
    prompt_token_ids: Mutex<Option<Arc<[u32]>>>,
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
