//! The checks of a Messages request that the chat pipeline cannot make,
//! because they are about Anthropic's shapes: required fields, block kinds
//! and where each may appear, `tool_result` blocks answering a `tool_use` of
//! the message before, tools and `tool_choice`, `thinking`, and the fields
//! this server refuses. Each failure is a 400 naming the field by its path
//! (`messages.1.content.0.tool_use_id`), as Anthropic's API names it. What the
//! chat pipeline checks (sampling ranges, templates, tool parsers) it checks
//! after conversion, and `mod.rs` renames its fields back.

use super::types::{BlockIn, CountTokensBody, MessageIn, MessagesBody, TextOrBlocks, ThinkingIn, ToolChoiceIn, ToolIn};
use crate::http::error::ApiError;
use crate::http::rules::RULES;
use serde::de::DeserializeOwned;
use std::collections::HashSet;

/// The body as the typed request `T`, or a 400 naming the field at fault by
/// its whole path (`messages.0.content.1.text`) and what it should be. Not
/// the chat route's reading: the fields deep inside blocks are what clients
/// of this API get wrong, so the path matters more than the top-level name.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path: Vec<String> = error
            .path()
            .iter()
            .map(|segment| match segment {
                serde_path_to_error::Segment::Seq { index } => index.to_string(),
                serde_path_to_error::Segment::Map { key } => key.clone(),
                serde_path_to_error::Segment::Enum { variant } => variant.clone(),
                serde_path_to_error::Segment::Unknown => "?".into(),
            })
            .collect();
        field_error(&path, error.inner())
    })?;
    deserializer.end().map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

fn field_error(path: &[String], inner: &serde_json::Error) -> ApiError {
    if !inner.is_data() {
        return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
    }
    let text = inner.to_string();
    if let Some(field) = text.strip_prefix("missing field `").and_then(|rest| rest.split('`').next()) {
        let param = path.iter().map(String::as_str).chain([field]).collect::<Vec<_>>().join(".");
        return RULES.refuse(&param, "anthropic_field_required", &[("param", &param)]);
    }
    // serde reads a struct from a list too: a body that is a list fails at its index.
    if path.first().is_none_or(|first| first.parse::<usize>().is_ok()) {
        return ApiError::bad_request("the request body must be a JSON object");
    }
    wrong_type(&path.join("."), expected(path))
}

/// What the field at `path` must be, in the words of Anthropic's errors.
fn expected(path: &[String]) -> &'static str {
    let last = path.last().map(String::as_str).unwrap_or_default();
    let parent = path.len().checked_sub(2).map(|i| path[i].as_str()).unwrap_or_default();
    match last {
        "max_tokens" | "top_k" | "budget_tokens" => "a valid integer",
        "temperature" | "top_p" => "a valid number",
        "stream" | "is_error" | "strict" | "disable_parallel_tool_use" => "a valid boolean",
        "messages" | "tools" | "stop_sequences" => "a valid list",
        "content" if path.len() == 3 => "a string or a list of content blocks",
        "content" => "a string or a list of text blocks",
        "system" => "a string or a list of text blocks",
        "metadata"
        | "input"
        | "input_schema"
        | "tool_choice"
        | "thinking"
        | "output_config"
        | "format"
        | "chat_template_kwargs"
        | "source" => "a valid dictionary",
        _ if last.parse::<usize>().is_ok() && parent == "stop_sequences" => "a valid string",
        _ if last.parse::<usize>().is_ok() => "a valid dictionary",
        _ => "a valid string",
    }
}

