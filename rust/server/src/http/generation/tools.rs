//! Tools, `tool_choice` and reasoning on the chat endpoint, as vLLM 0.33's
//! serve does them (the Python API server's `chat_tools.py` does the same
//! with the same rule table): requests checked as vLLM's request model
//! checks them; a tool parser only with `enable_auto_tool_choice` and
//! `tool_call_parser`; `required` and a named function constrained through
//! structured outputs with vLLM's JSON schema and read as JSON (except with
//! `mistral`, which reads them as `auto`); the output read by
//! [`ChatOutputParser`], whole and streamed.

use crate::http::error::ApiError;
use crate::http::generation::answer::Fields;
use crate::http::generation::chat_stream::ChatOpening;
use crate::http::generation::message::ResponseMessage;
use crate::http::generation::sse::{ChunkHeader, ChunkWriter};
use crate::http::generation::submit::stop_reason_json;
use crate::http::generation::usage::UsageInfo;
use crate::http::rules::RULES;
use axum::body::Bytes;
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex};
use vllm_rs_config::ChatOptions;
use vllm_rs_generate::Delta;
use vllm_rs_parsers::{
    named_tool_schema, required_tools_schema, ChatOutputParser, ChatOutputStream, DeltaMessage, ReasoningParser, Tool,
    ToolMode, ToolParser,
};

/// A chat request's tools, read and checked.
#[derive(Debug, Default)]
pub struct ChatTools {
    /// The `tools` list as the chat template gets it.
    pub tools: Option<Value>,
    /// How the output's calls are read: `none`, `auto`, `named`, `required`.
    pub mode: &'static str,
    /// The forced function of a named choice.
    pub function_name: Option<String>,
    /// The structured-outputs constraint a forced choice sets.
    pub constraint: Option<Map<String, Value>>,
    /// `parallel_tool_calls` (default true).
    pub parallel_tool_calls: bool,
}

fn function(tool: &Value) -> Result<&Map<String, Value>, ApiError> {
    let function = tool.get("function").and_then(Value::as_object);
    match function {
        Some(f)
            if tool.get("type").is_none_or(|t| t == "function")
                && f.get("name").is_some_and(Value::is_string)
                && f.get("parameters").is_none_or(|p| p.is_object() || p.is_null()) =>
        {
            Ok(f)
        }
        _ => Err(RULES.wrong_type("tools")),
    }
}

/// A chat request's tool fields as sent (typed by the request body).
#[derive(Debug, Default)]
pub struct ToolsInput {
    /// `tools`.
    pub tools: Option<Vec<Value>>,
    /// `tool_choice`.
    pub tool_choice: Option<Value>,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: Option<bool>,
    /// Whether `structured_outputs` sets a json, regex or choice constraint.
    pub constrained: bool,
}

/// The request's tools and `tool_choice`, checked as vLLM checks them.
pub fn read_chat_tools(input: &ToolsInput, options: &ChatOptions) -> Result<ChatTools, ApiError> {
    let list = match &input.tools {
        Some(list) if list.is_empty() => return Err(RULES.refuse("tools", "tools_empty", &[])),
        list => list.as_deref(),
    };
    let functions = list.map(|l| l.iter().map(function).collect::<Result<Vec<_>, _>>()).transpose()?;
    let parallel_tool_calls = input.parallel_tool_calls.unwrap_or(true);
    let tools = list.map(|l| Value::Array(l.to_vec()));
    let mut out = ChatTools { tools, mode: "none", parallel_tool_calls, ..Default::default() };
    let choice = match input.tool_choice.as_ref().filter(|v| !v.is_null()) {
        None if list.is_some() => Value::from("auto"),
        None => return Ok(out),
        Some(choice) => choice.clone(),
    };
    if choice == "none" {
        if options.exclude_tools_when_tool_choice_none {
            out.tools = None;
        }
        return Ok(out);
    }
    let Some(functions) = functions else { return Err(RULES.refuse("tool_choice", "tool_choice_without_tools", &[])) };
    let named = match &choice {
        Value::String(s) if s == "auto" || s == "required" => None,
        Value::String(s) => return Err(RULES.refuse("tool_choice", "tool_choice_invalid", &[("value", s)])),
        Value::Object(map) => {
            let name =
                map.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).filter(|n| !n.is_empty());
            let Some(name) = name else { return Err(RULES.wrong_type("tool_choice")) };
            let Some(f) = functions.iter().find(|f| f["name"] == name) else {
                return Err(RULES.refuse("tool_choice", "tool_choice_unknown_tool", &[]));
            };
            // vLLM refuses its own json/regex/choice constraints next to a named choice.
            if input.constrained {
                return Err(RULES.refuse("structured_outputs", "structured_outputs_with_tools", &[]));
            }
            Some((name.to_owned(), f.get("parameters").cloned()))
        }
        _ => return Err(RULES.wrong_type("tool_choice")),
    };
    let Some(parser) = &options.auto_tool_parser else {
        if choice == "auto" {
            return Err(RULES.refuse("tool_choice", "auto_tool_choice_disabled", &[]));
        }
        let described = match &named {
            Some((name, _)) => format!("function \"{name}\""),
            None => "\"required\"".into(),
        };
        return Err(RULES.refuse("tool_choice", "tool_choice_needs_parser", &[("choice", &described)]));
    };
    // mistral reads forced calls in its own format, as auto (vLLM's supports_required_and_named).
    if choice == "auto" || parser == "mistral" {
        out.mode = "auto";
        return Ok(out);
    }
    let schema = match named {
        Some((name, parameters)) => {
            out.mode = "named";
            out.function_name = Some(name);
            named_tool_schema(parameters.as_ref())
        }
        None => {
            out.mode = "required";
            let functions: Vec<(String, Option<Value>)> = functions
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap_or_default().to_owned(),
                        f.get("parameters").cloned().filter(|p| !p.is_null()),
                    )
                })
                .collect();
            required_tools_schema(&functions, parallel_tool_calls)
                .map_err(|e| RULES.refuse("tools", "tools_schema", &[("why", &e.to_string())]))?
        }
    };
    out.constraint = Some(Map::from_iter([("json".to_owned(), schema)]));
    Ok(out)
}

