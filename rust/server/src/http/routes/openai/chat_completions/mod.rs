//! `POST /v1/chat/completions`.

pub mod batch;

use crate::http::body::{parse_body, JsonRequest};
use crate::http::error::ApiError;
use crate::http::generation::answer::{
    answer, stream_choices, stream_usage, whole_answer, whole_choices, AnswerFormat, ChatExtras, ChoiceBody, Fields,
};
use crate::http::generation::chat_stream::{ChatChunks, ChatOpening};
use crate::http::generation::message::ResponseMessage;
use crate::http::generation::sse::ChunkHeader;
use crate::http::generation::structured::{read_structured_outputs, wire_params};
use crate::http::generation::submit::{check_generates, check_model, stop_reason_json, submit, Endpoint};
use crate::http::generation::template_kwargs::{
    apply_reasoning_effort, read_reasoning_effort, read_template_kwargs, thinking_enabled,
};
use crate::http::generation::tools::{
    finish_reason, output_parser, read_chat_tools, reasoning_parser, template_extra, whole_message, ChatTools,
    ParsedChatChunks, ToolsInput,
};
use crate::http::generation::usage::UsageInfo;
use crate::http::rules::RULES;
use crate::http::sampling::{CommonParams, SamplingRequest};
use crate::http::state::{AppState, SharedState};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;
use vllm_rs_chat::chat_template::ChatTemplate;
use vllm_rs_chat::{ChatMessage, ChatTemplateError};
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