/// Checks every field of a `/v1/messages` body the conversion relies on.
pub fn check_messages_body(body: &MessagesBody) -> Result<(), ApiError> {
    required("model", body.model.as_deref().filter(|m| !m.is_empty()))?;
    let max_tokens = required("max_tokens", body.max_tokens)?;
    if max_tokens <= 0 {
        return Err(RULES.refuse("max_tokens", "anthropic_max_tokens_positive", &[]));
    }
    let refused = [
        ("kv_transfer_params", body.kv_transfer_params.is_some()),
        ("container", body.container.is_some()),
        ("mcp_servers", body.mcp_servers.is_some()),
        ("context_management", body.context_management.is_some()),
        ("inference_geo", body.inference_geo.is_some()),
        ("speed", body.speed.is_some()),
        ("diagnostics", body.diagnostics.is_some()),
        ("user_profile_id", body.user_profile_id.is_some()),
        ("workspace_id", body.workspace_id.is_some()),
    ];
    if let Some((param, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(RULES.refuse(param, "field_unsupported", &[("param", param)]));
    }
    if let Some(tier) = body.service_tier.as_deref().filter(|t| !["auto", "standard_only"].contains(t)) {
        return Err(RULES.refuse("service_tier", "anthropic_service_tier_invalid", &[("value", tier)]));
    }
    if let Some(user_id) = body.metadata.as_ref().and_then(|m| m.get("user_id")) {
        if !(user_id.is_string() || user_id.is_null()) {
            return Err(wrong_type("metadata.user_id", "a valid string"));
        }
    }
    if let Some(thinking) = &body.thinking {
        check_thinking(thinking, max_tokens)?;
    }
    if let Some(format) = body.output_config.as_ref().and_then(|c| c.format.as_ref()) {
        let schema_ok = format.get("schema").is_some_and(|s| s.is_object());
        if format.get("type").and_then(|t| t.as_str()) != Some("json_schema") || !schema_ok {
            return Err(RULES.refuse("output_config.format", "anthropic_output_format_invalid", &[]));
        }
    }
    check_conversation(body.messages.as_deref(), body.system.as_ref(), body.tools.as_deref(), body.tool_choice.as_ref())
}

/// Checks a `/v1/messages/count_tokens` body.
pub fn check_count_tokens_body(body: &CountTokensBody) -> Result<(), ApiError> {
    required("model", body.model.as_deref().filter(|m| !m.is_empty()))?;
    if let Some(thinking) = &body.thinking {
        // No max_tokens here: the budget is only checked against the floor.
        check_thinking(thinking, i64::MAX)?;
    }
    check_conversation(body.messages.as_deref(), body.system.as_ref(), body.tools.as_deref(), body.tool_choice.as_ref())
}

/// The value of a required field, or the 400 naming it.
fn required<T>(param: &str, value: Option<T>) -> Result<T, ApiError> {
    value.ok_or_else(|| RULES.refuse(param, "anthropic_field_required", &[("param", param)]))
}

/// A 400 for `param` of the wrong type, saying what it should be.
pub fn wrong_type(param: &str, expected: &str) -> ApiError {
    RULES.refuse(param, "anthropic_wrong_type", &[("param", param), ("expected", expected)])
}

fn check_thinking(thinking: &ThinkingIn, max_tokens: i64) -> Result<(), ApiError> {
    let kind = required("thinking.type", thinking.kind.as_deref())?;
    match kind {
        "enabled" => {
            let budget = required("thinking.budget_tokens", thinking.budget_tokens)?;
            if budget < 1024 || budget >= max_tokens {
                let (max, budget) = (max_tokens.to_string(), budget.to_string());
                let values = [("max_tokens", max.as_str()), ("budget", budget.as_str())];
                return Err(RULES.refuse("thinking.budget_tokens", "anthropic_thinking_budget", &values));
            }
            Ok(())
        }
        "disabled" | "adaptive" => Ok(()),
        other => Err(RULES.refuse("thinking.type", "anthropic_thinking_invalid", &[("kind", other)])),
    }
}

/// The roles a message may have, as vLLM reads them (`ctx` and `msg` are a
/// newer Claude Code's names for user turns).
pub fn normalized_role(role: &str) -> Option<&'static str> {
    match role {
        "user" | "ctx" | "msg" => Some("user"),
        "assistant" => Some("assistant"),
        "system" => Some("system"),
        _ => None,
    }
}

