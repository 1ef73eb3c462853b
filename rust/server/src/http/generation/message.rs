//! The assistant message of a whole chat answer, as vLLM 0.33's `ChatMessage`
//! serializes it: every key there, null when it has no value, `tool_calls`
//! left out when empty.

use serde::Serialize;
use serde_json::Value;

/// One generated chat message.
#[derive(Debug, Default, Serialize)]
pub struct ResponseMessage {
    /// The role of the answer.
    pub role: String,
    /// The text, or null when the output was all reasoning or tool calls.
    pub content: Option<String>,
    /// Always null: models here never refuse in a separate field.
    pub refusal: Option<String>,
    /// Always null: no URL citations are produced.
    pub annotations: Option<Value>,
    /// Always null: no audio output.
    pub audio: Option<Value>,
    /// Always null: the deprecated single function call (tool calls are in `tool_calls`).
    pub function_call: Option<Value>,
    /// The calls read from the output (left out when there are none, as in vLLM).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    /// The reasoning, when a reasoning parser found some.
    pub reasoning: Option<String>,
}

impl ResponseMessage {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: Option<String>) -> Self {
        ResponseMessage { role: role.to_owned(), content, ..Self::default() }
    }

    /// The message with `echo` (the last message of the conversation) before
    /// its content, as vLLM's `echo` makes it: content becomes text even when
    /// it was null.
    pub fn echoed(mut self, echo: Option<&str>) -> Self {
        if let Some(echo) = echo {
            self.content = Some(format!("{echo}{}", self.content.as_deref().unwrap_or("")));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_key_of_vllms_chat_message_is_there() {
        let message = serde_json::to_value(ResponseMessage::new("assistant", Some(String::new()))).unwrap();
        assert_eq!(
            message,
            json!({"role": "assistant", "content": "", "refusal": null, "annotations": null, "audio": null,
                   "function_call": null, "reasoning": null})
        );
    }

    #[test]
    fn echo_goes_before_the_content_and_makes_null_content_text() {
        let echoed = ResponseMessage::new("assistant", None).echoed(Some("Once upon"));
        assert_eq!(echoed.content.as_deref(), Some("Once upon"));
        let echoed = ResponseMessage::new("assistant", Some(" a time".into())).echoed(Some("Once upon"));
        assert_eq!(echoed.content.as_deref(), Some("Once upon a time"));
        assert_eq!(ResponseMessage::new("assistant", Some("x".into())).echoed(None).content.as_deref(), Some("x"));
    }
}
