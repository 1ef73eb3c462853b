//! `POST /v1/responses`, as vLLM 0.33 serves it without a response store:
//! text or message input, one assistant message of text out, unstreamed (the
//! response object) or streamed as vLLM's typed events (`response.created`
//! ... `response.completed`). `chat_template_kwargs` and `reasoning.effort`
//! reach the chat template as in chat completions. What this server does not
//! do (tools, background mode, stored responses, structured output) is a 400
//! naming the field, never dropped.

pub mod stored;

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::failure::generation_error;
use crate::http::generation::submit::{check_generates, check_model, submit, Endpoint, Submitted};
use crate::http::generation::template_kwargs::{apply_reasoning_effort, read_reasoning_effort, read_template_kwargs};
use crate::http::rules::RULES;
use crate::http::sampling::{CommonParams, SamplingFields, SamplingRequest};
use crate::http::state::{AppState, SharedState};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
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
    JsonRequest(body): JsonRequest<ResponsesBody>,
) -> Response {
    match response(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A `/v1/responses` body as sent: the shared sampling fields and [`ResponsesFields`].
pub type ResponsesBody = SamplingRequest<ResponsesFields>;

/// The fields of a `/v1/responses` body its own, as sent (the sampling fields aside).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ResponsesFields {
    /// Text, or a list of input items.
    pub input: Option<Value>,
    /// The system message.
    pub instructions: Option<String>,
    /// The token limit.
    pub max_output_tokens: Option<i64>,
    /// Refused when not empty.
    pub tools: Option<Vec<IgnoredAny>>,
    /// Only `auto` or `none` (there are no tools).
    pub tool_choice: Option<Value>,
    /// Refused: there is no response store.
    pub background: Option<bool>,
    /// Read with `background`.
    pub store: Option<bool>,
    /// Not found: there is no response store.
    pub previous_response_id: Option<String>,
    /// Refused when it names anything.
    pub include: Option<Vec<String>>,
    /// Only the `text` format.
    pub text: Option<TextConfig>,
    /// `disabled`, or refused `auto`.
    pub truncation: Option<String>,
    /// Repeated in the response object.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Repeated in the response object.
    pub user: Option<String>,
    /// Repeated in the response object.
    pub parallel_tool_calls: Option<bool>,
    /// Repeated in the response object.
    pub max_tool_calls: Option<i64>,
    /// Repeated in the response object.
    pub service_tier: Option<String>,
    /// Repeated in the response object.
    pub prompt_cache_key: Option<String>,
    /// Repeated in the response object.
    pub safety_identifier: Option<String>,
    /// Refused when true.
    pub enable_response_messages: Option<bool>,
    /// Checked and repeated; its `effort` reaches the template.
    pub reasoning: Option<Value>,
    /// Variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Refused when present and non-null (see `unsupported`).
    pub prompt: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub previous_input_messages: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub structured_outputs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub kv_transfer_params: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub vllm_xargs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub mm_processor_kwargs: Option<IgnoredAny>,
    /// Refused when present and non-null.
    pub media_io_kwargs: Option<IgnoredAny>,
}

/// `text`: only its format matters.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TextConfig {
    format: Option<TextFormat>,
}

/// `text.format`: only its type matters.
#[derive(Debug, Deserialize)]
struct TextFormat {
    #[serde(rename = "type")]
    kind: String,
}

/// A responses request whose parameters are all read and checked.
struct ResponsesRequest {
    sampling: SamplingFields,
    input: ResponsesBody,
    messages: Vec<ChatMessage>,
    /// `reasoning` as the response object repeats it (null when not given).
    reasoning: Option<ReasoningEcho>,
    /// The requested `reasoning.effort`, before the server's map.
    reasoning_effort: Option<String>,
    /// The template kwargs: the server's defaults, the request's own, its effort.
    template_kwargs: Map<String, Value>,
}

/// The values `reasoning.summary` and `reasoning.generate_summary` may take.
const SUMMARIES: [&str; 3] = ["auto", "concise", "detailed"];

/// `reasoning` as vLLM's response object repeats it: every field of
/// OpenAI's `Reasoning`, null when not given, in vLLM's order.
#[derive(Debug, Default, PartialEq, Serialize)]
struct ReasoningEcho {
    context: Option<String>,
    effort: Option<String>,
    generate_summary: Option<String>,
    mode: Option<String>,
    summary: Option<String>,
}

