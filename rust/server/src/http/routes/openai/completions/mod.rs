//! `POST /v1/completions`: the request as sent (`types`), checked
//! (`validate`), turned into the engine's request and its output into the
//! OpenAI response (`convert`).

pub mod convert;
pub mod types;
pub mod validate;

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::answer::{answer, stream_usage, AnswerFormat};
use crate::http::generation::submit::{check_generates, check_model, submit, Endpoint};
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use convert::{completion_choice, prompt_token_ids, CompletionChunks};
use std::sync::{Arc, Mutex};
use types::{CompletionBody, CompletionRequest};
use vllm_rs_generate::logprobs::render::CompletionPieces;
use vllm_rs_generate::logprobs::{Echo, Rendering, TokenStrings};

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
