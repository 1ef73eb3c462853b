//! `POST /v1/chat/completions`: the request as sent (`types`), checked
//! (`validate`), rendered into the engine's prompt and its output into the
//! OpenAI answer (`convert`); `batch` serves the batch route.

pub mod batch;
pub mod convert;
pub mod types;
pub mod validate;

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::answer::{
    answer, stream_choices, stream_usage, whole_answer, whole_choices, AnswerFormat, ChatExtras, ChoiceBody, Fields,
};
use crate::http::generation::chat_stream::{ChatChunks, ChatOpening};
use crate::http::generation::message::ResponseMessage;
use crate::http::generation::sse::ChunkHeader;
use crate::http::generation::submit::{stop_reason_json, submit, Endpoint};
use crate::http::generation::template_kwargs::thinking_enabled;
use crate::http::generation::tools::{finish_reason, output_parser, reasoning_parser, whole_message, ParsedChatChunks};
use crate::http::generation::usage::UsageInfo;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use convert::{prepare_chat, response_role, whole_logprobs};
use std::sync::Arc;
use types::{ChatBody, ChatRequest, PreparedChat};
use vllm_rs_generate::logprobs::{Rendering, TokenStrings};

/// Handles a chat completion request, streamed or not.
pub async fn create_chat_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<ChatBody>,
) -> Response {
    match chat_completion(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Answers a chat body as `/v1/chat/completions` does: the OpenAI response or
/// stream, or the error response. `/v1/messages` answers through it too.
pub(crate) async fn chat_completion(
    state: SharedState,
    headers: HeaderMap,
    body: ChatBody,
) -> Result<Response, ApiError> {
    let PreparedChat { request, tools, template_kwargs, prompt_token_ids } = prepare_chat(&state, body)?;
    let ChatRequest { common, messages, add_generation_prompt, echo, .. } = request;
    let (stream, usage) = (common.stream, stream_usage(&state, &common));
    let role = response_role(&state.config.chat.response_role, &messages, add_generation_prompt);
    // vLLM's echo: the last message's content, when its role is the answer's.
    let echo = echo.then(|| messages.last().filter(|m| m.role == role).map(|m| m.content.clone())).flatten();
    let rendering = (common.sampling.logprobs.is_some() || common.sampling.prompt_logprobs.is_some()).then(|| {
        Arc::new(Rendering {
            strings: TokenStrings {
                tokenizer: state.tokenizer.clone(),
                as_ids: common.return_tokens_as_token_ids.unwrap_or(state.config.return_tokens_as_token_ids),
            },
            logprobs: common.sampling.logprobs,
            echo: None,
            prompt_logprobs: common.sampling.prompt_logprobs.is_some(),
        })
    });
    let mut submitted = submit(&state, &headers, Endpoint::Chat, prompt_token_ids, common)?;
    if let Some(parser) = reasoning_parser(&state.config.chat, thinking_enabled(&template_kwargs)) {
        for generation in std::iter::once(&mut submitted.generation).chain(&mut submitted.more_choices) {
            generation.count_reasoning(parser.clone());
        }
    }
    let opening = Arc::new(ChatOpening {
        role: role.clone(),
        echo: echo.clone().filter(|e| !e.is_empty()),
        prompt_token_ids: submitted.prompt_token_ids.as_deref().map(Arc::from),
    });
    if let Some(parser) = output_parser(&tools, &state.config.chat, thinking_enabled(&template_kwargs)) {
        let model = state.config.primary_model_name().to_string();
        if stream {
            let header = ChunkHeader::new(&submitted.id, "chat.completion.chunk", submitted.created, &model);
            let writer = |header, index| ParsedChatChunks {
                header,
                opening: opening.clone(),
                stream: parser.stream().into(),
                mode: tools.mode,
                index,
                rendering: rendering.clone(),
            };
            return Ok(stream_choices(submitted.generation, submitted.more_choices, header, usage, writer).await);
        }
        let mut response_prompt_logprobs = None;
        let (choices, usage) = whole_choices(&mut submitted, |index, whole| {
            let (message, called) = whole_message(&parser, &role, &whole.text);
            let (logprobs, prompt_logprobs) = whole_logprobs(rendering.as_deref(), &whole);
            if response_prompt_logprobs.is_none() {
                response_prompt_logprobs = prompt_logprobs;
            }
            let mut choice = Fields::default();
            choice.put("index", &index);
            choice.put("message", &message.echoed(echo.as_deref()));
            choice.put_raw("logprobs", logprobs);
            choice.put("finish_reason", &finish_reason(whole.finish.reason.as_str(), tools.mode, called));
            choice.put("stop_reason", &stop_reason_json(&whole.finish.stop_reason));
            choice.put("token_ids", &whole.token_ids);
            choice
        })
        .await?;
        let extras = ChatExtras {
            prompt_logprobs: response_prompt_logprobs,
            prompt_token_ids: submitted.prompt_token_ids.take(),
        };
        let usage = UsageInfo::of(usage, state.config.enable_prompt_tokens_details);
        let body = whole_answer(&submitted, "chat.completion", &model, choices, usage, Some(extras));
        return Ok(axum::Json(body).into_response());
    }
    let format = AnswerFormat {
        object: "chat.completion",
        chunk_object: "chat.completion.chunk",
        writer: |header, index| ChatChunks { header, opening: opening.clone(), index, rendering: rendering.clone() },
        content: |whole: vllm_rs_generate::Whole| {
            let (logprobs, response_prompt_logprobs) = whole_logprobs(rendering.as_deref(), &whole);
            let mut fields = Fields::default();
            fields.put("message", &ResponseMessage::new(&role, Some(whole.text)).echoed(echo.as_deref()));
            fields.put_raw("logprobs", logprobs);
            ChoiceBody { fields, tail: Fields::default(), response_prompt_logprobs }
        },
        chat: true,
    };
    answer(&state, submitted, stream, usage, format).await
}
