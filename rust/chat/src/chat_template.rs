//! Chat templates of Hugging Face models (`chat_template` in
//! `tokenizer_config.json`), rendered with minijinja plus Python-style string
//! methods, as transformers' `apply_chat_template` does.

use super::{ChatMessage, ChatTemplateError};
use minijinja::{context, Environment, Error, ErrorKind};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use vllm_rs_config::serve_args::chat::ContentFormat;

const TEMPLATE_NAME: &str = "chat";

/// transformers' `apply_chat_template` parameters: vLLM accepts them as
/// `chat_template_kwargs` whatever the template uses, but transformers
/// consumes them itself, so the template never sees them (`documents` aside,
/// which it passes on, and `tools`/`conversation`, which requests cannot set).
const CONSUMED_BY_APPLY: [&str; 12] = [
    "add_generation_prompt",
    "chat_template",
    "continue_final_message",
    "max_length",
    "padding",
    "return_assistant_tokens_mask",
    "return_dict",
    "return_tensors",
    "sanitize_control_tokens",
    "tokenize",
    "tokenizer_kwargs",
    "truncation",
];

/// A compiled chat template and the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    content_format: ContentFormat,
    /// The variables the template reads without defining them (its own
    /// `undeclared_variables`): the only `chat_template_kwargs` it gets.
    variables: HashSet<String>,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are passed to it as
    /// variables; the content format is detected from the source, as vLLM's
    /// `auto` does.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, Error> {
        let content_format = detect_content_format(&source);
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| -> String { format_today(&format) });
        env.add_template_owned(TEMPLATE_NAME, source)?;
        let variables = env.get_template(TEMPLATE_NAME)?.undeclared_variables(false);
        Ok(ChatTemplate { env, bos_token, eos_token, content_format, variables })
    }

    /// The same template with `format` instead of the detected content format (when given).
    pub fn with_content_format(mut self, format: Option<ContentFormat>) -> Self {
        if let Some(format) = format {
            self.content_format = format;
        }
        self
    }

    /// The content format messages are rendered with.
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// The prompt for `messages`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, add_generation_prompt, None, &Map::new())
    }

    /// The prompt for `messages`, the request's `tools` (the template's
    /// `tools` variable) and its `chat_template_kwargs` (already checked:
    /// `http::template_kwargs`): those the template reads become variables,
    /// as vLLM filters them; they may replace `bos_token`/`eos_token`, as in
    /// transformers, but never the messages, tools or `add_generation_prompt`.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<String, ChatTemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut message = match self.content_format {
                    ContentFormat::String => json!({"role": m.role, "content": m.content}),
                    ContentFormat::OpenAi => json!({"role": m.role, "content": [{"type": "text", "text": m.content}]}),
                };
                if let (Some(extra), Value::Object(map)) = (&m.extra, &mut message) {
                    map.extend(extra.clone());
                }
                message
            })
            .collect();
        let kwargs: Map<String, Value> = kwargs
            .iter()
            .filter(|(name, _)| self.variables.contains(*name) && !CONSUMED_BY_APPLY.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        // The last of the merged maps that has a name wins it.
        let fixed = context! { messages => messages, add_generation_prompt => add_generation_prompt, tools => tools };
        let tokens = context! { bos_token => self.bos_token, eos_token => self.eos_token };
        template
            .render(minijinja::value::merge_maps([tokens, minijinja::Value::from_serialize(&kwargs), fixed]))
            .map_err(ChatTemplateError::from)
    }
}

