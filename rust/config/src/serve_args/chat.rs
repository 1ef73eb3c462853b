//! The `--args-json` keys that shape chat prompts and answers:
//! `chat_template`, `chat_template_content_format`, `response_role`, and
//! the output parsers: `enable_auto_tool_choice`, `tool_call_parser`,
//! `reasoning_parser`, `exclude_tools_when_tool_choice_none`, `trust_request_chat_template`,
//! `default_chat_template_kwargs` and `reasoning_effort_map`.

use super::keys::Keys;
use crate::error::ExitError;
use std::collections::HashMap;

/// vLLM 0.33's reasoning efforts (its `ReasoningEffort`), in its order.
pub const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// How message content reaches a template (vLLM's `chat_template_content_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// `content` is the text: `"Hello"`.
    String,
    /// `content` is a list of parts: `[{"type": "text", "text": "Hello"}]`.
    OpenAi,
}

/// How chat messages become a prompt, and who answers.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// The template text replacing the model's (`chat_template`, read from its file when it names one).
    pub template: Option<String>,
    /// How message content reaches the template; `None` (`auto`) detects it from the template.
    pub content_format: Option<ContentFormat>,
    /// The role of generated messages when the prompt ends with the generation prompt.
    pub response_role: String,
    /// The tool parser `auto` tool choice reads calls with: vLLM builds one
    /// only with `enable_auto_tool_choice` and `tool_call_parser` both set.
    pub auto_tool_parser: Option<String>,
    /// The reasoning parser (`reasoning_parser`).
    pub reasoning_parser: Option<String>,
    /// Leave `tools` out of the template when `tool_choice` is `none`.
    pub exclude_tools_when_tool_choice_none: bool,
    /// A chat request may bring its own `chat_template` (`trust_request_chat_template`).
    pub trust_request_chat_template: bool,
    /// The `chat_template_kwargs` every chat request starts from
    /// (`default_chat_template_kwargs`); a request's own override them.
    pub default_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Rewrites of requested reasoning efforts (`reasoning_effort_map`);
    /// efforts not listed pass unchanged.
    pub reasoning_effort_map: HashMap<String, String>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            template: None,
            content_format: None,
            response_role: "assistant".into(),
            auto_tool_parser: None,
            reasoning_parser: None,
            exclude_tools_when_tool_choice_none: false,
            trust_request_chat_template: false,
            default_template_kwargs: serde_json::Map::new(),
            reasoning_effort_map: HashMap::new(),
        }
    }
}

impl ChatOptions {
    pub(crate) fn load(keys: &Keys) -> Result<Self, ExitError> {
        let template = keys.string("chat_template")?.map(|value| resolve_template(&value)).transpose()?;
        let content_format = match keys.string("chat_template_content_format")?.as_deref() {
            None | Some("auto") => None,
            Some("string") => Some(ContentFormat::String),
            Some("openai") => Some(ContentFormat::OpenAi),
            Some(other) => {
                return Err(ExitError::usage(format!(
                    "--args-json: `chat_template_content_format` must be auto, string or openai, got {other:?}"
                )))
            }
        };
        let response_role = keys.string("response_role")?.unwrap_or_else(|| "assistant".into());
        let tool_call_parser = keys.string("tool_call_parser")?;
        let auto_tools = keys.bool("enable_auto_tool_choice")?.unwrap_or(false);
        if auto_tools && tool_call_parser.is_none() {
            return Err(ExitError::usage("--args-json: `enable_auto_tool_choice` requires `tool_call_parser`"));
        }
        if let Some(name) = &tool_call_parser {
            vllm_rs_parsers::ToolParser::new(name, Vec::new())
                .map_err(|e| ExitError::usage(format!("--args-json: `tool_call_parser`: {e}")))?;
        }
        let reasoning_parser = keys.string("reasoning_parser")?;
        if let Some(name) = &reasoning_parser {
            vllm_rs_parsers::ReasoningParser::new(name)
                .map_err(|e| ExitError::usage(format!("--args-json: `reasoning_parser`: {e}")))?;
        }
        Ok(ChatOptions {
            template,
            content_format,
            response_role,
            auto_tool_parser: tool_call_parser.filter(|_| auto_tools),
            reasoning_parser,
            exclude_tools_when_tool_choice_none: keys.bool("exclude_tools_when_tool_choice_none")?.unwrap_or(false),
            trust_request_chat_template: keys.bool("trust_request_chat_template")?.unwrap_or(false),
            default_template_kwargs: match keys.get("default_chat_template_kwargs") {
                None | Some(serde_json::Value::Null) => serde_json::Map::new(),
                Some(serde_json::Value::Object(map)) => map.clone(),
                Some(other) => return Err(Keys::wrong_type("default_chat_template_kwargs", "a JSON object", other)),
            },
            reasoning_effort_map: reasoning_effort_map(keys.get("reasoning_effort_map"))?,
        })
    }
}