/// A chat request whose parameters are all read and checked.
#[derive(Debug)]
pub struct ChatRequest {
    /// The parameters shared with completions.
    pub common: CommonParams,
    /// The conversation, each content flattened to text.
    pub messages: Vec<ChatMessage>,
    /// End the prompt with the assistant's turn (false by default with
    /// `continue_final_message`, as vLLM's frontend reads an omitted value).
    pub add_generation_prompt: bool,
    /// Leave the final message open for the model to continue.
    pub continue_final_message: bool,
    /// Put the last message before the answer when it has the answer's role.
    pub echo: bool,
    /// The request's own chat template (`chat_template`), served only when the server trusts it.
    pub chat_template: Option<String>,
    /// The requested reasoning effort (`reasoning_effort`), before the server's map.
    pub reasoning_effort: Option<String>,
    /// The tool fields, read with the server's options by [`read_chat_tools`].
    pub tools: ToolsInput,
    /// The request's `chat_template_kwargs`, merged over the server's by [`read_template_kwargs`].
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// One message as sent.
#[derive(Debug, Deserialize)]
pub struct MessageInput {
    role: String,
    #[serde(default)]
    content: Option<ContentInput>,
    /// The other fields: what templates get beyond role and content (see [`template_extra`]).
    #[serde(flatten)]
    extra: Map<String, Value>,
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

/// A `/v1/chat/completions` body as sent: the shared sampling fields and [`ChatFields`].
pub type ChatBody = SamplingRequest<ChatFields>;

/// The fields of a `/v1/chat/completions` body its own, as sent (the sampling fields aside).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChatFields {
    /// The conversation.
    pub messages: Option<Vec<MessageInput>>,
    /// The token limit; wins over `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Return logprobs of the generated tokens.
    pub logprobs: Option<bool>,
    /// Top logprobs per generated token (with `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Functions the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Let the model call several functions at once (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `json_object` / `json_schema`: a structured-outputs constraint.
    pub response_format: Option<Map<String, Value>>,
    /// vLLM's structured-outputs constraint.
    pub structured_outputs: Option<Map<String, Value>>,
    /// End the prompt with the assistant's turn.
    pub add_generation_prompt: Option<bool>,
    /// Leave the final message open for the model to continue.
    pub continue_final_message: Option<bool>,
    /// The reasoning effort the template gets.
    pub reasoning_effort: Option<Value>,
    /// Put the last message before the answer.
    pub echo: Option<bool>,
    /// The request's own chat template.
    pub chat_template: Option<String>,
    /// Variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Refused: there is no multimodal processor here.
    pub mm_processor_kwargs: Option<IgnoredAny>,
}

/// The message of a refused untrusted `chat_template`: vLLM's words.
const UNTRUSTED_TEMPLATE: &str = "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

/// Reads every parameter of a chat body, or a 4xx naming the first bad one.
/// Needs neither the model nor the tokenizer, so it never fails otherwise.
pub fn parse_chat_request(body: &[u8]) -> Result<ChatRequest, ApiError> {
    parse_body::<ChatBody>(body)?.validate()
}

impl ChatBody {
    /// Checks every parameter by the rule table, or a 4xx naming the first
    /// bad one; tools and template kwargs are left for the server's options.
    pub fn validate(mut self) -> Result<ChatRequest, ApiError> {
        let sampling = std::mem::take(&mut self.sampling);
        if let Some(top) = self.route.top_logprobs {
            RULES.check_int("top_logprobs", top)?;
            if (top == -1 || top > 0) && self.route.logprobs != Some(true) {
                return Err(RULES.refuse("top_logprobs", "top_logprobs_without_logprobs", &[]));
            }
        }
        let continue_final_message = self.route.continue_final_message == Some(true);
        if continue_final_message && self.route.add_generation_prompt == Some(true) {
            return Err(RULES.refuse("continue_final_message", "continue_with_generation_prompt", &[]));
        }
        if self.route.mm_processor_kwargs.is_some() {
            return Err(ApiError::invalid_param(
                "mm_processor_kwargs",
                "mm_processor_kwargs is not supported: this server has no multimodal processor",
            ));
        }
        // vLLM reads max_completion_tokens when given, else max_tokens.
        let max_tokens = match (self.route.max_completion_tokens, sampling.max_tokens) {
            (Some(n), _) => Some(("max_completion_tokens", n)),
            (None, n) => n.map(|n| ("max_tokens", n)),
        };
        let mut common = sampling.check(max_tokens)?;
        if self.route.logprobs == Some(true) {
            common.sampling.logprobs = Some(self.route.top_logprobs.unwrap_or(0));
        }
        common.sampling.structured_outputs =
            read_structured_outputs(self.route.structured_outputs.as_ref(), self.route.response_format.as_ref())?
                .map(|fields| wire_params(&fields));
        let tools = self.take_tools();
        let messages = messages(self.route.messages)?;
        let reasoning_effort = read_reasoning_effort(self.route.reasoning_effort.as_ref(), "reasoning_effort")?;
        Ok(ChatRequest {
            common,
            messages,
            add_generation_prompt: self.route.add_generation_prompt.unwrap_or(!continue_final_message),
            continue_final_message,
            echo: self.route.echo == Some(true),
            chat_template: self.route.chat_template,
            reasoning_effort,
            tools,
            chat_template_kwargs: self.route.chat_template_kwargs,
        })
    }

