//! A checked `/v1/responses` request to the engine's prompt, and the
//! engine's output to the response object or its stream of typed events.

use super::types::{
    Answer, Echo, ErrorEvent, Event, IncompleteDetails, InputTokensDetails, ItemEvent, MessageItem,
    OutputTokensDetails, OutputType, PartEvent, ReasoningEcho, ResponseEvent, ResponseObject, ResponseUsage,
    ResponsesBody, ResponsesRequest, TextConfig, TextDeltaEvent, TextDoneEvent, TextEcho, TextPart,
};
use super::validate::parse_responses_request;
use crate::http::error::ApiError;
use crate::http::generation::failure::generation_error;
use crate::http::generation::submit::{check_generates, check_model, Endpoint, Submitted};
use crate::http::generation::template_kwargs::apply_reasoning_effort;
use crate::http::sampling::{CommonParams, SamplingFields};
use crate::http::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::stream;
use serde::Serialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use vllm_rs_engine::ids::random_hex;
use vllm_rs_generate::{Finish, Generation, Usage};
use vllm_rs_wire::protocol::FinishReason;

/// A Responses body checked, its prompt rendered and tokenized, with
/// `max_tokens` capped as vLLM caps `max_output_tokens`.
pub(super) fn prepare(state: &AppState, body: ResponsesBody) -> Result<(CommonParams, Vec<u32>, Echo), ApiError> {
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

pub(super) fn model(state: &AppState) -> String {
    state.config.primary_model_name().to_string()
}

impl Echo {
    pub(super) fn new(sampling: &SamplingFields, input: &ResponsesBody, reasoning: Option<ReasoningEcho>) -> Self {
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

impl Answer {
    /// The response object with `status`, `output` and `usage`, as vLLM's
    /// `ResponsesResponse.from_request` fills it.
    pub(super) fn object(
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
pub(super) fn response_status(finish: &Finish) -> &'static str {
    if finish.reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

/// The message item's status, by the same rule.
pub(super) fn item_status(finish: &Finish) -> &'static str {
    response_status(finish)
}

pub(super) fn random_item_id() -> String {
    format!("msg_{}", random_hex(16))
}

/// The assistant message item holding `text` (no content part when empty, as vLLM).
pub(super) fn message_item(id: &str, text: &str, status: &'static str) -> MessageItem {
    let content = if text.is_empty() { Vec::new() } else { vec![TextPart::new(text, None)] };
    MessageItem { id: id.to_owned(), content, role: "assistant", status, kind: "message", phase: () }
}

pub(super) fn usage(usage: Usage) -> ResponseUsage {
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
pub(super) fn stream_events(submitted: Submitted, answer: Answer) -> Response {
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