/// `reasoning_effort_map` checked as vLLM's `validate_reasoning_effort_map`
/// checks it, with its messages: an object (or null) mapping vLLM's
/// reasoning efforts to strings.
fn reasoning_effort_map(value: Option<&serde_json::Value>) -> Result<HashMap<String, String>, ExitError> {
    let map = match value {
        None | Some(serde_json::Value::Null) => return Ok(HashMap::new()),
        Some(serde_json::Value::Object(map)) if map.values().all(serde_json::Value::is_string) => map,
        Some(_) => {
            return Err(ExitError::usage(
                "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts to strings.",
            ))
        }
    };
    let mut unknown: Vec<&str> =
        map.keys().map(String::as_str).filter(|key| !REASONING_EFFORTS.contains(key)).collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        let quoted = |items: &[&str]| items.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ");
        return Err(ExitError::usage(format!(
            "Error: --reasoning-effort-map has unknown efforts [{}]; keys must be one of [{}].",
            quoted(&unknown),
            quoted(&REASONING_EFFORTS)
        )));
    }
    Ok(map.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
}

/// vLLM's reading of `--chat-template`: the file it names when that opens;
/// else, when it holds a Jinja character (`{`, `}` or a newline), the
/// template itself; else it meant a file that is not there (a usage error).
fn resolve_template(value: &str) -> Result<String, ExitError> {
    match std::fs::read_to_string(value) {
        Ok(text) => Ok(text),
        Err(_) if value.contains(['{', '}', '\n']) => Ok(value.to_owned()),
        Err(e) => Err(ExitError::usage(format!(
            "--args-json: `chat_template` {value:?} looks like a file path, but it cannot be read ({e}); \
             vLLM's built-in template names are not available here: pass the file's path"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_a_readable_file_or_text_with_jinja_characters() {
        let dir = std::env::temp_dir().join(format!("vllm-rs-chat-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.jinja");
        std::fs::write(&file, "{{ messages[0].content }}").unwrap();
        assert_eq!(resolve_template(file.to_str().unwrap()).unwrap(), "{{ messages[0].content }}");
        assert_eq!(resolve_template("{{ x }}").unwrap(), "{{ x }}");
        match resolve_template("/no/such/template.jinja") {
            Err(ExitError::Usage(m)) => assert!(m.contains("`chat_template`") && m.contains("file path"), "{m}"),
            other => panic!("expected a usage error, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_reasoning_effort_map_takes_vllms_efforts_to_strings() {
        let load = |value: serde_json::Value| {
            let map = serde_json::Map::from_iter([("reasoning_effort_map".to_owned(), value)]);
            ChatOptions::load(&Keys(&map)).map(|options| options.reasoning_effort_map)
        };
        let map = load(serde_json::json!({"medium": "low", "xhigh": "max"})).unwrap();
        assert_eq!(map.get("medium").map(String::as_str), Some("low"));
        assert_eq!(map.get("xhigh").map(String::as_str), Some("max"));
        assert!(load(serde_json::Value::Null).unwrap().is_empty());
        let wrong = "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts to strings.";
        for (value, message) in [
            (serde_json::json!(["low"]), wrong.to_owned()),
            (serde_json::json!({"low": 1}), wrong.to_owned()),
            (
                serde_json::json!({"turbo": "high", "fast": "low", "low": "x"}),
                "Error: --reasoning-effort-map has unknown efforts ['fast', 'turbo']; keys must be one of \
                 ['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']."
                    .to_owned(),
            ),
        ] {
            match load(value.clone()) {
                Err(ExitError::Usage(m)) => assert_eq!(m, message, "{value}"),
                other => panic!("{value}: expected a usage error, got {other:?}"),
            }
        }
    }

    #[test]
    fn default_template_kwargs_are_an_object_or_null() {
        let load = |value: serde_json::Value| {
            let map = serde_json::Map::from_iter([("default_chat_template_kwargs".to_owned(), value)]);
            ChatOptions::load(&Keys(&map)).map(|options| options.default_template_kwargs)
        };
        let kwargs = load(serde_json::json!({"enable_thinking": false})).unwrap();
        assert_eq!(kwargs.get("enable_thinking"), Some(&serde_json::Value::Bool(false)));
        assert!(load(serde_json::Value::Null).unwrap().is_empty());
        match load(serde_json::json!("{\"enable_thinking\": false}")) {
            Err(ExitError::Usage(m)) => {
                assert!(m.contains("`default_chat_template_kwargs` must be a JSON object"), "{m}")
            }
            other => panic!("expected a usage error, got {other:?}"),
        }
    }
}
