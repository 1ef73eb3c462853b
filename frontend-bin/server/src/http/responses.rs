//! `POST /v1/responses`, as vLLM 0.33 serves it without a response store:
//! text or message input, one assistant message of text out, unstreamed (the
//! response object) or streamed as vLLM's typed events (`response.created`
//! ... `response.completed`). `chat_template_kwargs` and `reasoning.effort`
//! reach the chat template as in chat completions. What this server does not
//! do (tools, background mode, stored responses, structured output) is a 400
//! naming the field, never dropped.

use super::answer::generation_error;
use super::error::ApiError;
use super::params::{parse_body, parse_json_object, JsonBody, SamplingInput};
use super::rules::RULES;
use super::state::{AppState, SharedState};
use super::submit::{check_model, submit, Endpoint, Submitted};
use super::template_kwargs::{apply_reasoning_effort, read_reasoning_effort, read_template_kwargs};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use vllm_rs_chat::ChatMessage;
use vllm_rs_config::serve_args::chat::REASONING_EFFORTS;
use vllm_rs_engine::ids::random_hex;
use vllm_rs_generate::{Finish, Generation, Usage};
use vllm_rs_wire::protocol::FinishReason;

/// Handles a responses request, streamed or not.
pub async fn create_response(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Response {
    match response(state, headers, &body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// The fields only the responses API has, as sent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ResponsesInput {
    input: Option<Value>,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    tools: Option<Vec<IgnoredAny>>,
    tool_choice: Option<Value>,
    background: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    include: Option<Vec<String>>,
    text: Option<TextConfig>,
    truncation: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
    user: Option<String>,
    parallel_tool_calls: Option<bool>,
    max_tool_calls: Option<i64>,
    service_tier: Option<String>,
    prompt_cache_key: Option<String>,
    safety_identifier: Option<String>,
    include_stop_str_in_output: Option<bool>,
    enable_response_messages: Option<bool>,
    reasoning: Option<Value>,
    // Present and non-null: refused (see `unsupported`).
    prompt: Option<IgnoredAny>,
    previous_input_messages: Option<IgnoredAny>,
    structured_outputs: Option<IgnoredAny>,
    kv_transfer_params: Option<IgnoredAny>,
    vllm_xargs: Option<IgnoredAny>,
    mm_processor_kwargs: Option<IgnoredAny>,
    media_io_kwargs: Option<IgnoredAny>,
}

/// `text`: only its format matters.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TextConfig {
    format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
struct TextFormat {
    #[serde(rename = "type")]
    kind: String,
}

/// A responses request whose parameters are all read and checked.
struct ResponsesRequest {
    sampling: SamplingInput,
    input: ResponsesInput,
    messages: Vec<ChatMessage>,
    /// `reasoning` as the response object repeats it (null when not given).
    reasoning: Value,
    /// The requested `reasoning.effort`, before the server's map.
    reasoning_effort: Option<String>,
    /// The template kwargs: the server's defaults, the request's own, its effort.
    template_kwargs: serde_json::Map<String, Value>,
}

/// The fields of `reasoning`, in the order vLLM writes them, each with the
/// values it may take (`None`: any string).
const REASONING_FIELDS: [(&str, Option<&[&str]>); 5] = [
    ("context", Some(&["auto", "current_turn", "all_turns"])),
    ("effort", Some(&REASONING_EFFORTS)),
    ("generate_summary", Some(&["auto", "concise", "detailed"])),
    ("mode", None),
    ("summary", Some(&["auto", "concise", "detailed"])),
];

/// `reasoning` checked as OpenAI's `Reasoning` model reads it, and written
/// back as vLLM's response object repeats it (every field, null when not
/// given); a 400 naming the first bad field. vLLM acts on `effort` only.
fn read_reasoning(value: Option<&Value>) -> Result<(Value, Option<String>), ApiError> {
    let fields = match value {
        None | Some(Value::Null) => return Ok((Value::Null, None)),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(RULES.wrong_type("reasoning")),
    };
    let mut echoed = serde_json::Map::new();
    for (name, allowed) in REASONING_FIELDS {
        let value = fields.get(name).unwrap_or(&Value::Null);
        let valid = match (value, allowed) {
            (Value::Null, _) => true,
            (Value::String(text), Some(allowed)) => allowed.contains(&text.as_str()),
            (Value::String(_), None) => true,
            _ => false,
        };
        if !valid {
            return Err(RULES.wrong_type(&format!("reasoning.{name}")));
        }
        echoed.insert(name.into(), value.clone());
    }
    let effort = read_reasoning_effort(fields.get("effort"), "reasoning.effort")?;
    Ok((Value::Object(echoed), effort))
}

/// Reads and checks every parameter, or a 4xx naming the first bad one;
/// `default_kwargs` are the server's `default_chat_template_kwargs`.
fn parse_responses_request(
    body: &[u8],
    default_kwargs: &serde_json::Map<String, Value>,
) -> Result<ResponsesRequest, ApiError> {
    let input: ResponsesInput = parse_body(body)?;
    let sampling: SamplingInput = parse_body(body)?;
    if input.prompt.is_some() {
        return Err(RULES.refuse("prompt", "prompt_template_unsupported", &[]));
    }
    if input.background == Some(true) {
        let key = if input.store == Some(false) { "background_store_false" } else { "background_without_store" };
        return Err(RULES.refuse("background", key, &[]));
    }
    if let Some(id) = &input.previous_response_id {
        // vLLM without its response store finds no earlier response.
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: RULES.message("response_not_found", &[("response_id", id)]),
            param: Some("response_id".into()),
        });
    }
    let unsupported = [
        ("tools", input.tools.as_ref().is_some_and(|tools| !tools.is_empty())),
        ("previous_input_messages", input.previous_input_messages.is_some()),
        ("structured_outputs", input.structured_outputs.is_some()),
        ("kv_transfer_params", input.kv_transfer_params.is_some()),
        ("vllm_xargs", input.vllm_xargs.is_some()),
        ("mm_processor_kwargs", input.mm_processor_kwargs.is_some()),
        ("media_io_kwargs", input.media_io_kwargs.is_some()),
        ("include_stop_str_in_output", input.include_stop_str_in_output == Some(true)),
        ("return_token_ids", sampling.return_token_ids == Some(true)),
        ("enable_response_messages", input.enable_response_messages == Some(true)),
    ];
    if let Some((param, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(RULES.refuse(param, "field_unsupported", &[("param", param)]));
    }
    match &input.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(choice)) if choice == "auto" || choice == "none" => {}
        Some(Value::String(choice)) => {
            return Err(RULES.refuse("tool_choice", "tool_choice_without_tools", &[("tool_choice", choice)]))
        }
        Some(_) => return Err(RULES.refuse("tool_choice", "field_unsupported", &[("param", "tool_choice")])),
    }
    if let Some(value) = input.include.iter().flatten().next() {
        return Err(RULES.refuse("include", "include_unsupported", &[("value", &format!("{value:?}"))]));
    }
    if input.text.as_ref().and_then(|text| text.format.as_ref()).is_some_and(|format| format.kind != "text") {
        return Err(RULES.refuse("text", "text_format_unsupported", &[]));
    }
    match input.truncation.as_deref() {
        None | Some("disabled") => {}
        Some("auto") => return Err(RULES.refuse("truncation", "truncation_unsupported", &[])),
        Some(_) => return Err(RULES.wrong_type("truncation")),
    }
    let messages = input_messages(input.instructions.as_deref(), input.input.as_ref())?;
    let (reasoning, reasoning_effort) = read_reasoning(input.reasoning.as_ref())?;
    let template_kwargs = read_template_kwargs(&parse_json_object(body)?, default_kwargs)?;
    Ok(ResponsesRequest { sampling, input, messages, reasoning, reasoning_effort, template_kwargs })
}

