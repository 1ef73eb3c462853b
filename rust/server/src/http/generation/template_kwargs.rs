//! A request's `chat_template_kwargs`, as vLLM 0.33 reads them: an object
//! merged over the server's `default_chat_template_kwargs`; `chat_template`
//! and `tokenize` are refused, as are the names the server itself passes
//! (where transformers fails on the duplicate). The template renderer
//! filters the rest to the variables the template uses. A requested
//! reasoning effort joins them as vLLM's `build_chat_params` puts it.

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use serde_json::{Map, Value};
use std::collections::HashMap;
use vllm_rs_config::serve_args::chat::REASONING_EFFORTS;

/// Keys vLLM refuses outright ("unexpected chat template kwargs").
const UNEXPECTED: [&str; 2] = ["chat_template", "tokenize"];

/// Keys transformers' `apply_chat_template` already receives from the
/// server: given again they fail there ("multiple values for keyword argument").
const RESERVED: [&str; 3] = ["conversation", "messages", "tools"];

/// The effective kwargs of a request: its `chat_template_kwargs` (`given`;
/// absent or null: none) merged over `defaults`; request values that are
/// null or `"auto"` leave the default in place, as vLLM's `merge_kwargs` does.
/// A refused key is a 400 naming `chat_template_kwargs` (a non-object is
/// refused by the typed request already).
pub fn read_template_kwargs(
    given: Option<&Map<String, Value>>,
    defaults: &Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    let Some(given) = given else { return Ok(defaults.clone()) };
    let unexpected: Vec<String> =
        UNEXPECTED.iter().filter(|k| given.contains_key(**k)).map(|k| format!("'{k}'")).collect();
    if !unexpected.is_empty() {
        let keys = format!("{{{}}}", unexpected.join(", "));
        return Err(RULES.refuse("chat_template_kwargs", "chat_template_kwargs_unexpected", &[("keys", &keys)]));
    }
    if let Some(key) = RESERVED.iter().find(|k| given.contains_key(**k)) {
        return Err(RULES.refuse("chat_template_kwargs", "chat_template_kwargs_reserved", &[("key", key)]));
    }
    let mut merged = defaults.clone();
    for (key, value) in given {
        if !value.is_null() && value.as_str() != Some("auto") {
            merged.insert(key.clone(), value.clone());
        }
    }
    Ok(merged)
}

/// A request's reasoning effort (chat's `reasoning_effort`, the responses
/// API's `reasoning.effort`): absent or null is none; anything but one of
/// `REASONING_EFFORTS` is a 400 naming `param`.
pub fn read_reasoning_effort(value: Option<&Value>, param: &str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(effort)) if REASONING_EFFORTS.contains(&effort.as_str()) => Ok(Some(effort.clone())),
        Some(_) => Err(RULES.wrong_type(param)),
    }
}

/// Puts a requested `effort` into the effective `kwargs` as vLLM's
/// `build_chat_params` does: the effort, rewritten by the server's
/// `effort_map` (`--reasoning-effort-map`), becomes `reasoning_effort`, and
/// `enable_thinking` becomes whether it is not `"none"` unless the request's
/// own `chat_template_kwargs` (`given`) name `enable_thinking`. Both win
/// over the request's and the server's kwargs; an effort mapped to `"auto"`
/// leaves `reasoning_effort` as it was, as vLLM's merge does.
pub fn apply_reasoning_effort(
    kwargs: &mut Map<String, Value>,
    given: Option<&Map<String, Value>>,
    effort: Option<&str>,
    effort_map: &HashMap<String, String>,
) {
    let Some(effort) = effort.map(|e| effort_map.get(e).map_or(e, String::as_str)) else { return };
    if effort != "auto" {
        kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
    }
    let thinking_given = given.is_some_and(|k| k.contains_key("enable_thinking"));
    if !thinking_given {
        kwargs.insert("enable_thinking".into(), Value::Bool(effort != "none"));
    }
}