/// `reasoning` checked as OpenAI's `Reasoning` model reads it, and written
/// back as vLLM's response object repeats it; a 400 naming the first bad
/// field. vLLM acts on `effort` only.
fn read_reasoning(value: Option<&Value>) -> Result<(Option<ReasoningEcho>, Option<String>), ApiError> {
    let fields = match value {
        None | Some(Value::Null) => return Ok((None, None)),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(RULES.wrong_type("reasoning")),
    };
    // The values a field may take (`None`: any string).
    let field = |name: &str, allowed: Option<&[&str]>| match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if allowed.is_none_or(|allowed| allowed.contains(&text.as_str())) => {
            Ok(Some(text.clone()))
        }
        Some(_) => Err(RULES.wrong_type(&format!("reasoning.{name}"))),
    };
    let echoed = ReasoningEcho {
        context: field("context", Some(&["auto", "current_turn", "all_turns"]))?,
        effort: field("effort", Some(&REASONING_EFFORTS))?,
        generate_summary: field("generate_summary", Some(&SUMMARIES))?,
        mode: field("mode", None)?,
        summary: field("summary", Some(&SUMMARIES))?,
    };
    let effort = read_reasoning_effort(fields.get("effort"), "reasoning.effort")?;
    Ok((Some(echoed), effort))
}

/// Reads and checks every parameter, or a 4xx naming the first bad one;
/// `default_kwargs` are the server's `default_chat_template_kwargs`.
fn parse_responses_request(
    mut input: ResponsesBody,
    default_kwargs: &Map<String, Value>,
) -> Result<ResponsesRequest, ApiError> {
    let sampling = std::mem::take(&mut input.sampling);
    if input.route.prompt.is_some() {
        return Err(RULES.refuse("prompt", "prompt_template_unsupported", &[]));
    }
    if input.route.background == Some(true) {
        let key = if input.route.store == Some(false) { "background_store_false" } else { "background_without_store" };
        return Err(RULES.refuse("background", key, &[]));
    }
    if let Some(id) = &input.route.previous_response_id {
        // vLLM without its response store finds no earlier response.
        return Err(ApiError::response_not_found(RULES.message("response_not_found", &[("response_id", id)])));
    }
    let unsupported = [
        ("tools", input.route.tools.as_ref().is_some_and(|tools| !tools.is_empty())),
        ("previous_input_messages", input.route.previous_input_messages.is_some()),
        ("structured_outputs", input.route.structured_outputs.is_some()),
        ("kv_transfer_params", input.route.kv_transfer_params.is_some()),
        ("vllm_xargs", input.route.vllm_xargs.is_some()),
        ("mm_processor_kwargs", input.route.mm_processor_kwargs.is_some()),
        ("media_io_kwargs", input.route.media_io_kwargs.is_some()),
        ("include_stop_str_in_output", sampling.include_stop_str_in_output == Some(true)),
        ("return_token_ids", sampling.return_token_ids == Some(true)),
        ("enable_response_messages", input.route.enable_response_messages == Some(true)),
    ];
    if let Some((param, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(RULES.refuse(param, "field_unsupported", &[("param", param)]));
    }
    match &input.route.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(choice)) if choice == "auto" || choice == "none" => {}
        Some(Value::String(choice)) => {
            return Err(RULES.refuse("tool_choice", "tool_choice_without_tools", &[("tool_choice", choice)]))
        }
        Some(_) => return Err(RULES.refuse("tool_choice", "field_unsupported", &[("param", "tool_choice")])),
    }
    if let Some(value) = input.route.include.iter().flatten().next() {
        return Err(RULES.refuse("include", "include_unsupported", &[("value", &format!("{value:?}"))]));
    }
    if input.route.text.as_ref().and_then(|text| text.format.as_ref()).is_some_and(|format| format.kind != "text") {
        return Err(RULES.refuse("text", "text_format_unsupported", &[]));
    }
    match input.route.truncation.as_deref() {
        None | Some("disabled") => {}
        Some("auto") => return Err(RULES.refuse("truncation", "truncation_unsupported", &[])),
        Some(_) => return Err(RULES.wrong_type("truncation")),
    }
    let messages = input_messages(input.route.instructions.as_deref(), input.route.input.as_ref())?;
    let (reasoning, reasoning_effort) = read_reasoning(input.route.reasoning.as_ref())?;
    let template_kwargs = read_template_kwargs(input.route.chat_template_kwargs.as_ref(), default_kwargs)?;
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

