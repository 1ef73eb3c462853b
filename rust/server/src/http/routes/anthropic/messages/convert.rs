//! A checked Messages request as the chat pipeline's request, and the chat
//! pipeline's whole answer as a Messages answer, as vLLM 0.33 converts them
//! (`vllm/entrypoints/anthropic/serving.py`): the system prompt (a string,
//! text blocks, and `system` messages) becomes one system message; text
//! blocks the content; `thinking` blocks the assistant's `reasoning`;
//! `tool_use` blocks its `tool_calls`; each `tool_result` a `tool` message; `stop_sequences`
//! becomes `stop`, `tool_choice` `any` becomes `required`.

use super::types::{
    BlockIn, CountTokensBody, MessagesBody, MessagesResponse, MessagesUsage, TextOrBlocks, ThinkingIn, ToolChoiceIn,
    ToolIn,
};
use super::validate::normalized_role;
use crate::http::body::parse_body;
use crate::http::error::ApiError;
use crate::http::routes::openai::chat_completions::types::ChatBody;
use serde_json::{json, Map, Value};
use vllm_rs_engine::ids::random_hex;

/// Claude Code puts a per-request hash in a system block that starts so;
/// vLLM drops that block, which would defeat prefix caching.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The chat body of a checked `/v1/messages` body.
pub fn chat_body(body: MessagesBody) -> Result<ChatBody, ApiError> {
    let mut chat = conversation(body.system.as_ref(), body.messages.unwrap_or_default());
    let put = |chat: &mut Map<String, Value>, key: &str, value: Value| {
        if !value.is_null() {
            chat.insert(key.to_owned(), value);
        }
    };
    put(&mut chat, "model", json!(body.model));
    put(&mut chat, "max_tokens", json!(body.max_tokens));
    put(&mut chat, "stop", json!(body.stop_sequences));
    put(&mut chat, "temperature", json!(body.temperature));
    put(&mut chat, "top_p", json!(body.top_p));
    put(&mut chat, "top_k", json!(body.top_k));
    if body.stream == Some(true) {
        chat.insert("stream".into(), json!(true));
        // The prompt's count opens the stream (message_start), the final count ends it (message_delta).
        chat.insert("stream_options".into(), json!({"include_usage": true, "continuous_usage_stats": true}));
    }
    if let Some(config) = body.output_config {
        put(&mut chat, "reasoning_effort", json!(config.effort));
        if let Some(format) = config.format {
            let schema = format.get("schema").cloned().unwrap_or(Value::Null);
            let format = json!({"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}});
            chat.insert("response_format".into(), format);
        }
    }
    tools_and_template(&mut chat, body.tools, body.tool_choice, body.thinking, body.chat_template_kwargs);
    parse_body(&serde_json::to_vec(&chat).expect("a JSON object serializes"))
}

/// The chat body whose prompt a `/v1/messages/count_tokens` body counts.
pub fn count_chat_body(body: CountTokensBody) -> Result<ChatBody, ApiError> {
    let mut chat = conversation(body.system.as_ref(), body.messages.unwrap_or_default());
    if let Some(model) = body.model {
        chat.insert("model".into(), json!(model));
    }
    tools_and_template(&mut chat, body.tools, body.tool_choice, body.thinking, body.chat_template_kwargs);
    parse_body(&serde_json::to_vec(&chat).expect("a JSON object serializes"))
}

/// `tools`, `tool_choice`, `parallel_tool_calls` and the template's variables
/// (`thinking` sets `enable_thinking` unless the request's kwargs do).
fn tools_and_template(
    chat: &mut Map<String, Value>,
    tools: Option<Vec<ToolIn>>,
    choice: Option<ToolChoiceIn>,
    thinking: Option<ThinkingIn>,
    kwargs: Option<Map<String, Value>>,
) {
    if let Some(choice) = &choice {
        let converted = match choice.kind.as_deref() {
            Some("any") => json!("required"),
            Some("tool") => json!({"type": "function", "function": {"name": choice.name}}),
            other => json!(other),
        };
        chat.insert("tool_choice".into(), converted);
        if choice.disable_parallel_tool_use == Some(true) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(tools) = tools {
        let tools: Vec<Value> = tools.into_iter().map(chat_tool).collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    let mut kwargs = kwargs.unwrap_or_default();
    if let Some(kind) = thinking.and_then(|t| t.kind) {
        kwargs.entry("enable_thinking").or_insert(json!(kind != "disabled"));
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
}

/// A tool as chat's function tool; `input_schema` gets `type: object` when it has no type, as in vLLM.
fn chat_tool(tool: ToolIn) -> Value {
    let mut schema = tool.input_schema.unwrap_or_default();
    schema.entry("type").or_insert(json!("object"));
    let mut function = Map::new();
    function.insert("name".into(), json!(tool.name));
    if let Some(description) = tool.description {
        function.insert("description".into(), json!(description));
    }
    function.insert("parameters".into(), Value::Object(schema));
    json!({"type": "function", "function": function})
}

/// The chat body's `messages`, in a new body.
fn conversation(system: Option<&TextOrBlocks>, messages: Vec<super::types::MessageIn>) -> Map<String, Value> {
    let mut system_parts: Vec<&str> = Vec::new();
    match system {
        Some(TextOrBlocks::Text(text)) => system_parts.push(text),
        Some(TextOrBlocks::Blocks(blocks)) => system_parts.extend(system_texts(blocks)),
        None => {}
    }
    for message in messages.iter().filter(|m| m.role == "system") {
        match &message.content {
            TextOrBlocks::Text(text) => system_parts.push(text),
            TextOrBlocks::Blocks(blocks) => system_parts.extend(system_texts(blocks)),
        }
    }
    let mut out = Vec::new();
    if !system_parts.is_empty() {
        out.push(json!({"role": "system", "content": system_parts.concat()}));
    }
    for message in &messages {
        let Some(role) = normalized_role(&message.role).filter(|r| *r != "system") else { continue };
        match &message.content {
            TextOrBlocks::Text(text) => out.push(json!({"role": role, "content": text})),
            TextOrBlocks::Blocks(blocks) => blocks_message(role, blocks, &mut out),
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(out));
    chat
}

fn system_texts(blocks: &[BlockIn]) -> impl Iterator<Item = &str> {
    blocks.iter().filter_map(|b| b.text.as_deref()).filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
}

/// One message of blocks: its `tool` messages first (a user's tool results),
/// then the message itself unless it is a user message left with no content.
fn blocks_message(role: &str, blocks: &[BlockIn], out: &mut Vec<Value>) {
    let mut texts: Vec<&str> = Vec::new();
    let mut reasoning: Vec<&str> = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.kind.as_deref() {
            Some("text") => texts.extend(block.text.as_deref().filter(|t| !t.is_empty())),
            Some("thinking") => reasoning.extend(block.thinking.as_deref()),
            Some("tool_use") => {
                let input = Value::Object(block.input.clone().unwrap_or_default());
                tool_calls.push(json!({"id": block.id, "type": "function",
                    "function": {"name": block.name, "arguments": input.to_string()}}));
            }
            Some("tool_result") => out.push(json!({"role": "tool", "tool_call_id": block.tool_use_id,
                "content": tool_result_text(block.content.as_ref())})),
            // redacted_thinking: opaque, skipped (checked blocks have no other kind).
            _ => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!(role));
    if !reasoning.is_empty() {
        message.insert("reasoning".into(), json!(reasoning.concat()));
    }
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    match texts.as_slice() {
        [] => {}
        [one] => {
            message.insert("content".into(), json!(one));
        }
        many => {
            let parts: Vec<Value> = many.iter().map(|t| json!({"type": "text", "text": t})).collect();
            message.insert("content".into(), Value::Array(parts));
        }
    }
    if role != "user" || message.contains_key("content") {
        out.push(Value::Object(message));
    }
}

/// A tool result's text: the string, or its text blocks joined by newlines (as vLLM joins them).
fn tool_result_text(content: Option<&TextOrBlocks>) -> String {
    match content {
        None => String::new(),
        Some(TextOrBlocks::Text(text)) => text.clone(),
        Some(TextOrBlocks::Blocks(blocks)) => {
            blocks.iter().filter_map(|b| b.text.as_deref()).collect::<Vec<_>>().join("\n")
        }
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` for a chat finish, as vLLM
/// 0.33 maps them (`_to_anthropic_stop_reason`): `length` is `max_tokens` (a
/// call cut short too); parsed tool calls are `tool_use`; `stop` by a stop
/// string is `stop_sequence` (with the string), by EOS `end_turn`; any other
/// finish (an abort) has none.
pub fn stop_reason(
    finish_reason: Option<&str>,
    chat_stop_reason: &Value,
    called: bool,
) -> (Option<&'static str>, Option<String>) {
    match finish_reason {
        Some("length") => (Some("max_tokens"), None),
        Some("stop" | "tool_calls") if called => (Some("tool_use"), None),
        Some(reason @ ("stop" | "tool_calls")) => match chat_stop_reason.as_str() {
            Some(sequence) => (Some("stop_sequence"), Some(sequence.to_owned())),
            None if reason == "tool_calls" => (Some("tool_use"), None),
            None => (Some("end_turn"), None),
        },
        _ => (None, None),
    }
}

/// A signature for a thinking block, as vLLM makes one (random: nothing here signs thinking).
pub fn thinking_signature() -> String {
    random_hex(32)
}

/// The Messages answer of a whole chat answer (`chat`, as `/v1/chat/completions` writes it).
pub fn messages_response(chat: &Value) -> MessagesResponse {
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let mut content = Vec::new();
    if let Some(reasoning) = message["reasoning"].as_str().filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": reasoning, "signature": thinking_signature()}));
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = message["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default();
    for call in calls {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        // A parser's arguments are JSON; anything else is kept whole rather than lost.
        let input = serde_json::from_str::<Value>(arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({"arguments": arguments}));
        content.push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
    }
    if content.is_empty() {
        // Anthropic's empty answer is one empty text block (clients read content[0]), as vLLM writes it.
        content.push(json!({"type": "text", "text": ""}));
    }
    let (reason, sequence) = stop_reason(choice["finish_reason"].as_str(), &choice["stop_reason"], !calls.is_empty());
    MessagesResponse {
        id: chat["id"].as_str().unwrap_or_default().to_owned(),
        kind: "message",
        role: "assistant",
        content,
        model: chat["model"].as_str().unwrap_or_default().to_owned(),
        stop_reason: reason,
        stop_sequence: sequence,
        usage: MessagesUsage::of(&chat["usage"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_json(body: Value) -> Value {
        let parsed: MessagesBody = super::super::validate::parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        super::super::validate::check_messages_body(&parsed).unwrap();
        let mut out = conversation(parsed.system.as_ref(), parsed.messages.unwrap());
        tools_and_template(&mut out, parsed.tools, parsed.tool_choice, parsed.thinking, parsed.chat_template_kwargs);
        Value::Object(out)
    }

    #[test]
    fn a_tool_round_trip_becomes_chats_messages() {
        let chat = chat_json(json!({"model": "m", "max_tokens": 2000,
            "system": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "x-anthropic-billing-header: 1"}],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"properties": {}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"},
            "messages": [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris", "n": [1, 2]}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]}]}]}));
        assert_eq!(
            chat,
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief. Use tools."},
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "reasoning": "call it", "tool_calls": [{"id": "t1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"n\":[1,2]}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "sunny\n20C"}],
                "tool_choice": "required",
                "parallel_tool_calls": false,
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                    "parameters": {"properties": {}, "type": "object"}}}],
                "chat_template_kwargs": {"enable_thinking": false}
            })
        );
    }

    #[test]
    fn sampling_fields_reach_the_chat_body() {
        let body = json!({"model": "m", "max_tokens": 7, "stop_sequences": ["\n\n"], "temperature": 0.5,
            "top_p": 0.9, "top_k": 3, "stream": true, "metadata": {"user_id": "u"},
            "tool_choice": {"type": "tool", "name": "f"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        let parsed: MessagesBody = super::super::validate::parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        let mut chat = chat_body(parsed).unwrap();
        let sampling = std::mem::take(&mut chat.sampling);
        assert_eq!((sampling.max_tokens, sampling.top_k, sampling.stream), (Some(7), Some(3), Some(true)));
        assert_eq!((sampling.temperature, sampling.top_p), (Some(0.5), Some(0.9)));
        assert_eq!(sampling.stream_options.unwrap()["continuous_usage_stats"], json!(true));
        let tools = chat.take_tools();
        assert_eq!(tools.tool_choice, Some(json!({"type": "function", "function": {"name": "f"}})));
        let request = chat.validate().unwrap();
        assert_eq!(request.messages[0].content, "ab");
    }

    #[test]
    fn a_chat_answer_becomes_blocks_in_anthropics_order() {
        let chat = json!({"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 5, "completion_tokens": 3},
            "choices": [{"finish_reason": "tool_calls", "stop_reason": null, "message": {"content": "ok",
                "reasoning": "hmm", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}}]});
        let answer = serde_json::to_value(messages_response(&chat)).unwrap();
        assert_eq!(answer["content"][0]["type"], "thinking");
        assert_eq!(answer["content"][1], json!({"type": "text", "text": "ok"}));
        assert_eq!(answer["content"][2], json!({"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}));
        assert_eq!((answer["stop_reason"].as_str(), &answer["stop_sequence"]), (Some("tool_use"), &Value::Null));
        assert_eq!(answer["usage"], json!({"input_tokens": 5, "output_tokens": 3}));
        let cached = json!({"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}});
        assert_eq!(
            serde_json::to_value(MessagesUsage::of(&cached)).unwrap(),
            json!({"input_tokens": 1, "output_tokens": 3, "cache_read_input_tokens": 4})
        );
        let empty =
            json!({"id": "c", "model": "m", "choices": [{"finish_reason": "length", "message": {"content": null}}]});
        assert_eq!(messages_response(&empty).content, vec![json!({"type": "text", "text": ""})]);
        assert_eq!((answer["id"].as_str(), answer["type"].as_str()), (Some("chatcmpl-1"), Some("message")));
    }

    #[test]
    fn finishes_map_to_anthropics_stop_reasons() {
        assert_eq!(stop_reason(Some("stop"), &Value::Null, false), (Some("end_turn"), None));
        assert_eq!(stop_reason(Some("stop"), &json!(2), false), (Some("end_turn"), None));
        assert_eq!(stop_reason(Some("stop"), &json!("END"), false), (Some("stop_sequence"), Some("END".into())));
        assert_eq!(stop_reason(Some("length"), &Value::Null, false), (Some("max_tokens"), None));
        assert_eq!(stop_reason(Some("stop"), &Value::Null, true), (Some("tool_use"), None));
        assert_eq!(stop_reason(Some("length"), &Value::Null, true), (Some("max_tokens"), None));
        assert_eq!(stop_reason(Some("abort"), &Value::Null, false), (None, None));
    }
}
