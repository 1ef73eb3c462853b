//! `response_format` and vLLM's `structured_outputs` request field, read as
//! vLLM 0.33 reads them (a `json_object` / `json_schema` response format
//! overrides the matching field of `structured_outputs`; exactly one
//! constraint kind in the end) and sent in the sampling params as vLLM's
//! encoder writes its `StructuredOutputsParams`. The Python API server does
//! the same (`structured_outputs.py`) with the same rule-table messages.

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use serde_json::{json, Map, Value};

/// The constraint kinds of vLLM's `StructuredOutputsParams`.
const CONSTRAINT_KINDS: [&str; 6] = ["json", "regex", "choice", "grammar", "json_object", "structural_tag"];

/// The sampling params' `structured_outputs` map for constraint `fields`, as
/// vLLM's msgpack encoder writes the dataclass (every field, in declaration
/// order), the backend resolved as vLLM's `auto` mode resolves it when
/// xgrammar is not used: `guidance` (llguidance).
pub fn wire_params(fields: &Map<String, Value>) -> Value {
    let get = |key: &str, default: Value| fields.get(key).cloned().unwrap_or(default);
    let mut out = Map::new();
    for kind in &CONSTRAINT_KINDS[..5] {
        out.insert((*kind).into(), get(kind, Value::Null));
    }
    out.insert("disable_any_whitespace".into(), get("disable_any_whitespace", json!(false)));
    out.insert("disable_additional_properties".into(), get("disable_additional_properties", json!(false)));
    out.insert("whitespace_pattern".into(), get("whitespace_pattern", Value::Null));
    out.insert("structural_tag".into(), get("structural_tag", Value::Null));
    out.insert("_backend".into(), json!("guidance"));
    out.insert("_backend_was_auto".into(), json!(true));
    Value::Object(out)
}

fn response_format_override(format: &Map<String, Value>) -> Result<Option<(&'static str, Value)>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(("json_object", json!(true)))),
        Some("json_schema") => {
            let schema = match format.get("json_schema") {
                None | Some(Value::Null) => return Err(RULES.refuse("response_format", "json_schema_missing", &[])),
                Some(Value::Object(json_schema)) => json_schema.get("schema").cloned().unwrap_or(Value::Null),
                Some(_) => return Err(RULES.wrong_type("response_format")),
            };
            if schema.is_null() {
                return Err(RULES.refuse(
                    "response_format",
                    "structured_outputs_bad_schema",
                    &[("param", "response_format.json_schema.schema"), ("why", "it is missing")],
                ));
            }
            Ok(Some(("json", schema)))
        }
        Some("structural_tag") => Err(RULES.refuse("response_format", "structural_tag_unsupported", &[])),
        _ => Err(RULES.wrong_type("response_format")),
    }
}

fn structured_outputs_fields(given: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut fields: Map<String, Value> = given
        .iter()
        .filter(|(k, v)| CONSTRAINT_KINDS.contains(&k.as_str()) && !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (option, is_type) in [
        ("disable_any_whitespace", Value::is_boolean as fn(&Value) -> bool),
        ("disable_additional_properties", Value::is_boolean),
        ("whitespace_pattern", Value::is_string),
    ] {
        match given.get(option) {
            None | Some(Value::Null) => {}
            Some(v) if is_type(v) => {
                fields.insert(option.into(), v.clone());
            }
            Some(_) => return Err(RULES.wrong_type("structured_outputs")),
        }
    }
    Ok(fields)
}

fn check_schema(param: &str, field: &str, schema: &Value) -> Result<(), ApiError> {
    let bad = |why: &str| RULES.refuse(param, "structured_outputs_bad_schema", &[("param", field), ("why", why)]);
    let parsed;
    let schema = match schema {
        Value::String(text) if text.trim().is_empty() => {
            return Err(RULES.refuse(param, "structured_outputs_empty_string", &[("kind", "json")]))
        }
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| bad(&e.to_string()))?;
            &parsed
        }
        other => other,
    };
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(bad("a schema is an object or a boolean"));
    }
    Ok(())
}

