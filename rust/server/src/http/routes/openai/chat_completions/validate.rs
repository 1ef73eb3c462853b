//! Reads and checks every parameter of a `/v1/chat/completions` body and its
//! messages: the 400s.

use super::types::{ChatBody, ChatRequest, ContentInput, MessageInput};
use crate::http::body::parse_body;
use crate::http::error::ApiError;
use crate::http::generation::structured::{read_structured_outputs, wire_params};
use crate::http::generation::template_kwargs::read_reasoning_effort;
use crate::http::generation::tools::{template_extra, ToolsInput};
use crate::http::rules::RULES;
use vllm_rs_chat::ChatMessage;

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
    use serde_json::{json, Value};
    use vllm_rs_config::ChatOptions;

    fn options(parser: Option<&str>) -> ChatOptions {
        ChatOptions { auto_tool_parser: parser.map(str::to_owned), ..ChatOptions::default() }
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