/// The reader of a request's output, or `None` when its text is all content;
/// `thinking` is the request's `enable_thinking` (only `qwen3` reads it).
pub fn output_parser(tools: &ChatTools, options: &ChatOptions, thinking: bool) -> Option<ChatOutputParser> {
    if tools.mode == "none" && options.reasoning_parser.is_none() {
        return None;
    }
    let mode = match tools.mode {
        "auto" => {
            let request_tools = tools.tools.as_ref().map(Tool::from_request_tools).unwrap_or_default();
            // The name was checked at start-up.
            ToolMode::Auto(ToolParser::new(options.auto_tool_parser.as_deref()?, request_tools).ok()?)
        }
        "named" => ToolMode::Named(tools.function_name.clone()?),
        "required" => ToolMode::Required,
        _ => ToolMode::None,
    };
    Some(ChatOutputParser::new(reasoning_parser(options, thinking), mode, tools.parallel_tool_calls))
}

/// The server's reasoning parser (`reasoning_parser`), with the request's
/// `enable_thinking`; `None` without one.
pub fn reasoning_parser(options: &ChatOptions, thinking: bool) -> Option<ReasoningParser> {
    // The name was checked at start-up.
    let parser = ReasoningParser::new(options.reasoning_parser.as_deref()?).ok()?;
    Some(parser.with_thinking(thinking))
}