    /// The tool fields, moved out for [`read_chat_tools`].
    pub fn take_tools(&mut self) -> ToolsInput {
        // vLLM refuses its own json/regex/choice constraints next to a named choice.
        let constrained = self
            .route
            .structured_outputs
            .as_ref()
            .is_some_and(|c| ["json", "regex", "choice"].iter().any(|k| c.get(*k).is_some_and(|v| !v.is_null())));
        ToolsInput {
            tools: self.route.tools.take(),
            tool_choice: self.route.tool_choice.take(),
            parallel_tool_calls: self.route.parallel_tool_calls,
            constrained,
        }
    }
}

/// The prompt text of `request` with its checked `tools` and template kwargs:
/// the request's own template when the server trusts it (400 otherwise),
/// the final message left open with `continue_final_message`.
fn render_prompt(
    state: &AppState,
    request: &ChatRequest,
    tools: Option<&Value>,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    let template_error = |e: ChatTemplateError| {
        let param = if request.chat_template.is_some() { "chat_template" } else { "messages" };
        ApiError::invalid_param(param, format!("cannot apply the chat template: {e}"))
    };
    let (messages, add_generation_prompt) = (&request.messages, request.add_generation_prompt);
    let prompt = match &request.chat_template {
        Some(_) if !state.config.chat.trust_request_chat_template => {
            return Err(ApiError::invalid_param("chat_template", UNTRUSTED_TEMPLATE))
        }
        Some(source) => {
            let (bos, eos) = state.tokenizer.template_tokens();
            ChatTemplate::new(source.clone(), bos, eos)
                .map_err(|e| {
                    ApiError::invalid_param("chat_template", format!("the chat template does not compile: {e}"))
                })?
                .render_with_tools(messages, add_generation_prompt, tools, kwargs)
                .map_err(template_error)?
        }
        None => state
            .tokenizer
            .apply_chat_template_with_tools(messages, add_generation_prompt, tools, kwargs)
            .map_err(template_error)?,
    };
    if !request.continue_final_message {
        return Ok(prompt);
    }
    let last = messages.last().map(|m| m.content.as_str()).unwrap_or_default();
    continue_final_message(&prompt, last).ok_or_else(|| {
        ApiError::invalid_param(
            "continue_final_message",
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.",
        )
    })
}

/// `rendered` cut right after the final message's text, as transformers'
/// `apply_chat_template(continue_final_message=True)` cuts it (which vLLM
/// calls): at its last occurrence, keeping its leading spacing, and its
/// trailing spacing when the template kept it. `None` when the template
/// dropped part of the message.
pub fn continue_final_message(rendered: &str, final_message: &str) -> Option<String> {
    let stripped = final_message.trim();
    let at = rendered.rfind(stripped)?;
    let left_stripped = final_message.trim_start();
    let end = if rendered[at..].starts_with(left_stripped) { at + left_stripped.len() } else { at + stripped.len() };
    Some(rendered[..end].to_owned())
}

/// A chat request checked, its prompt rendered by the chat template and
/// tokenized: what answering it, rendering it (`/v1/chat/completions/render`)
/// and counting its tokens (`/v1/messages/count_tokens`) share.
pub struct PreparedChat {
    /// The checked request.
    pub request: ChatRequest,
    /// Its tools and `tool_choice`, read with the server's options.
    pub tools: ChatTools,
    /// The chat template's variables: the server's defaults, the request's, the reasoning effort.
    pub template_kwargs: Map<String, Value>,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
}

/// Checks `body` with the server's options and renders and tokenizes its prompt.
pub fn prepare_chat(state: &AppState, body: ChatBody) -> Result<PreparedChat, ApiError> {
    let mut request = body.validate()?;
    let tools = read_chat_tools(&request.tools, &state.config.chat)?;
    let chat = &state.config.chat;
    let given_kwargs = request.chat_template_kwargs.as_ref();
    let mut template_kwargs = read_template_kwargs(given_kwargs, &chat.default_template_kwargs)?;
    apply_reasoning_effort(
        &mut template_kwargs,
        given_kwargs,
        request.reasoning_effort.as_deref(),
        &chat.reasoning_effort_map,
    );
    if let Some(constraint) = &tools.constraint {
        // A forced tool choice replaces the request's own constraint, as in vLLM.
        request.common.sampling.structured_outputs = Some(wire_params(constraint));
    }
    check_model(state, request.common.model.as_deref())?;
    check_generates(state, Endpoint::Chat)?;
    let prompt = render_prompt(state, &request, tools.tools.as_ref(), &template_kwargs)?;
    let prompt_token_ids = state
        .tokenizer
        .encode(&prompt, false)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize the messages: {e}")))?;
    Ok(PreparedChat { request, tools, template_kwargs, prompt_token_ids })
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

/// A whole chat answer's `logprobs` (choice) and `prompt_logprobs`
/// (response), each `None` when not asked for.
fn whole_logprobs(
    rendering: Option<&Rendering>,
    whole: &vllm_rs_generate::Whole,
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

/// The conversation, each content flattened to text, with what templates
/// get beyond role and content.
pub(crate) fn messages(items: Option<Vec<MessageInput>>) -> Result<Vec<ChatMessage>, ApiError> {
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
            Ok(ChatMessage { role: item.role, content, extra: template_extra(&item.extra) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::generation::tools::read_chat_tools;
    use axum::http::StatusCode;
    use serde_json::json;
    use vllm_rs_config::ChatOptions;

    fn options(parser: Option<&str>) -> ChatOptions {
        ChatOptions { auto_tool_parser: parser.map(str::to_owned), ..ChatOptions::default() }
    }

    #[test]
    fn continue_final_message_cuts_where_transformers_cuts() {
        let rendered = "<|user|>hi<|end|><|assistant|>Once upon<|end|>";
        assert_eq!(
            continue_final_message(rendered, "Once upon").as_deref(),
            Some("<|user|>hi<|end|><|assistant|>Once upon")
        );
        // Trailing spacing the template kept stays; spacing it trimmed is not restored.
        assert_eq!(continue_final_message("<a>Once upon <e>", "Once upon ").as_deref(), Some("<a>Once upon "));
        assert_eq!(continue_final_message("<a>Once upon<e>", "Once upon ").as_deref(), Some("<a>Once upon"));
        // The last occurrence counts.
        assert_eq!(continue_final_message("x<e>x<e>", "x").as_deref(), Some("x<e>x"));
        assert_eq!(continue_final_message("<a>changed<e>", "Once upon"), None);
    }

    #[test]
    fn parses_the_options_vllm_honours() {
        let body = br#"{"messages": [{"role": "user", "content": "hi"}], "echo": true, "chat_template": "{{ x }}",
            "continue_final_message": true, "request_id": "mine", "return_token_ids": true,
            "include_stop_str_in_output": true, "truncate_prompt_tokens": 3}"#;
        let request = parse_chat_request(body).unwrap();
        assert!(request.echo && request.continue_final_message && !request.add_generation_prompt);
        assert_eq!(request.chat_template.as_deref(), Some("{{ x }}"));
        assert_eq!(request.common.request_id.as_deref(), Some("mine"));
        assert!(request.common.return_token_ids && request.common.include_stop_str_in_output);
        assert_eq!(request.common.truncation.map(|t| t.keep), Some(Some(3)));
        let explicit = br#"{"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true,
            "add_generation_prompt": false}"#;
        assert!(!parse_chat_request(explicit).unwrap().add_generation_prompt);
    }

    #[test]
    fn refuses_what_it_cannot_serve_naming_it() {
        for (extra, param) in [
            (r#""mm_processor_kwargs": {"a": 1}"#, "mm_processor_kwargs"),
            (r#""continue_final_message": true, "add_generation_prompt": true"#, "continue_final_message"),
        ] {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}], {extra}}}"#);
            let err = parse_chat_request(body.as_bytes()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{extra}");
        }
    }

    fn refusal(body: Value) -> ApiError {
        parse_chat_request(&serde_json::to_vec(&body).unwrap()).expect_err(&body.to_string())
    }

    #[test]
    fn serde_errors_of_the_typed_body_are_the_rule_tables_messages() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        for (body, param) in [
            // Wrong types, top-level and deep inside a field.
            (json!({"messages": hi, "max_tokens": "5"}), "max_tokens"),
            (json!({"messages": hi, "logprobs": 1}), "logprobs"),
            (json!({"messages": hi, "chat_template_kwargs": [1]}), "chat_template_kwargs"),
            (json!({"messages": hi, "chat_template_kwargs": "x"}), "chat_template_kwargs"),
            (json!({"messages": hi, "tools": {"type": "function"}}), "tools"),
            (json!({"messages": hi, "response_format": "json"}), "response_format"),
            (json!({"messages": [{"role": 1, "content": "hi"}]}), "messages"),
            // A missing required field of a message.
            (json!({"messages": [{"content": "hi"}]}), "messages"),
            // Bad enum values.
            (json!({"messages": hi, "reasoning_effort": "extreme"}), "reasoning_effort"),
            (json!({"messages": hi, "truncation_side": "middle"}), "truncation_side"),
            // Bounds.
            (json!({"messages": hi, "top_logprobs": -2, "logprobs": true}), "top_logprobs"),
            (json!({"messages": hi, "max_completion_tokens": 0}), "max_completion_tokens"),
        ] {
            let err = refusal(body.clone());
            assert_eq!((err.status, err.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{body}");
            for leak in ["invalid type", "expected", "i64", "Map", "Vec<", "MessageInput", "line "] {
                assert!(!err.message.contains(leak), "{body}: {}", err.message);
            }
        }
        let err = refusal(json!({"messages": hi, "max_tokens": "5"}));
        assert_eq!(err.message, RULES.wrong_type("max_tokens").message);
        let err = refusal(json!({"max_tokens": 5}));
        assert_eq!(err.message, RULES.message("messages_missing", &[]));
    }

    #[test]
    fn unknown_fields_are_ignored_and_message_fields_reach_the_template() {
        let body = json!({"messages": [{"role": "tool", "content": "sunny", "tool_call_id": "c1", "x": 1}],
            "no_such_field": {"deep": [1]}, "max_tokens": 3});
        let request = parse_chat_request(&serde_json::to_vec(&body).unwrap()).unwrap();
        assert_eq!(request.common.sampling.max_tokens, Some(3));
        let extra = request.messages[0].extra.clone().unwrap();
        assert_eq!(Value::Object(extra), json!({"tool_call_id": "c1"}));
    }

    #[test]
    fn tools_and_template_kwargs_are_kept_for_the_servers_options() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
            "parallel_tool_calls": false, "structured_outputs": {"regex": "a"},
            "chat_template_kwargs": {"enable_thinking": false}});
        let request = parse_chat_request(&serde_json::to_vec(&body).unwrap()).unwrap();
        assert_eq!(request.tools.tools.as_ref().map(Vec::len), Some(1));
        assert_eq!(request.tools.tool_choice, Some(json!("auto")));
        assert!(request.tools.parallel_tool_calls == Some(false) && request.tools.constrained);
        assert_eq!(request.chat_template_kwargs.unwrap()["enable_thinking"], json!(false));
    }