/// A Responses body checked, its prompt rendered and tokenized, with
/// `max_tokens` capped as vLLM caps `max_output_tokens`.
fn prepare(state: &AppState, body: ResponsesBody) -> Result<(CommonParams, Vec<u32>, Echo), ApiError> {
    let chat = &state.config.chat;
    let ResponsesRequest { sampling, input, messages, reasoning, reasoning_effort, mut template_kwargs } =
        parse_responses_request(body, &chat.default_template_kwargs)?;
    apply_reasoning_effort(
        &mut template_kwargs,
        input.route.chat_template_kwargs.as_ref(),
        reasoning_effort.as_deref(),
        &chat.reasoning_effort_map,
    );
    let echo = Echo::new(&sampling, &input, reasoning);
    let max_output_tokens = input.route.max_output_tokens.map(|n| ("max_output_tokens", n));
    let mut common = sampling.check(max_output_tokens)?;
    common.n = 1; // vLLM's Responses API has no `n`: one choice
    check_model(state, common.model.as_deref())?;
    check_generates(state, Endpoint::Responses)?;
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
    Ok((common, prompt_token_ids, echo))
}

/// What `/v1/responses/render` shows of a Responses body: its checked
/// parameters and its prompt's token ids, exactly as `/v1/responses` runs it.
pub(crate) fn render_response(state: &AppState, body: ResponsesBody) -> Result<(CommonParams, Vec<u32>), ApiError> {
    prepare(state, body).map(|(common, prompt_token_ids, _)| (common, prompt_token_ids))
}

async fn response(state: SharedState, headers: HeaderMap, body: ResponsesBody) -> Result<Response, ApiError> {
    let (common, prompt_token_ids, echo) = prepare(&state, body)?;
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
    metadata: Option<BTreeMap<String, String>>,
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
    /// `text`, repeated as `{"format": {"type": "text"}}` when it had a format.
    text: Option<TextEcho>,
    reasoning: Option<ReasoningEcho>,
}

impl Echo {
    fn new(sampling: &SamplingFields, input: &ResponsesBody, reasoning: Option<ReasoningEcho>) -> Self {
        Echo {
            reasoning,
            instructions: input.route.instructions.clone(),
            metadata: input.route.metadata.clone(),
            temperature: sampling.temperature.unwrap_or(1.0),
            top_p: sampling.top_p.unwrap_or(1.0),
            presence_penalty: sampling.presence_penalty.unwrap_or(0.0),
            frequency_penalty: sampling.frequency_penalty.unwrap_or(0.0),
            parallel_tool_calls: input.route.parallel_tool_calls.unwrap_or(true),
            max_tool_calls: input.route.max_tool_calls,
            service_tier: input.route.service_tier.clone().unwrap_or_else(|| "auto".into()),
            truncation: input.route.truncation.clone().unwrap_or_else(|| "disabled".into()),
            user: input.route.user.clone(),
            prompt_cache_key: input.route.prompt_cache_key.clone(),
            safety_identifier: input.route.safety_identifier.clone(),
            text: match &input.route.text {
                Some(TextConfig { format: Some(_) }) => Some(TextEcho { format: OutputType { kind: "text" } }),
                _ => None,
            },
        }
    }
}

/// `text` as a response object repeats it.
#[derive(Serialize)]
struct TextEcho {
    format: OutputType,
}

/// An object that is only its `type`.
#[derive(Serialize)]
struct OutputType {
    #[serde(rename = "type")]
    kind: &'static str,
}

/// What every response object of one request shares.
struct Answer {
    echo: Echo,
    max_tokens: Option<u64>,
    id: String,
    created_at: u64,
    model: String,
}