/// The conversation: `instructions` as the system message, then `input` (a
/// user message, or messages whose content is text or text parts).
fn input_messages(instructions: Option<&str>, input: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::new();
    if let Some(text) = instructions.filter(|text| !text.is_empty()) {
        messages.push(ChatMessage { role: "system".into(), content: text.into(), extra: None });
    }
    match input {
        None | Some(Value::Null) => return Err(RULES.refuse("input", "input_missing", &[])),
        Some(Value::String(text)) => {
            messages.push(ChatMessage { role: "user".into(), content: text.clone(), extra: None })
        }
        Some(Value::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                let message = input_message(item)
                    .ok_or_else(|| RULES.refuse("input", "input_item_unsupported", &[("index", &index.to_string())]))?;
                messages.push(message);
            }
        }
        Some(_) => return Err(RULES.wrong_type("input")),
    }
    if messages.is_empty() {
        return Err(RULES.refuse("input", "input_missing", &[]));
    }
    Ok(messages)
}

/// One input item as a chat message, when it is a message with text content.
fn input_message(item: &Value) -> Option<ChatMessage> {
    if !matches!(item.get("type"), None | Some(Value::Null)) && item.get("type")?.as_str()? != "message" {
        return None;
    }
    let role = item.get("role")?.as_str()?;
    if !["user", "system", "developer", "assistant"].contains(&role) {
        return None;
    }
    let content = match item.get("content")? {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match (part.get("type")?.as_str()?, part.get("text")?.as_str()) {
                ("input_text" | "output_text", Some(text)) => Some(text),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?
            .concat(),
        _ => return None,
    };
    Some(ChatMessage { role: role.into(), content, extra: None })
}

async fn response(state: SharedState, headers: HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let chat = &state.config.chat;
    let ResponsesRequest { sampling, input, messages, reasoning, reasoning_effort, mut template_kwargs } =
        parse_responses_request(body, &chat.default_template_kwargs)?;
    apply_reasoning_effort(
        &mut template_kwargs,
        &parse_json_object(body)?,
        reasoning_effort.as_deref(),
        &chat.reasoning_effort_map,
    );
    let echo = Echo::new(&sampling, &input, reasoning);
    let max_output_tokens = input.max_output_tokens.map(|n| ("max_output_tokens", n));
    let mut common = sampling.check(max_output_tokens)?;
    common.n = 1; // vLLM's Responses API has no `n`: one choice
    check_model(&state, common.model.as_deref())?;
    let prompt = state
        .tokenizer
        .apply_chat_template_with_tools(&messages, true, None, &template_kwargs)
        .map_err(|e| ApiError::invalid_param("input", format!("cannot apply the chat template: {e}")))?;
    let prompt_token_ids = state
        .tokenizer
        .encode(&prompt, false)
        .map_err(|e| ApiError::invalid_param("input", format!("cannot tokenize the input: {e}")))?;
    // vLLM caps max_output_tokens at the room the prompt leaves instead of refusing it.
    let prompt_len = prompt_token_ids.len() as u64;
    if let Some(room) = state.max_model_len.filter(|&max_len| prompt_len < max_len).map(|max_len| max_len - prompt_len)
    {
        let max_tokens = common.sampling.max_tokens.map_or(room, |n| n.min(room));
        common.sampling.max_tokens = Some(max_tokens);
    }
    let max_tokens = common.sampling.max_tokens;
    let stream = common.stream;
    let submitted = submit(&state, &headers, Endpoint::Responses, prompt_token_ids, common)?;
    let answer =
        Answer { echo, max_tokens, id: submitted.id.clone(), created_at: submitted.created, model: model(&state) };
    if stream {
        return Ok(stream_events(submitted, answer));
    }
    let Submitted { mut generation, .. } = submitted;
    let (text, finish) = generation.collect().await.map_err(|e| generation_error(&e))?;
    // Unstreamed, vLLM always answers one message item (empty content when there is no text).
    let output = vec![message_item(&random_item_id(), &text, item_status(&finish))];
    Ok(Json(answer.object(response_status(&finish), output, Some(usage(generation.usage())))).into_response())
}

fn model(state: &AppState) -> String {
    state.config.primary_model_name().to_string()
}

/// The request fields a response object repeats, with vLLM's defaults.
struct Echo {
    instructions: Option<String>,
    metadata: Value,
    temperature: f64,
    top_p: f64,
    presence_penalty: f64,
    frequency_penalty: f64,
    parallel_tool_calls: bool,
    max_tool_calls: Option<i64>,
    service_tier: String,
    truncation: String,
    user: Option<String>,
    prompt_cache_key: Option<String>,
    safety_identifier: Option<String>,
    text: Value,
    reasoning: Value,
}

impl Echo {
    fn new(sampling: &SamplingInput, input: &ResponsesInput, reasoning: Value) -> Self {
        Echo {
            reasoning,
            instructions: input.instructions.clone(),
            metadata: json!(input.metadata),
            temperature: sampling.temperature.unwrap_or(1.0),
            top_p: sampling.top_p.unwrap_or(1.0),
            presence_penalty: sampling.presence_penalty.unwrap_or(0.0),
            frequency_penalty: sampling.frequency_penalty.unwrap_or(0.0),
            parallel_tool_calls: input.parallel_tool_calls.unwrap_or(true),
            max_tool_calls: input.max_tool_calls,
            service_tier: input.service_tier.clone().unwrap_or_else(|| "auto".into()),
            truncation: input.truncation.clone().unwrap_or_else(|| "disabled".into()),
            user: input.user.clone(),
            prompt_cache_key: input.prompt_cache_key.clone(),
            safety_identifier: input.safety_identifier.clone(),
            text: match &input.text {
                Some(TextConfig { format: Some(_) }) => json!({"format": {"type": "text"}}),
                _ => Value::Null,
            },
        }
    }
}

/// What every response object of one request shares.
struct Answer {
    echo: Echo,
    max_tokens: Option<u64>,
    id: String,
    created_at: u64,
    model: String,
}

impl Answer {
    /// The response object with `status`, `output` and `usage`, as vLLM's
    /// `ResponsesResponse.from_request` fills it.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        let e = &self.echo;
        let incomplete_details =
            if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null };
        json!({
            "id": self.id,
            "created_at": self.created_at,
            "incomplete_details": incomplete_details,
            "instructions": e.instructions,
            "metadata": e.metadata,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "temperature": e.temperature,
            "tool_choice": "none",
            "tools": [],
            "top_p": e.top_p,
            "background": false,
            "max_output_tokens": self.max_tokens,
            "max_tool_calls": e.max_tool_calls,
            "previous_response_id": null,
            "prompt": null,
            "prompt_cache_options": null,
            "prompt_cache_key": e.prompt_cache_key,
            "prompt_cache_retention": null,
            "reasoning": e.reasoning,
            "safety_identifier": e.safety_identifier,
            "service_tier": e.service_tier,
            "status": status,
            "text": e.text,
            "top_logprobs": null,
            "truncation": e.truncation,
            "usage": usage,
            "user": e.user,
            "presence_penalty": e.presence_penalty,
            "frequency_penalty": e.frequency_penalty,
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "input_messages": null,
            "output_messages": null,
        })
    }
}

