//! `POST /v1/chat/completions`.

use super::answer::{answer, stream_choices, whole_answer, whole_choices, AnswerFormat, ChoiceBody, Fields};
use super::error::ApiError;
use super::params::{parse_body, parse_json_object, CommonParams, JsonBody, SamplingInput};
use super::rules::RULES;
use super::sse::{ChunkHeader, ChunkWriter};
use super::state::SharedState;
use super::structured::{read_structured_outputs, wire_params};
use super::submit::{check_model, stop_reason_json, submit, Endpoint};
use super::template_kwargs::{apply_reasoning_effort, read_reasoning_effort, read_template_kwargs, thinking_enabled};
use super::tools::{finish_reason, output_parser, read_chat_tools, template_extra, whole_message, ParsedChatChunks};
use crate::generate::{Delta, Usage};
use crate::logprobs::{Rendering, TokenStrings};
use crate::tokenizer::ChatMessage;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Handles a chat completion request, streamed or not.
pub async fn create_chat_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Response {
    match chat_completion(state, headers, &body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A chat request whose parameters are all read and checked.
#[derive(Debug)]
pub struct ChatRequest {
    /// The parameters shared with completions.
    pub common: CommonParams,
    /// The conversation, each content flattened to text.
    pub messages: Vec<ChatMessage>,
    /// End the prompt with the assistant's turn.
    pub add_generation_prompt: bool,
    /// The requested reasoning effort (`reasoning_effort`), before the server's map.
    pub reasoning_effort: Option<String>,
}

/// One message as sent.
#[derive(Debug, Deserialize)]
pub(crate) struct MessageInput {
    role: String,
    #[serde(default)]
    content: Option<ContentInput>,
}

/// A message's content: text, or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentInput {
    Text(String),
    Parts(Vec<PartInput>),
}

/// One content part; only text parts are supported.
#[derive(Debug, Deserialize)]
struct PartInput {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// The fields only chat has, as sent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChatInput {
    messages: Option<Vec<MessageInput>>,
    max_completion_tokens: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<Map<String, Value>>,
    structured_outputs: Option<Map<String, Value>>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    reasoning_effort: Option<Value>,
}

/// Reads every parameter of a chat body, or a 4xx naming the first bad one.
/// Needs neither the model nor the tokenizer, so it never fails otherwise.
pub fn parse_chat_request(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let input: ChatInput = parse_body(body)?;
    let sampling: SamplingInput = parse_body(body)?;
    if let Some(top) = input.top_logprobs {
        RULES.check_int("top_logprobs", top)?;
        if (top == -1 || top > 0) && input.logprobs != Some(true) {
            return Err(RULES.refuse("top_logprobs", "top_logprobs_without_logprobs", &[]));
        }
    }
    if input.continue_final_message == Some(true) {
        let key = match input.add_generation_prompt {
            Some(true) => "continue_with_generation_prompt",
            _ => "continue_final_message_unsupported",
        };
        return Err(RULES.refuse("continue_final_message", key, &[]));
    }
    // vLLM reads max_completion_tokens when given, else max_tokens.
    let max_tokens = match (input.max_completion_tokens, sampling.max_tokens) {
        (Some(n), _) => Some(("max_completion_tokens", n)),
        (None, n) => n.map(|n| ("max_tokens", n)),
    };
    let mut common = sampling.check(max_tokens)?;
    if input.logprobs == Some(true) {
        common.sampling.logprobs = Some(input.top_logprobs.unwrap_or(0));
    }
    let object = parse_json_object(body)?;
    common.sampling.structured_outputs = read_structured_outputs(&object)?.map(|fields| wire_params(&fields));
    let messages = messages(input.messages, object.get("messages"))?;
    let reasoning_effort = read_reasoning_effort(input.reasoning_effort.as_ref(), "reasoning_effort")?;
    Ok(ChatRequest {
        common,
        messages,
        add_generation_prompt: input.add_generation_prompt.unwrap_or(true),
        reasoning_effort,
    })
}

async fn chat_completion(state: SharedState, headers: HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let ChatRequest { mut common, messages, add_generation_prompt, reasoning_effort } = parse_chat_request(body)?;
    let object = parse_json_object(body)?;
    let tools = read_chat_tools(&object, &state.config.chat)?;
    let chat = &state.config.chat;
    let mut template_kwargs = read_template_kwargs(&object, &chat.default_template_kwargs)?;
    apply_reasoning_effort(&mut template_kwargs, &object, reasoning_effort.as_deref(), &chat.reasoning_effort_map);
    if let Some(constraint) = &tools.constraint {
        // A forced tool choice replaces the request's own constraint, as in vLLM.
        common.sampling.structured_outputs = Some(wire_params(constraint));
    }
    check_model(&state, common.model.as_deref())?;
    let prompt = state
        .tokenizer
        .apply_chat_template_with_tools(&messages, add_generation_prompt, tools.tools.as_ref(), &template_kwargs)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}")))?;
    let prompt_token_ids = state
        .tokenizer
        .encode(&prompt, false)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize the messages: {e}")))?;
    let (stream, include_usage) = (common.stream, common.include_usage);
    let role = response_role(&state.config.chat.response_role, &messages, add_generation_prompt);
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
    if let Some(parser) = output_parser(&tools, &state.config.chat, thinking_enabled(&template_kwargs)) {
        let model = state.config.primary_model_name().to_string();
        if stream {
            let include_usage = include_usage || state.config.enable_force_include_usage;
            let header =
                ChunkHeader { id: submitted.id, object: "chat.completion.chunk", created: submitted.created, model };
            let writer = |header, index| ParsedChatChunks {
                header,
                role: role.clone(),
                stream: parser.stream().into(),
                mode: tools.mode,
                index,
                rendering: rendering.clone(),
            };
            return Ok(
                stream_choices(submitted.generation, submitted.more_choices, header, include_usage, writer).await
            );
        }
        let reasoning_field = state.config.chat.reasoning_parser.is_some();
        let mut response_prompt_logprobs = None;
        let (choices, usage) = whole_choices(&mut submitted, |index, whole| {
            let (message, called) = whole_message(&parser, &role, &whole.text, reasoning_field);
            let (logprobs, prompt_logprobs) = whole_logprobs(rendering.as_deref(), &whole);
            if response_prompt_logprobs.is_none() {
                response_prompt_logprobs = prompt_logprobs;
            }
            let mut choice = Fields::default();
            choice.put("index", &index);
            choice.put("message", &message);
            choice.put_raw("logprobs", logprobs);
            choice.put("finish_reason", &finish_reason(whole.finish.reason.as_str(), tools.mode, called));
            choice.put("stop_reason", &stop_reason_json(&whole.finish.stop_reason));
            choice
        })
        .await?;
        let body = whole_answer(&submitted, "chat.completion", &model, choices, usage, response_prompt_logprobs);
        return Ok(axum::Json(body).into_response());
    }
    let format = AnswerFormat {
        object: "chat.completion",
        chunk_object: "chat.completion.chunk",
        writer: |header, index| ChatChunks { header, role: role.clone(), index, rendering: rendering.clone() },
        content: |whole: crate::generate::Whole| {
            let (logprobs, response_prompt_logprobs) = whole_logprobs(rendering.as_deref(), &whole);
            let mut fields = Fields::default();
            fields.put("message", &json!({"role": &role, "content": whole.text}));
            fields.put_raw("logprobs", logprobs);
            ChoiceBody { fields, response_prompt_logprobs }
        },
    };
    answer(&state, submitted, stream, include_usage, format).await
}