/// The `enable_thinking` the reasoning parser reads from the kwargs: true
/// when absent, else the value's truth as Python sees it (vLLM's qwen3 parser).
pub fn thinking_enabled(kwargs: &Map<String, Value>) -> bool {
    match kwargs.get("enable_thinking") {
        None => true,
        Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    /// The body's `chat_template_kwargs`, as the typed request holds them.
    fn given(body: &Value) -> Option<&Map<String, Value>> {
        body.get("chat_template_kwargs").and_then(Value::as_object)
    }

    #[test]
    fn request_kwargs_merge_over_defaults_except_null_and_auto() {
        let defaults = object(json!({"enable_thinking": false, "style": "terse", "effort": "high"}));
        let body = json!({"chat_template_kwargs": {"enable_thinking": true, "style": null, "effort": "auto", "x": 1}});
        let merged = read_template_kwargs(given(&body), &defaults).unwrap();
        assert_eq!(Value::Object(merged), json!({"enable_thinking": true, "style": "terse", "effort": "high", "x": 1}));
        assert_eq!(read_template_kwargs(None, &defaults).unwrap(), defaults);
    }

    #[test]
    fn refused_kwargs_name_the_parameter() {
        let cases = [
            (
                json!({"chat_template_kwargs": {"tokenize": true, "chat_template": "x"}}),
                "Found unexpected chat template kwargs from request: {'chat_template', 'tokenize'}",
            ),
            (json!({"chat_template_kwargs": {"tools": []}}), "cannot set `tools`"),
            (json!({"chat_template_kwargs": {"messages": []}}), "cannot set `messages`"),
        ];
        for (body, expected) in cases {
            let error = read_template_kwargs(given(&body), &Map::new()).unwrap_err();
            let text = format!("{error:?}");
            assert!(text.contains(expected) && text.contains("chat_template_kwargs"), "{body}: {text}");
        }
    }

    #[test]
    fn an_effort_sets_the_template_effort_and_thinking_over_both_kwargs() {
        let defaults = object(json!({"enable_thinking": false, "reasoning_effort": "low"}));
        let effective = |body: Value, effort: Option<&str>, map: &[(&str, &str)]| {
            let mut kwargs = read_template_kwargs(given(&body), &defaults).unwrap();
            let map = map.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            apply_reasoning_effort(&mut kwargs, given(&body), effort, &map);
            Value::Object(kwargs)
        };
        assert_eq!(effective(json!({}), None, &[]), json!({"enable_thinking": false, "reasoning_effort": "low"}));
        assert_eq!(
            effective(json!({}), Some("high"), &[]),
            json!({"enable_thinking": true, "reasoning_effort": "high"})
        );
        assert_eq!(
            effective(json!({}), Some("none"), &[]),
            json!({"enable_thinking": false, "reasoning_effort": "none"})
        );
        // The request's own enable_thinking stays, even null (which then leaves the default).
        let body = json!({"chat_template_kwargs": {"enable_thinking": true, "reasoning_effort": "x"}});
        assert_eq!(effective(body, Some("none"), &[]), json!({"enable_thinking": true, "reasoning_effort": "none"}));
        let body = json!({"chat_template_kwargs": {"enable_thinking": null}});
        assert_eq!(effective(body, Some("high"), &[]), json!({"enable_thinking": false, "reasoning_effort": "high"}));
        // The map rewrites the effort before thinking is derived from it.
        let map = [("medium", "none"), ("xhigh", "max")];
        assert_eq!(
            effective(json!({}), Some("medium"), &map),
            json!({"enable_thinking": false, "reasoning_effort": "none"})
        );
        assert_eq!(
            effective(json!({}), Some("xhigh"), &map),
            json!({"enable_thinking": true, "reasoning_effort": "max"})
        );
        assert_eq!(
            effective(json!({}), Some("low"), &[("low", "auto")]),
            json!({"enable_thinking": true, "reasoning_effort": "low"})
        );
    }

    #[test]
    fn efforts_are_vllms_seven_or_null() {
        for effort in REASONING_EFFORTS {
            assert_eq!(
                read_reasoning_effort(Some(&json!(effort)), "reasoning_effort").unwrap().as_deref(),
                Some(effort)
            );
        }
        assert_eq!(read_reasoning_effort(None, "reasoning_effort").unwrap(), None);
        assert_eq!(read_reasoning_effort(Some(&Value::Null), "reasoning_effort").unwrap(), None);
        for bad in [json!("extreme"), json!("HIGH"), json!(1), json!(["low"])] {
            let error = read_reasoning_effort(Some(&bad), "reasoning.effort").unwrap_err();
            assert_eq!(error.param.as_deref(), Some("reasoning.effort"), "{bad}");
            assert!(error.message.contains("`reasoning.effort` must be one of"), "{}", error.message);
        }
    }

    #[test]
    fn thinking_follows_python_truth() {
        assert!(thinking_enabled(&Map::new()));
        for (value, on) in
            [(json!(false), false), (json!(true), true), (json!(0), false), (json!("no"), true), (json!(null), false)]
        {
            assert_eq!(thinking_enabled(&object(json!({"enable_thinking": value}))), on, "{value}");
        }
    }
}
