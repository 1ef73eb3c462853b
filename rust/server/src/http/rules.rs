//! The request rules: `request_rules.json` beside this file (vLLM 0.33's
//! checks with vLLM's messages, plus this project's limits), embedded at build
//! time; one table, so a rule and its message are changed in one place.

use crate::http::error::ApiError;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::LazyLock;

/// The rule table, parsed once.
pub static RULES: LazyLock<Rules> = LazyLock::new(|| {
    serde_json::from_str(include_str!("request_rules.json"))
        .expect("request_rules.json is valid (checked by the unit tests)")
});

/// The whole table.
#[derive(Debug, Deserialize)]
pub struct Rules {
    /// The project's own limits.
    pub limits: Limits,
    types: HashMap<String, String>,
    ranges: HashMap<String, Vec<RangeRule>>,
    messages: HashMap<String, String>,
}

/// Size limits the project adds to vLLM's rules (or that vLLM has too).
#[derive(Debug, Deserialize)]
pub struct Limits {
    /// Most items of a request list or map.
    pub max_list_items: usize,
    /// Most `stop` strings (vLLM's `VLLM_MAX_STOP_STRINGS` default).
    pub max_stop_strings: usize,
    /// Most characters over all `stop` strings.
    pub max_stop_chars: usize,
    /// Largest `max_tokens` / `min_tokens`.
    pub max_token_count: u64,
}

/// One check of a number: the value passes when every bound given holds, or
/// when it equals `or_equal`.
#[derive(Debug, Deserialize)]
struct RangeRule {
    #[serde(default)]
    finite: bool,
    at_least: Option<f64>,
    above: Option<f64>,
    at_most: Option<f64>,
    or_equal: Option<f64>,
    message: String,
}

impl RangeRule {
    fn passes(&self, v: f64) -> bool {
        self.or_equal == Some(v)
            || ((!self.finite || v.is_finite())
                && self.at_least.is_none_or(|b| v >= b)
                && self.above.is_none_or(|b| v > b)
                && self.at_most.is_none_or(|b| v <= b))
    }
}

impl Rules {
    /// 400 naming `param` with the message of the first range rule a float fails.
    pub fn check_float(&self, param: &str, value: f64) -> Result<(), ApiError> {
        self.check(param, value, || python_float(value))
    }

    /// 400 naming `param` with the message of the first range rule an integer fails.
    pub fn check_int(&self, param: &str, value: i64) -> Result<(), ApiError> {
        // Bounds are small integers: exact in f64, and so is the comparison.
        self.check(param, value as f64, || value.to_string())
    }

    fn check(&self, param: &str, value: f64, shown: impl Fn() -> String) -> Result<(), ApiError> {
        let Some(rules) = self.ranges.get(param) else { return Ok(()) };
        match rules.iter().find(|rule| !rule.passes(value)) {
            Some(rule) => Err(ApiError::invalid_param(param, rule.message.replace("{value}", &shown()))),
            None => Ok(()),
        }
    }

    /// The message `key` with each `{name}` replaced by its value.
    pub fn message(&self, key: &str, values: &[(&str, &str)]) -> String {
        let mut text = self.messages.get(key).cloned().unwrap_or_else(|| key.to_string());
        for (name, value) in values {
            text = text.replace(&format!("{{{name}}}"), value);
        }
        text
    }

    /// 400 naming `param` with the message `key`.
    pub fn refuse(&self, param: &str, key: &str, values: &[(&str, &str)]) -> ApiError {
        ApiError::invalid_param(param, self.message(key, values))
    }

    /// 400 saying what type `param` must have.
    pub fn wrong_type(&self, param: &str) -> ApiError {
        match self.types.get(param) {
            Some(expected) => ApiError::invalid_param(param, format!("`{param}` must be {expected}")),
            None => ApiError::invalid_param(param, format!("`{param}` has the wrong type")),
        }
    }
}

/// `v` as Python's `repr(float)` writes it (vLLM's messages show values so):
/// the shortest round-trip digits, `.0` on whole numbers, exponents from 1e16
/// and below 1e-4 as `1e+16` / `1e-05`.
pub fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let abs = v.abs();
    if abs == 0.0 || (1e-4..1e16).contains(&abs) {
        let text = v.to_string();
        return if text.contains('.') { text } else { format!("{text}.0") };
    }
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} always writes an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} writes an integer exponent");
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_every_range_has_a_type() {
        for param in RULES.ranges.keys() {
            assert!(RULES.types.contains_key(param), "{param} has ranges but no type");
        }
        assert_eq!(RULES.limits.max_stop_strings, 4);
    }

    #[test]
    fn floats_are_written_as_python_writes_them() {
        for (v, text) in [
            (3.0, "3.0"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (0.0, "0.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (2.5e300, "2.5e+300"),
            (123456789.125, "123456789.125"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(python_float(v), text);
        }
    }

    #[test]
    fn ranges_use_the_first_failing_rule() {
        let e = RULES.check_float("temperature", 3.0).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("temperature"), "temperature must be in [0, 2], got 3.0.")
        );
        let e = RULES.check_float("temperature", -1.0).unwrap_err();
        assert_eq!(e.message, "temperature must be non-negative, got -1.0.");
        assert!(RULES.check_int("logprobs", -1).is_ok() && RULES.check_int("logprobs", -2).is_err());
        assert!(RULES.check_int("top_k", 0).is_ok() && RULES.check_int("top_k", -2).is_err());
        assert!(RULES.check_float("top_p", 0.0).is_err() && RULES.check_float("top_p", 1.0).is_ok());
    }
}