/// vLLM's `ResponsesResponse` as it writes it: the fields it sets, in its
/// order; `()` is a field vLLM always writes as null here.
#[derive(Serialize)]
struct ResponseObject<'a> {
    id: &'a str,
    created_at: u64,
    incomplete_details: Option<IncompleteDetails>,
    instructions: Option<&'a str>,
    metadata: Option<&'a BTreeMap<String, String>>,
    model: &'a str,
    object: &'static str,
    output: Vec<MessageItem>,
    parallel_tool_calls: bool,
    temperature: f64,
    tool_choice: &'static str,
    tools: [(); 0],
    top_p: f64,
    background: bool,
    max_output_tokens: Option<u64>,
    max_tool_calls: Option<i64>,
    previous_response_id: (),
    prompt: (),
    prompt_cache_options: (),
    prompt_cache_key: Option<&'a str>,
    prompt_cache_retention: (),
    reasoning: Option<&'a ReasoningEcho>,
    safety_identifier: Option<&'a str>,
    service_tier: &'a str,
    status: &'static str,
    text: Option<&'a TextEcho>,
    top_logprobs: (),
    truncation: &'a str,
    usage: Option<ResponseUsage>,
    user: Option<&'a str>,
    presence_penalty: f64,
    frequency_penalty: f64,
    kv_transfer_params: (),
    ec_transfer_params: (),
    input_messages: (),
    output_messages: (),
}

/// Why a response is incomplete (only its token limit here).
#[derive(Serialize)]
struct IncompleteDetails {
    reason: &'static str,
}

impl Answer {
    /// The response object with `status`, `output` and `usage`, as vLLM's
    /// `ResponsesResponse.from_request` fills it.
    fn object(
        &self,
        status: &'static str,
        output: Vec<MessageItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject<'_> {
        let e = &self.echo;
        ResponseObject {
            id: &self.id,
            created_at: self.created_at,
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails { reason: "max_output_tokens" }),
            instructions: e.instructions.as_deref(),
            metadata: e.metadata.as_ref(),
            model: &self.model,
            object: "response",
            output,
            parallel_tool_calls: e.parallel_tool_calls,
            temperature: e.temperature,
            tool_choice: "none",
            tools: [],
            top_p: e.top_p,
            background: false,
            max_output_tokens: self.max_tokens,
            max_tool_calls: e.max_tool_calls,
            previous_response_id: (),
            prompt: (),
            prompt_cache_options: (),
            prompt_cache_key: e.prompt_cache_key.as_deref(),
            prompt_cache_retention: (),
            reasoning: e.reasoning.as_ref(),
            safety_identifier: e.safety_identifier.as_deref(),
            service_tier: &e.service_tier,
            status,
            text: e.text.as_ref(),
            top_logprobs: (),
            truncation: &e.truncation,
            usage,
            user: e.user.as_deref(),
            presence_penalty: e.presence_penalty,
            frequency_penalty: e.frequency_penalty,
            kv_transfer_params: (),
            ec_transfer_params: (),
            input_messages: (),
            output_messages: (),
        }
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
#[derive(Clone, Serialize)]
struct TextPart {
    annotations: [(); 0],
    text: String,
    #[serde(rename = "type")]
    kind: &'static str,
    /// `[]` while streaming, null in the finished part.
    logprobs: Option<[(); 0]>,
}

impl TextPart {
    fn new(text: &str, logprobs: Option<[(); 0]>) -> Self {
        TextPart { annotations: [], text: text.to_owned(), kind: "output_text", logprobs }
    }
}

/// The assistant message item.
#[derive(Clone, Serialize)]
struct MessageItem {
    id: String,
    content: Vec<TextPart>,
    role: &'static str,
    status: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    phase: (),
}

/// The assistant message item holding `text` (no content part when empty, as vLLM).
fn message_item(id: &str, text: &str, status: &'static str) -> MessageItem {
    let content = if text.is_empty() { Vec::new() } else { vec![TextPart::new(text, None)] };
    MessageItem { id: id.to_owned(), content, role: "assistant", status, kind: "message", phase: () }
}

/// The usage object: one turn, nothing cached, no reasoning or tool tokens.
#[derive(Serialize)]
struct ResponseUsage {
    input_tokens: usize,
    input_tokens_details: InputTokensDetails,
    output_tokens: usize,
    output_tokens_details: OutputTokensDetails,
    total_tokens: usize,
}

#[derive(Serialize)]
struct InputTokensDetails {
    cached_tokens: usize,
    cache_write_tokens: usize,
    input_tokens_per_turn: [usize; 1],
    cached_tokens_per_turn: [usize; 1],
}

#[derive(Serialize)]
struct OutputTokensDetails {
    reasoning_tokens: usize,
    tool_output_tokens: usize,
    output_tokens_per_turn: [usize; 1],
    tool_output_tokens_per_turn: [usize; 1],
}

fn usage(usage: Usage) -> ResponseUsage {
    ResponseUsage {
        input_tokens: usage.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: 0,
            cache_write_tokens: 0,
            input_tokens_per_turn: [usage.prompt_tokens],
            cached_tokens_per_turn: [0],
        },
        output_tokens: usage.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: 0,
            tool_output_tokens: 0,
            output_tokens_per_turn: [usage.completion_tokens],
            tool_output_tokens_per_turn: [0],
        },
        total_tokens: usage.total_tokens,
    }
}