/// vLLM's `auto` content format, read from the template's source: `openai`
/// when a `for` loop walks a message's content (`for part in
/// message['content']`, `message.content`, or a bare `content`), where the
/// message comes from a loop over `messages` or a variable set from it; else
/// `string`. vLLM walks the Jinja syntax tree; this reads the statement tags,
/// which finds the same loops in the templates models ship.
pub fn detect_content_format(source: &str) -> ContentFormat {
    let tags = statement_tags(source);
    let mut message_lists = vec!["messages".to_owned()];
    for tag in &tags {
        if let Some((name, value)) = tag.strip_prefix("set ").and_then(|rest| rest.split_once('=')) {
            if message_lists.iter().any(|list| list == root_name(value)) {
                message_lists.push(name.trim().to_owned());
            }
        }
    }
    let loops: Vec<(&str, &str)> = tags.iter().filter_map(|tag| for_loop(tag)).collect();
    let messages: Vec<&str> = loops
        .iter()
        .filter(|(_, iter)| message_lists.iter().any(|list| list == root_name(iter)))
        .map(|(target, _)| *target)
        .collect();
    let walks_content = |iter: &str| {
        let iter = iter.split('|').next().unwrap_or("").trim();
        iter == "content"
            || messages.iter().any(|m| {
                iter.strip_prefix(m).is_some_and(|rest| [".content", "['content']", "[\"content\"]"].contains(&rest))
            })
    };
    if loops.iter().any(|(_, iter)| walks_content(iter)) {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// The inside of every `{% ... %}` tag, whitespace-control marks and spaces trimmed.
fn statement_tags(source: &str) -> Vec<&str> {
    source
        .split("{%")
        .skip(1)
        .filter_map(|rest| rest.split_once("%}").map(|(tag, _)| tag))
        .map(|tag| tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()))
        .collect()
}

/// `(target, iterable)` of a `for target in iterable` tag.
fn for_loop(tag: &str) -> Option<(&str, &str)> {
    let (target, iter) = tag.strip_prefix("for ")?.split_once(" in ")?;
    let iter = iter.split(" if ").next().unwrap_or(iter).trim_end_matches(" recursive");
    Some((target.trim(), iter.trim()))
}

/// The variable an expression starts from: `messages` in `messages[1:]|reverse`.
fn root_name(expression: &str) -> &str {
    let expression = expression.trim();
    let end = expression.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(expression.len());
    &expression[..end]
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Today's UTC date in a strftime `format` (`%Y %m %d %B %b` and `%%`), for
/// templates that print the date.
fn format_today(format: &str) -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() / 86_400).unwrap_or(0);
    let (year, month, day) = civil_from_days(days as i64);
    let month_name = MONTHS[(month - 1) as usize];
    format
        .replace("%%", "\u{0}")
        .replace("%Y", &year.to_string())
        .replace("%m", &format!("{month:02}"))
        .replace("%d", &format!("{day:02}"))
        .replace("%B", month_name)
        .replace("%b", &month_name[..3])
        .replace('\u{0}', "%")
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The chat template in a `tokenizer_config.json` value: a string, or a list
/// of `{name, template}` from which `default` is taken.
pub fn template_source(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| named.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
pub fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_messages_with_python_methods_and_tokens() {
        let source = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(source.into(), "<s>".into(), "</s>".into()).unwrap();
        let messages = vec![ChatMessage { role: "user".into(), content: "  hi ".into(), extra: None }];
        assert_eq!(t.render(&messages, true).unwrap(), "<s><|user|>hi</s><|assistant|>");
        assert_eq!(t.render(&messages, false).unwrap(), "<s><|user|>hi</s>");
    }

    #[test]
    fn kwargs_reach_the_variables_the_template_reads_but_not_the_servers_own() {
        let source = "{{ bos_token }}|{{ style | default('plain') }}|{{ padding | default('unset') }}|{{ messages | length }}|{{ add_generation_prompt }}";
        let t = ChatTemplate::new(source.into(), "<s>".into(), String::new()).unwrap();
        let messages = vec![ChatMessage { role: "user".into(), content: "hi".into(), extra: None }];
        let render = |kwargs: Value| t.render_with_tools(&messages, true, None, kwargs.as_object().unwrap()).unwrap();
        assert_eq!(render(json!({})), "<s>|plain|unset|1|True");
        assert_eq!(render(json!({"style": "terse", "unused": 1})), "<s>|terse|unset|1|True");
        // transformers consumes its own parameters, and the server's variables win;
        // special tokens are the template's defaults, which kwargs replace.
        assert_eq!(
            render(json!({"padding": true, "add_generation_prompt": false, "messages": [], "bos_token": "B"})),
            "B|plain|unset|1|True"
        );
    }

    #[test]
    fn content_format_is_detected_from_loops_over_message_content() {
        let openai = [
            "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}",
            "{%- set loop_messages = messages[1:] -%}{% for m in loop_messages %}{%- for c in m.content | selectattr('type') %}{% endfor %}{% endfor %}",
            "{% for message in messages %}{% set content = message.content %}{% for item in content %}{% endfor %}{% endfor %}",
        ];
        for source in openai {
            assert_eq!(detect_content_format(source), ContentFormat::OpenAi, "{source}");
        }
        let string = [
            "{% for message in messages %}{{ message['content'] }}{% endfor %}",
            "{% for part in other['content'] %}{% endfor %}",
            "no tags at all",
        ];
        for source in string {
            assert_eq!(detect_content_format(source), ContentFormat::String, "{source}");
        }
    }

    #[test]
    fn openai_content_format_renders_content_as_a_list_of_text_parts() {
        let source = "{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}{% for p in m.content %}P:{{ p.text }}{% endfor %}{% endif %}{% endfor %}";
        let messages = vec![ChatMessage { role: "user".into(), content: "hi".into(), extra: None }];
        let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
        assert_eq!(t.content_format(), ContentFormat::OpenAi);
        assert_eq!(t.render(&messages, false).unwrap(), "P:hi");
        let t = t.with_content_format(Some(ContentFormat::String));
        assert_eq!(t.render(&messages, false).unwrap(), "S:hi");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert!(format_today("%d %b %Y").len() == 11);
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), String::new(), String::new())
            .unwrap();
        assert!(t.render(&[], true).unwrap_err().to_string().contains("roles must alternate"));
    }

    #[test]
    fn finds_the_template_and_special_tokens_in_the_config() {
        let config = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                            "eos_token": {"content": "</s>"}, "bos_token": "<s>"});
        assert_eq!(template_source(&config).as_deref(), Some("D"));
        assert_eq!(special_token(&config, "eos_token").as_deref(), Some("</s>"));
        assert_eq!(special_token(&config, "bos_token").as_deref(), Some("<s>"));
        assert_eq!(template_source(&json!({})), None);
    }
}