    #[test]
    fn tool_choice_modes_and_refusals_follow_vllm() {
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let read = |b: Value, parser: Option<&str>| {
            let mut body: ChatBody = serde_json::from_value(b).unwrap();
            read_chat_tools(&body.take_tools(), &options(parser))
        };
        assert_eq!(read(json!({"tools": [tool]}), Some("hermes")).unwrap().mode, "auto");
        let e = read(json!({"tools": [tool]}), None).unwrap_err();
        assert_eq!(e.message, RULES.message("auto_tool_choice_disabled", &[]));
        let named = read(
            json!({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            Some("hermes"),
        )
        .unwrap();
        assert_eq!((named.mode, named.constraint.unwrap()["json"].clone()), ("named", json!({"type": "object"})));
        let required = read(json!({"tools": [tool], "tool_choice": "required"}), Some("hermes")).unwrap();
        assert_eq!(required.constraint.unwrap()["json"]["minItems"], 1);
        assert_eq!(read(json!({"tools": [tool], "tool_choice": "required"}), Some("mistral")).unwrap().mode, "auto");
        assert_eq!(read(json!({"tools": []}), None).unwrap_err().param.as_deref(), Some("tools"));
        assert_eq!(read(json!({"tool_choice": "auto"}), None).unwrap_err().param.as_deref(), Some("tool_choice"));
    }
}