fn check_conversation(
    messages: Option<&[MessageIn]>,
    system: Option<&TextOrBlocks>,
    tools: Option<&[ToolIn]>,
    tool_choice: Option<&ToolChoiceIn>,
) -> Result<(), ApiError> {
    let messages = required("messages", messages)?;
    if messages.is_empty() {
        return Err(RULES.refuse("messages", "messages_empty", &[]));
    }
    if let Some(TextOrBlocks::Blocks(blocks)) = system {
        for (j, block) in blocks.iter().enumerate() {
            check_text_only(block, &format!("system.{j}"), "system")?;
        }
    }
    // The tool_use ids of the message before, which a tool_result may answer.
    let mut offered: HashSet<&str> = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = normalized_role(&message.role).ok_or_else(|| {
            let param = format!("messages.{i}.role");
            RULES.refuse(&param, "anthropic_role_invalid", &[("param", &param), ("role", &message.role)])
        })?;
        let mut used = HashSet::new();
        if let TextOrBlocks::Blocks(blocks) = &message.content {
            for (j, block) in blocks.iter().enumerate() {
                check_block(block, &format!("messages.{i}.content.{j}"), role, &offered, &mut used)?;
            }
        }
        offered = used;
    }
    if let Some(tools) = tools {
        for (i, tool) in tools.iter().enumerate() {
            check_tool(tool, &format!("tools.{i}"))?;
        }
    }
    if let Some(choice) = tool_choice {
        let kind = required("tool_choice.type", choice.kind.as_deref())?;
        if !["auto", "any", "tool", "none"].contains(&kind) {
            return Err(RULES.refuse("tool_choice.type", "anthropic_tool_choice_invalid", &[("kind", kind)]));
        }
        if kind == "tool" && choice.name.as_deref().is_none_or(str::is_empty) {
            return Err(RULES.refuse("tool_choice.name", "anthropic_tool_choice_name_required", &[]));
        }
    }
    Ok(())
}

/// Checks one block of a `role` message at `param`; records the ids of its
/// `tool_use` blocks in `used` and checks a `tool_result` against `offered`.
fn check_block<'a>(
    block: &'a BlockIn,
    param: &str,
    role: &str,
    offered: &HashSet<&str>,
    used: &mut HashSet<&'a str>,
) -> Result<(), ApiError> {
    let kind = required(&format!("{param}.type"), block.kind.as_deref())?;
    let not_here = |place: &str| {
        RULES.refuse(param, "anthropic_block_not_here", &[("param", param), ("kind", kind), ("place", place)])
    };
    match kind {
        "text" => {
            required(&format!("{param}.text"), block.text.as_deref())?;
        }
        "thinking" => {
            required(&format!("{param}.thinking"), block.thinking.as_deref())?;
        }
        "redacted_thinking" => {}
        "tool_use" => {
            if role != "assistant" {
                return Err(not_here("a user message"));
            }
            let id = required(&format!("{param}.id"), block.id.as_deref())?;
            required(&format!("{param}.name"), block.name.as_deref())?;
            used.insert(id);
        }
        "tool_result" => {
            if role == "assistant" {
                return Err(not_here("an assistant message"));
            }
            let id_param = format!("{param}.tool_use_id");
            let id = required(&id_param, block.tool_use_id.as_deref())?;
            if !offered.contains(id) {
                let values = [("param", id_param.as_str()), ("id", id)];
                return Err(RULES.refuse(&id_param, "anthropic_tool_result_without_tool_use", &values));
            }
            if let Some(TextOrBlocks::Blocks(blocks)) = &block.content {
                for (k, inner) in blocks.iter().enumerate() {
                    check_text_only(inner, &format!("{param}.content.{k}"), "a tool_result")?;
                }
            }
        }
        "image" | "document" => {
            return Err(RULES.refuse(param, "anthropic_multimodal_unsupported", &[("param", param), ("kind", kind)]))
        }
        other => return Err(RULES.refuse(param, "anthropic_block_type_unknown", &[("param", param), ("kind", other)])),
    }
    Ok(())
}

/// Checks a block where only text may be: the system prompt, a tool result.
fn check_text_only(block: &BlockIn, param: &str, place: &str) -> Result<(), ApiError> {
    let kind = required(&format!("{param}.type"), block.kind.as_deref())?;
    match kind {
        "text" => required(&format!("{param}.text"), block.text.as_deref()).map(drop),
        "image" | "document" => {
            Err(RULES.refuse(param, "anthropic_multimodal_unsupported", &[("param", param), ("kind", kind)]))
        }
        _ => {
            Err(RULES.refuse(param, "anthropic_block_not_here", &[("param", param), ("kind", kind), ("place", place)]))
        }
    }
}

