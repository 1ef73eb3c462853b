//! Reads and checks every parameter of a `/v1/responses` body, its
//! `reasoning` and its input items: the 400s (and the 404 of a
//! `previous_response_id`).

use super::types::{ReasoningEcho, ResponsesBody, ResponsesRequest};
use crate::http::error::ApiError;
use crate::http::generation::template_kwargs::{read_reasoning_effort, read_template_kwargs};
use crate::http::rules::RULES;
use serde_json::{Map, Value};
use vllm_rs_chat::ChatMessage;
use vllm_rs_config::serve_args::chat::REASONING_EFFORTS;

/// The values `reasoning.summary` and `reasoning.generate_summary` may take.
const SUMMARIES: [&str; 3] = ["auto", "concise", "detailed"];

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
pub(super) fn parse_responses_request(
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
}
