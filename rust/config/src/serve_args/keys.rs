//! Typed access to the keys of the `--args-json` object, with usage errors
//! that name the key and never echo its value.

use crate::error::ExitError;
use serde_json::{Map, Value};

/// Typed access to the keys of the `--args-json` object; `null` counts as absent.
pub(crate) struct Keys<'a>(pub(crate) &'a Map<String, Value>);

impl Keys<'_> {
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn wrong_type(key: &str, expected: &str, got: &Value) -> ExitError {
        // Only the JSON type is shown: the value may be a credential.
        let shown = match got {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "an object",
        };
        ExitError::usage(format!("--args-json: `{key}` must be {expected}, got {shown}"))
    }

    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Self::wrong_type(key, "a string", other)),
        }
    }

    pub(crate) fn string_or_list(&self, key: &str) -> Result<Option<Vec<String>>, ExitError> {
        let expected = "a string or a list of strings";
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(Self::wrong_type(key, expected, other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(Self::wrong_type(key, expected, other)),
        }
    }

    pub(crate) fn positive_int(&self, key: &str) -> Result<Option<u64>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(Self::wrong_type(key, "a positive integer", v)),
            },
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Self::wrong_type(key, "a boolean", other)),
        }
    }
}