/// vLLM's checks of one constraint (`SamplingParams._validate_structured_outputs`);
/// errors are for `param` and show the constraint as `field`.
fn check(param: &str, field: &str, kind: &str, spec: &Value) -> Result<(), ApiError> {
    match kind {
        "json" => check_schema(param, field, spec),
        "regex" => {
            let Some(regex) = spec.as_str() else { return Err(RULES.wrong_type(param)) };
            let why = if regex.contains('\0') {
                Some("it holds a NUL character".to_owned())
            } else {
                regex_syntax::Parser::new().parse(regex).err().map(|e| e.to_string())
            };
            match why {
                Some(why) => {
                    Err(RULES.refuse(param, "structured_outputs_bad_regex", &[("param", field), ("why", &why)]))
                }
                None => Ok(()),
            }
        }
        "choice" => match spec.as_array() {
            Some(items) if items.iter().all(Value::is_string) => {
                if items.is_empty() {
                    Err(RULES.refuse(param, "structured_outputs_empty_choice", &[]))
                } else {
                    Ok(())
                }
            }
            _ => Err(RULES.wrong_type(param)),
        },
        "grammar" => match spec.as_str() {
            Some(text) if text.trim().is_empty() => {
                Err(RULES.refuse(param, "structured_outputs_empty_string", &[("kind", "grammar")]))
            }
            Some(_) => Ok(()),
            None => Err(RULES.wrong_type(param)),
        },
        "json_object" if spec == &Value::Bool(true) => Ok(()),
        "json_object" => Err(RULES.refuse(param, "structured_outputs_json_object_false", &[])),
        _ => Err(RULES.refuse(param, "structural_tag_unsupported", &[])),
    }
}

/// The request's constraint fields (`structured_outputs` with the
/// `response_format` override applied), checked; `None` when it has none.
pub fn read_structured_outputs(
    structured_outputs: Option<&Map<String, Value>>,
    response_format: Option<&Map<String, Value>>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut fields: Option<Map<String, Value>> = None;
    let mut param = "structured_outputs";
    if let Some(given) = structured_outputs {
        fields = Some(structured_outputs_fields(given)?);
    }
    if let Some(format) = response_format {
        if let Some((kind, value)) = response_format_override(format)? {
            fields.get_or_insert_with(Map::new).insert(kind.into(), value);
            param = "response_format";
        }
    }
    let Some(fields) = fields else { return Ok(None) };
    let kinds: Vec<&str> =
        CONSTRAINT_KINDS.iter().copied().filter(|k| fields.get(*k).is_some_and(|v| !v.is_null())).collect();
    if kinds.len() != 1 {
        return Err(RULES.refuse(param, "structured_outputs_kinds", &[("count", &kinds.len().to_string())]));
    }
    check(param, &format!("{param}.{}", kinds[0]), kinds[0], &fields[kinds[0]])?;
    Ok(Some(fields))
}

/// One constraint given on its own, as gRPC's `constraint` oneof gives it:
/// `kind` one of vLLM's `StructuredOutputsParams` fields, checked as the
/// HTTP routes check it (errors name `field`), answered as [`wire_params`]
/// writes it for the engine.
pub fn single_constraint(field: &str, kind: &str, spec: Value) -> Result<Value, ApiError> {
    check(field, field, kind, &spec)?;
    Ok(wire_params(&Map::from_iter([(kind.to_owned(), spec)])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<Option<Map<String, Value>>, ApiError> {
        let field = |name: &str| body.get(name).and_then(Value::as_object);
        read_structured_outputs(field("structured_outputs"), field("response_format"))
    }

    #[test]
    fn response_format_overrides_and_bad_values_name_the_field() {
        let fields = read(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}))
            .unwrap()
            .unwrap();
        assert_eq!(wire_params(&fields)["json"], json!({"type": "object"}));
        assert_eq!(wire_params(&fields)["_backend"], "guidance");
        assert!(read(json!({"response_format": {"type": "text"}})).unwrap().is_none());
        let e = read(json!({"structured_outputs": {"regex": "a("}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("structured_outputs"));
        assert!(e.message.contains("structured_outputs.regex"), "{}", e.message);
        let e = read(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"));
        let e = read(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).unwrap_err();
        assert!(e.message.contains("got 2"), "{}", e.message);
        assert!(read(json!({"structured_outputs": {"choice": []}})).is_err());
    }
}