/// One streamed event: its fields, then `type` and `sequence_number` (the
/// order vLLM writes them in).
#[derive(Serialize)]
struct Event<'a, B> {
    #[serde(flatten)]
    body: B,
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
}

/// `response.output_item.added` / `.done`.
#[derive(Serialize)]
struct ItemEvent<'a> {
    item: &'a MessageItem,
    output_index: u32,
}

/// `response.content_part.added` / `.done`.
#[derive(Serialize)]
struct PartEvent<'a> {
    content_index: u32,
    item_id: &'a str,
    output_index: u32,
    part: TextPart,
}

/// `response.output_text.delta`.
#[derive(Serialize)]
struct TextDeltaEvent<'a> {
    content_index: u32,
    delta: &'a str,
    item_id: &'a str,
    logprobs: [(); 0],
    output_index: u32,
}

/// `response.output_text.done`.
#[derive(Serialize)]
struct TextDoneEvent<'a> {
    content_index: u32,
    item_id: &'a str,
    logprobs: [(); 0],
    output_index: u32,
    text: &'a str,
}

/// `response.created`, `.in_progress`, `.completed`, `.incomplete`.
#[derive(Serialize)]
struct ResponseEvent<'a> {
    response: &'a ResponseObject<'a>,
}

/// `error`: a generation that failed mid-stream.
#[derive(Serialize)]
struct ErrorEvent<'a> {
    code: String,
    message: &'a str,
    param: Option<&'a str>,
}

/// Events made but not yet sent, numbered as they are made.
#[derive(Default)]
struct EventQueue {
    queue: VecDeque<Bytes>,
    sequence_number: u64,
}

impl EventQueue {
    /// Queues `body` as `event: KIND` / `data: JSON`, numbered.
    fn push<B: Serialize>(&mut self, kind: &str, body: B) {
        let event = Event { body, kind, sequence_number: self.sequence_number };
        self.sequence_number += 1;
        let mut out = format!("event: {kind}\ndata: ").into_bytes();
        serde_json::to_writer(&mut out, &event).expect("serializing an event");
        out.extend_from_slice(b"\n\n");
        self.queue.push_back(Bytes::from(out));
    }
}

/// The streamed events of one response.
struct EventStream {
    generation: Generation,
    answer: Answer,
    events: EventQueue,
    /// The message item, once its first text arrived: id and text so far.
    item: Option<(String, String)>,
    done: bool,
}

impl EventStream {
    /// The item's opening events, the first time text arrives.
    fn open_item(&mut self) {
        let id = random_item_id();
        let item = message_item(&id, "", "in_progress");
        self.events.push("response.output_item.added", ItemEvent { item: &item, output_index: 0 });
        let part = TextPart::new("", Some([]));
        self.events
            .push("response.content_part.added", PartEvent { content_index: 0, item_id: &id, output_index: 0, part });
        self.item = Some((id, String::new()));
    }

    fn text_delta(&mut self, delta: &str) {
        if self.item.is_none() {
            self.open_item();
        }
        let (id, text) = self.item.as_mut().expect("opened above");
        text.push_str(delta);
        let event = TextDeltaEvent { content_index: 0, delta, item_id: id, logprobs: [], output_index: 0 };
        self.events.push("response.output_text.delta", event);
    }

    /// The item's closing events and the terminal event.
    fn finish(&mut self, finish: &Finish) {
        let mut output = Vec::new();
        if let Some((id, text)) = self.item.take() {
            let done = TextDoneEvent { content_index: 0, item_id: &id, logprobs: [], output_index: 0, text: &text };
            self.events.push("response.output_text.done", done);
            let part = TextPart::new(&text, None);
            self.events.push(
                "response.content_part.done",
                PartEvent { content_index: 0, item_id: &id, output_index: 0, part },
            );
            let item = message_item(&id, &text, item_status(finish));
            self.events.push("response.output_item.done", ItemEvent { item: &item, output_index: 0 });
            output.push(item);
        }
        let status = response_status(finish);
        let response = self.answer.object(status, output, Some(usage(self.generation.usage())));
        let kind = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.events.push(kind, ResponseEvent { response: &response });
    }