/// The response's status: `incomplete` when the output hit its token limit.
fn response_status(finish: &Finish) -> &'static str {
    if finish.reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

/// The message item's status, by the same rule.
fn item_status(finish: &Finish) -> &'static str {
    response_status(finish)
}

fn random_item_id() -> String {
    format!("msg_{}", random_hex(16))
}

/// An `output_text` content part.
fn text_part(text: &str, logprobs: Value) -> Value {
    json!({"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs})
}

/// The assistant message item holding `text` (no content part when empty, as vLLM).
fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if text.is_empty() { Vec::new() } else { vec![text_part(text, Value::Null)] };
    json!({"id": id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
}

/// The usage object: one turn, nothing cached, no reasoning or tool tokens.
fn usage(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [usage.prompt_tokens],
            "cached_tokens_per_turn": [0],
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [usage.completion_tokens],
            "tool_output_tokens_per_turn": [0],
        },
        "total_tokens": usage.total_tokens,
    })
}

/// The streamed events of one response, numbered as they go out.
struct EventStream {
    generation: Generation,
    answer: Answer,
    /// Events made but not yet sent.
    queue: VecDeque<Bytes>,
    sequence_number: u64,
    /// The message item, once its first text arrived: id and text so far.
    item: Option<(String, String)>,
    done: bool,
}