/// vLLM's `resolve_finish_reason`: `tool_calls` when calls were made and
/// the model stopped on its own, unless one named function was forced.
pub fn finish_reason(engine_reason: &'static str, mode: &str, calls_made: bool) -> &'static str {
    if calls_made && engine_reason == "stop" && mode != "named" {
        "tool_calls"
    } else {
        engine_reason
    }
}

/// The fields of a streamed delta as vLLM writes them.
fn delta_json(delta: &DeltaMessage) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(content) = &delta.content {
        out.insert("content".into(), json!(content));
    }
    if let Some(reasoning) = &delta.reasoning {
        out.insert("reasoning".into(), json!(reasoning));
    }
    if !delta.tool_calls.is_empty() {
        let calls: Vec<Value> = delta
            .tool_calls
            .iter()
            .map(|c| {
                let mut item = json!({"index": c.index});
                if let Some(id) = &c.id {
                    item["id"] = json!(id);
                    item["type"] = json!(c.kind);
                }
                let mut function = Map::new();
                if let Some(name) = &c.name {
                    function.insert("name".into(), json!(name));
                }
                if let Some(arguments) = &c.arguments {
                    function.insert("arguments".into(), json!(arguments));
                }
                item["function"] = Value::Object(function);
                item
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    out
}

/// The message of a whole answer read by `parser`, and whether it has calls.
pub fn whole_message(parser: &ChatOutputParser, role: &str, text: &str) -> (ResponseMessage, bool) {
    let out = parser.parse(text);
    let mut message = ResponseMessage::new(role, out.content);
    message.reasoning = out.reasoning;
    message.tool_calls = out
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    let called = !message.tool_calls.is_empty();
    (message, called)
}

/// Chat chunks whose text goes through the request's output parser.
pub struct ParsedChatChunks {
    /// What every chunk repeats.
    pub header: ChunkHeader,
    /// The first chunks: the role (and the prompt's ids), the echo.
    pub opening: Arc<ChatOpening>,
    /// The output reader (the writer is shared by reference, so it is locked).
    pub stream: Mutex<ChatOutputStream>,
    /// The tool mode (for the finish reason).
    pub mode: &'static str,
    /// How logprobs are shown, when the request asked for them.
    pub rendering: Option<std::sync::Arc<vllm_rs_generate::logprobs::Rendering>>,
    /// The choice's index (streams of n > 1 choices interleave them).
    pub index: u32,
}

impl ChunkWriter for ParsedChatChunks {
    fn opening(&self, usage: Option<UsageInfo>) -> Option<Bytes> {
        Some(self.opening.chunks(&self.header, self.index, usage))
    }

    fn delta(&self, delta: &Delta, usage: Option<UsageInfo>) -> Bytes {
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let mut parts: Vec<DeltaMessage> = Vec::new();
        if !delta.text.is_empty() {
            parts.extend(stream.push(&delta.text));
        }
        if delta.finish.is_some() {
            parts.extend(stream.finish());
        }
        let mut out = Map::new();
        for part in &parts {
            for (key, value) in delta_json(part) {
                match (out.get_mut(&key), value) {
                    (Some(Value::Array(list)), Value::Array(more)) => list.extend(more),
                    (Some(Value::String(text)), Value::String(more)) => text.push_str(&more),
                    (_, value) => {
                        out.insert(key, value);
                    }
                }
            }
        }
        let logprobs = self.rendering.as_ref().and_then(|r| r.chat_logprobs(delta.scored.as_deref()));
        let mut choice = Fields::default();
        choice.put("index", &self.index);
        let Some(finish) = &delta.finish else {
            // vLLM sends a chunk without text when it carries logprobs or token ids.
            if out.is_empty() && logprobs.is_none() && delta.token_ids.is_none() {
                return Bytes::new();
            }
            choice.put("delta", &out);
            choice.put_raw("logprobs", logprobs);
            choice.put("finish_reason", &());
            choice.put("token_ids", &delta.token_ids);
            return self.header.event(&[choice], usage);
        };
        let reason = finish_reason(finish.reason.as_str(), self.mode, stream.tools_called());
        choice.put("delta", &out);
        choice.put_raw("logprobs", logprobs);
        choice.put("finish_reason", &reason);
        choice.put("stop_reason", &stop_reason_json(&finish.stop_reason));
        choice.put("token_ids", &delta.token_ids);
        self.header.event(&[choice], usage)
    }

    fn usage(&self, usage: UsageInfo) -> Bytes {
        self.header.event::<Value>(&[], Some(usage))
    }
}

/// What templates get of a message beyond role and content: `name`,
/// `tool_call_id`, and `tool_calls` with JSON arguments read into objects.
pub fn template_extra(message: &Map<String, Value>) -> Option<Map<String, Value>> {
    let mut extra = Map::new();
    for key in ["name", "tool_call_id"] {
        if let Some(v) = message.get(key).filter(|v| v.is_string()) {
            extra.insert(key.into(), v.clone());
        }
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let mut call = call.clone();
                if let Some(Value::String(arguments)) = call.pointer("/function/arguments").cloned() {
                    if let Ok(parsed) = serde_json::from_str::<Value>(&arguments) {
                        call["function"]["arguments"] = parsed;
                    }
                }
                call
            })
            .collect();
        extra.insert("tool_calls".into(), Value::Array(calls));
    }
    (!extra.is_empty()).then_some(extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vllm_rs_chat::chat_template::ChatTemplate;
    use vllm_rs_chat::ChatMessage;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn templates_get_tools_and_tool_messages_as_vllm_passes_them() {
        let source = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}{{ m.tool_call_id }}{{ m.content }};{% endfor %}";
        let template = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
        let assistant = body(json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}}]}));
        let tool = body(json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        let messages = vec![
            ChatMessage { role: "assistant".into(), content: String::new(), extra: template_extra(&assistant) },
            ChatMessage { role: "tool".into(), content: "sunny".into(), extra: template_extra(&tool) },
        ];
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let prompt = template.render_with_tools(&messages, false, Some(&tools), &Map::new()).unwrap();
        assert_eq!(prompt, "[f]assistant:Paris;tool:c1sunny;");
    }
}