fn check_tool(tool: &ToolIn, param: &str) -> Result<(), ApiError> {
    if let Some(kind) = tool.kind.as_deref().filter(|k| *k != "custom") {
        return Err(RULES.refuse(param, "anthropic_server_tool_unsupported", &[("param", param), ("kind", kind)]));
    }
    required(&format!("{param}.name"), tool.name.as_deref().filter(|n| !n.is_empty()))?;
    required(&format!("{param}.input_schema"), tool.input_schema.as_ref())?;
    if tool.strict == Some(true) {
        let strict = format!("{param}.strict");
        return Err(RULES.refuse(&strict, "anthropic_strict_unsupported", &[("param", &strict)]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn refusal(body: Value) -> ApiError {
        let parsed: MessagesBody = parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        check_messages_body(&parsed).expect_err(&body.to_string())
    }

    fn with(extra: Value) -> Value {
        let mut body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    }

    #[test]
    fn type_errors_name_the_path_and_what_it_must_be() {
        for (body, param, expected) in [
            (json!({"max_tokens": "5"}), "max_tokens", "a valid integer"),
            (json!({"messages": [{"role": "user"}]}), "messages.0.content", "Field required"),
            (json!({"messages": [{"role": "user", "content": 5}]}), "messages.0.content", "content blocks"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
                "messages.0.content.0.text",
                "a valid string",
            ),
            (json!({"stop_sequences": [1]}), "stop_sequences.0", "a valid string"),
            (json!({"tools": [{"name": "f", "input_schema": []}]}), "tools.0.input_schema", "a valid dictionary"),
            (json!({"temperature": "hot"}), "temperature", "a valid number"),
        ] {
            let err = parse::<MessagesBody>(&serde_json::to_vec(&body).unwrap()).expect_err(&body.to_string());
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
            assert!(err.message.starts_with(param) && err.message.contains(expected), "{body}: {}", err.message);
            assert!(!err.message.contains("i64") && !err.message.contains("line "), "{}", err.message);
        }
        assert_eq!(parse::<MessagesBody>(b"[1]").unwrap_err().message, "the request body must be a JSON object");
        assert!(parse::<MessagesBody>(b"{").unwrap_err().message.contains("not valid JSON"));
    }

    #[test]
    fn a_plain_request_passes() {
        let body: MessagesBody = parse(&serde_json::to_vec(&with(json!({}))).unwrap()).unwrap();
        check_messages_body(&body).unwrap();
    }

    #[test]
    fn each_bad_field_is_named_by_its_path() {
        let tool_use =
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]});
        for (body, param) in [
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
            (with(json!({"max_tokens": 0})), "max_tokens"),
            (json!({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}), "model"),
            (with(json!({"messages": []})), "messages"),
            (with(json!({"messages": [{"role": "tool", "content": "x"}]})), "messages.0.role"),
            (with(json!({"messages": [{"role": "user", "content": [{"type": "video"}]}]})), "messages.0.content.0"),
            (with(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})), "messages.0.content.0.type"),
            (
                with(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})),
                "messages.0.content.0",
            ),
            (
                with(
                    json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}]}),
                ),
                "messages.0.content.0.tool_use_id",
            ),
            (
                // The tool_use is two messages back, not in the message before.
                with(json!({"messages": [tool_use, {"role": "user", "content": "x"},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]})),
                "messages.2.content.0.tool_use_id",
            ),
            (
                with(
                    json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]}),
                ),
                "messages.0.content.0",
            ),
            (with(json!({"system": [{"type": "image"}]})), "system.0"),
            (with(json!({"tools": [{"name": "f"}]})), "tools.0.input_schema"),
            (with(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})), "tools.0"),
            (with(json!({"tools": [{"name": "f", "input_schema": {}, "strict": true}]})), "tools.0.strict"),
            (with(json!({"tool_choice": {"type": "some"}})), "tool_choice.type"),
            (with(json!({"tool_choice": {"type": "tool"}})), "tool_choice.name"),
            (with(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})), "thinking.budget_tokens"),
            (with(json!({"thinking": {"type": "on"}})), "thinking.type"),
            (with(json!({"service_tier": "priority"})), "service_tier"),
            (with(json!({"metadata": {"user_id": 3}})), "metadata.user_id"),
            (with(json!({"container": "c"})), "container"),
            (with(json!({"kv_transfer_params": {}})), "kv_transfer_params"),
            (with(json!({"output_config": {"format": {"type": "json_object"}}})), "output_config.format"),
        ] {
            let err = refusal(body.clone());
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
            assert!(err.message.contains(param.split('.').next().unwrap()), "{body}: {}", err.message);
        }
    }

    #[test]
    fn a_tool_result_answers_the_tool_use_before_it() {
        let body = with(json!({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "and?"}]}]}));
        let parsed: MessagesBody = parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        check_messages_body(&parsed).unwrap();
    }
}