impl EventStream {
    /// Queues `event` (without its sequence number) as `event: TYPE` / `data: JSON`.
    fn push(&mut self, mut event: Value) {
        event["sequence_number"] = json!(self.sequence_number);
        self.sequence_number += 1;
        let kind = event["type"].as_str().unwrap_or("error").to_string();
        let mut out = format!("event: {kind}\ndata: ").into_bytes();
        serde_json::to_writer(&mut out, &event).expect("serializing an event");
        out.extend_from_slice(b"\n\n");
        self.queue.push_back(Bytes::from(out));
    }

    /// The item's opening events, the first time text arrives.
    fn open_item(&mut self) {
        let id = random_item_id();
        let item = json!({"id": id, "content": [], "role": "assistant", "status": "in_progress", "type": "message", "phase": null});
        self.push(json!({"item": item, "output_index": 0, "type": "response.output_item.added"}));
        self.push(json!({
            "content_index": 0, "item_id": id, "output_index": 0,
            "part": text_part("", json!([])), "type": "response.content_part.added",
        }));
        self.item = Some((id, String::new()));
    }

    fn text_delta(&mut self, delta: &str) {
        if self.item.is_none() {
            self.open_item();
        }
        let (id, text) = self.item.as_mut().expect("opened above");
        text.push_str(delta);
        let id = id.clone();
        self.push(json!({
            "content_index": 0, "delta": delta, "item_id": id, "logprobs": [],
            "output_index": 0, "type": "response.output_text.delta",
        }));
    }