    /// Advances the generation until there is an event to send; false at the end.
    async fn fill(&mut self) -> bool {
        while self.events.queue.is_empty() && !self.done {
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
                    let event = ErrorEvent {
                        code: error.status.as_u16().to_string(),
                        message: &error.message,
                        param: error.param.as_deref(),
                    };
                    self.events.push("error", event);
                    self.done = true;
                }
                None => self.done = true,
            }
        }
        !self.events.queue.is_empty()
    }
}

/// The `text/event-stream` answer. Dropping the body (client gone) drops
/// the generation, which aborts the request.
fn stream_events(submitted: Submitted, answer: Answer) -> Response {
    let mut events = EventQueue::default();
    let opening = answer.object("in_progress", Vec::new(), None);
    events.push("response.created", ResponseEvent { response: &opening });
    events.push("response.in_progress", ResponseEvent { response: &opening });
    let events = EventStream { generation: submitted.generation, answer, events, item: None, done: false };
    let body = stream::unfold(events, |mut events| async move {
        if events.fill().await {
            let event = events.events.queue.pop_front().expect("fill left an event");
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
    use crate::http::body::parse_body;
    use serde_json::json;

    fn parse(body: &Value) -> Result<ResponsesRequest, ApiError> {
        parse_responses_request(parse_body(body.to_string().as_bytes())?, &Map::new())
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
        assert_eq!(serde_json::to_value(&request.reasoning).unwrap(), expected);
        assert_eq!(request.reasoning_effort.as_deref(), Some("low"));
        let request = parse(&json!({"input": "x", "reasoning": null})).unwrap();
        assert_eq!((request.reasoning, request.reasoning_effort), (None, None));
        let request = parse(&json!({"input": "x", "reasoning": {}})).unwrap();
        assert_eq!(request.reasoning_effort, None);
    }

    #[test]
    fn template_kwargs_merge_over_the_server_defaults() {
        let defaults = json!({"style": "server", "enable_thinking": false}).as_object().cloned().unwrap();
        let body = json!({"input": "x", "chat_template_kwargs": {"enable_thinking": true, "style": null}});
        let request = parse_responses_request(parse_body(body.to_string().as_bytes()).unwrap(), &defaults).unwrap();
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

    #[test]
    fn events_and_objects_keep_vllms_key_order() {
        let mut events = EventQueue::default();
        let item = message_item("msg_1", "hi", "completed");
        events.push("response.output_item.done", ItemEvent { item: &item, output_index: 0 });
        let part = TextPart::new("", Some([]));
        events.push(
            "response.content_part.added",
            PartEvent { content_index: 0, item_id: "msg_1", output_index: 0, part },
        );
        let sent: Vec<String> = events.queue.iter().map(|b| String::from_utf8(b.to_vec()).unwrap()).collect();
        assert_eq!(
            sent[0],
            "event: response.output_item.done\ndata: {\"item\":{\"id\":\"msg_1\",\"content\":[{\"annotations\":[],\"text\":\"hi\",\"type\":\"output_text\",\"logprobs\":null}],\"role\":\"assistant\",\"status\":\"completed\",\"type\":\"message\",\"phase\":null},\"output_index\":0,\"type\":\"response.output_item.done\",\"sequence_number\":0}\n\n"
        );
        assert!(sent[1].contains("\"part\":{\"annotations\":[],\"text\":\"\",\"type\":\"output_text\",\"logprobs\":[]},\"type\":\"response.content_part.added\",\"sequence_number\":1}"), "{}", sent[1]);
        let usage = serde_json::to_string(&usage(Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            total_tokens: 5,
            ..Usage::default()
        }))
        .unwrap();
        assert_eq!(
            usage,
            r#"{"input_tokens":3,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0,"input_tokens_per_turn":[3],"cached_tokens_per_turn":[0]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[2],"tool_output_tokens_per_turn":[0]},"total_tokens":5}"#
        );
    }
}