/// A whole chat answer's `logprobs` (choice) and `prompt_logprobs`
/// (response), each `None` when not asked for.
fn whole_logprobs(
    rendering: Option<&Rendering>,
    whole: &crate::generate::Whole,
) -> (Option<Box<RawValue>>, Option<Box<RawValue>>) {
    let Some(rendering) = rendering else { return (None, None) };
    let scored = whole.scored.as_deref();
    let prompt = rendering
        .prompt_logprobs
        .then(|| rendering.prompt_logprobs_json(scored.and_then(|s| s.prompt_logprobs.as_deref())));
    (rendering.chat_logprobs(scored), prompt)
}

/// The role of the answer, as vLLM picks it: `response_role` when the prompt
/// ends with the generation prompt, else the last message's role (the model
/// continues that message).
fn response_role(configured: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    match messages.last() {
        Some(last) if !add_generation_prompt => last.role.clone(),
        _ => configured.to_owned(),
    }
}

/// The conversation, each content flattened to text; `raw` (the messages as
/// sent) gives what templates get beyond role and content.
pub(crate) fn messages(items: Option<Vec<MessageInput>>, raw: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = items.ok_or_else(|| RULES.refuse("messages", "messages_missing", &[]))?;
    if items.is_empty() {
        return Err(RULES.refuse("messages", "messages_empty", &[]));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let content = match item.content {
                None => String::new(),
                Some(ContentInput::Text(text)) => text,
                Some(ContentInput::Parts(parts)) => parts
                    .into_iter()
                    .map(|part| match (part.kind.as_str(), part.text) {
                        ("text", Some(text)) => Ok(text),
                        _ => Err(RULES.refuse("messages", "text_parts_only", &[("index", &i.to_string())])),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
            };
            let extra = raw.and_then(|r| r.get(i)).and_then(Value::as_object).and_then(template_extra);
            Ok(ChatMessage { role: item.role, content, extra })
        })
        .collect()
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: ChunkDelta<'a>,
    logprobs: Option<Box<RawValue>>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Value>,
}

#[derive(Serialize)]
struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    /// Left out of a chunk that only carries logprobs (vLLM's empty `DeltaMessage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// The chunks of one choice of a streamed chat answer.
struct ChatChunks {
    header: ChunkHeader,
    /// The role the first chunk announces.
    role: String,
    /// The choice's index (streams of n > 1 choices interleave them).
    index: u32,
    /// How logprobs are shown, when the request asked for them.
    rendering: Option<Arc<Rendering>>,
}

impl ChunkWriter for ChatChunks {
    fn opening(&self) -> Option<Bytes> {
        let delta = ChunkDelta { role: Some(&self.role), content: Some("") };
        Some(self.header.event(
            vec![ChunkChoice { index: self.index, delta, logprobs: None, finish_reason: None, stop_reason: None }],
            None,
        ))
    }

    fn delta(&self, delta: &Delta) -> Bytes {
        let choice = ChunkChoice {
            index: self.index,
            delta: ChunkDelta {
                role: None,
                content: (!delta.text.is_empty() || delta.finish.is_some()).then_some(delta.text.as_str()),
            },
            logprobs: self.rendering.as_ref().and_then(|r| r.chat_logprobs(delta.scored.as_deref())),
            finish_reason: delta.finish.as_ref().map(|f| f.reason.as_str()),
            stop_reason: delta.finish.as_ref().map(|f| stop_reason_json(&f.stop_reason)),
        };
        self.header.event(vec![choice], None)
    }

    fn usage(&self, usage: Usage) -> Bytes {
        self.header.event::<ChunkChoice>(Vec::new(), Some(usage))
    }
}