    /// The item's closing events and the terminal event.
    fn finish(&mut self, finish: &Finish) {
        let mut output = Vec::new();
        if let Some((id, text)) = self.item.take() {
            self.push(json!({
                "content_index": 0, "item_id": id, "logprobs": [], "output_index": 0,
                "text": text, "type": "response.output_text.done",
            }));
            self.push(json!({
                "content_index": 0, "item_id": id, "output_index": 0,
                "part": text_part(&text, Value::Null), "type": "response.content_part.done",
            }));
            let item = message_item(&id, &text, item_status(finish));
            self.push(json!({"item": item, "output_index": 0, "type": "response.output_item.done"}));
            output.push(item);
        }
        let status = response_status(finish);
        let response = self.answer.object(status, output, Some(usage(self.generation.usage())));
        let kind = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.push(json!({"response": response, "type": kind}));
    }

    /// Advances the generation until there is an event to send; false at the end.
    async fn fill(&mut self) -> bool {
        while self.queue.is_empty() && !self.done {
            match self.generation.next_delta().await {
                Some(Ok(delta)) => {
                    if !delta.text.is_empty() {
                        self.text_delta(&delta.text);
                    }
                    if let Some(finish) = &delta.finish {
                        self.finish(finish);
                        self.done = true;
                    }
                }
                Some(Err(error)) => {
                    let error = generation_error(&error);
                    self.push(json!({
                        "code": error.status.as_u16().to_string(), "message": error.message,
                        "param": error.param, "type": "error",
                    }));
                    self.done = true;
                }
                None => self.done = true,
            }
        }
        !self.queue.is_empty()
    }
}

/// The `text/event-stream` answer. Dropping the body (client gone) drops
/// the generation, which aborts the request.
fn stream_events(submitted: Submitted, answer: Answer) -> Response {
    let mut events = EventStream {
        generation: submitted.generation,
        answer,
        queue: VecDeque::new(),
        sequence_number: 0,
        item: None,
        done: false,
    };
    let opening = events.answer.object("in_progress", Vec::new(), None);
    events.push(json!({"response": opening, "type": "response.created"}));
    events.push(json!({"response": opening, "type": "response.in_progress"}));
    let body = stream::unfold(events, |mut events| async move {
        if events.fill().await {
            let event = events.queue.pop_front().expect("fill left an event");
            Some((Ok::<Bytes, Infallible>(event), events))
        } else {
            None
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &Value) -> Result<ResponsesRequest, ApiError> {
        parse_responses_request(body.to_string().as_bytes(), &serde_json::Map::new())
    }

    fn refusal(body: Value) -> (Option<String>, String) {
        match parse(&body) {
            Ok(_) => panic!("{body} was accepted"),
            Err(e) => (e.param, e.message),
        }
    }

    #[test]
    fn input_becomes_messages_after_the_instructions() {
        let body = json!({
            "instructions": "sys",
            "input": [
                {"role": "user", "content": "a"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
                {"role": "developer", "content": [{"type": "input_text", "text": "c"}, {"type": "input_text", "text": "d"}]},
            ],
        });
        let request = parse(&body).unwrap();
        let roles: Vec<_> = request.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
        assert_eq!(roles, [("system", "sys"), ("user", "a"), ("assistant", "b"), ("developer", "cd")]);
        let request = parse(&json!({"input": "hi"})).unwrap();
        assert_eq!((request.messages[0].role.as_str(), request.messages[0].content.as_str()), ("user", "hi"));
    }

    #[test]
    fn reasoning_is_repeated_whole_and_its_effort_read() {
        let request = parse(&json!({"input": "x", "reasoning": {"effort": "low", "summary": "auto", "x": 1}})).unwrap();
        let expected =
            json!({"context": null, "effort": "low", "generate_summary": null, "mode": null, "summary": "auto"});
        assert_eq!(request.reasoning, expected);
        assert_eq!(request.reasoning_effort.as_deref(), Some("low"));
        let request = parse(&json!({"input": "x", "reasoning": null})).unwrap();
        assert_eq!((request.reasoning, request.reasoning_effort), (Value::Null, None));
        let request = parse(&json!({"input": "x", "reasoning": {}})).unwrap();
        assert_eq!(request.reasoning_effort, None);
    }

    #[test]
    fn template_kwargs_merge_over_the_server_defaults() {
        let defaults = json!({"style": "server", "enable_thinking": false}).as_object().cloned().unwrap();
        let body = json!({"input": "x", "chat_template_kwargs": {"enable_thinking": true, "style": null}});
        let request = parse_responses_request(body.to_string().as_bytes(), &defaults).unwrap();
        assert_eq!(Value::Object(request.template_kwargs), json!({"style": "server", "enable_thinking": true}));
    }

    #[test]
    fn what_is_not_supported_is_refused_naming_the_field() {
        for (body, param) in [
            (json!({"input": "x", "tools": [{"type": "function"}]}), "tools"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "previous_response_id": "resp_1"}), "response_id"),
            (json!({"input": "x", "reasoning": "high"}), "reasoning"),
            (json!({"input": "x", "reasoning": {"effort": "extreme"}}), "reasoning.effort"),
            (json!({"input": "x", "reasoning": {"summary": "long"}}), "reasoning.summary"),
            (json!({"input": "x", "reasoning": {"mode": 1}}), "reasoning.mode"),
            (json!({"input": "x", "chat_template_kwargs": {"tokenize": true}}), "chat_template_kwargs"),
            (json!({"input": "x", "chat_template_kwargs": [1]}), "chat_template_kwargs"),
            (json!({"input": "x", "include": ["reasoning.encrypted_content"]}), "include"),
            (json!({"input": "x", "text": {"format": {"type": "json_schema"}}}), "text"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (json!({"input": "x", "tool_choice": {"type": "function"}}), "tool_choice"),
            (json!({"input": [{"type": "reasoning"}]}), "input"),
            (json!({"input": [{"role": "tool", "content": "x"}]}), "input"),
            (json!({"input": 3}), "input"),
            (json!({"input": "x", "metadata": {"a": 1}}), "metadata"),
            (json!({}), "input"),
        ] {
            assert_eq!(refusal(body.clone()).0.as_deref(), Some(param), "{body}");
        }
        let (_, message) = refusal(json!({"input": [{"role": "user", "content": "a"}, {"type": "function_call"}]}));
        assert!(message.starts_with("input[1]"), "{message}");
    }
}
