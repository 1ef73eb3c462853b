//! `--args-json`: the server arguments, validated with errors that name the key.

use crate::engine::client::DEFAULT_STALL_TIMEOUT;
use crate::engine::zmtp::DEFAULT_MAX_MESSAGE_BYTES;
use crate::error::ExitError;
use serde_json::{Map, Value};
use std::fmt;
use std::time::Duration;

/// Keys this frontend reads from `--args-json`; every other key is ignored.
const KNOWN_KEYS: &[&str] = &[
    "model_tag",
    "model",
    "served_model_name",
    "api_key",
    "max_model_len",
    "tokenizer",
    "engine_ready_timeout_secs",
    "http_timeout_keep_alive",
    "enable_log_requests",
    "disable_log_stats",
    "shutdown_timeout",
    "engine_stall_timeout_s",
    "max_engine_message_bytes",
];

/// Environment variable for [`ServerConfig::engine_stall_timeout`] (`--args-json` wins).
pub const STALL_TIMEOUT_ENV: &str = "VLLM_RS_ENGINE_STALL_TIMEOUT_S";
/// Environment variable for [`ServerConfig::max_engine_message_bytes`] (`--args-json` wins).
pub const MAX_ENGINE_MESSAGE_ENV: &str = "VLLM_RS_MAX_ENGINE_MESSAGE_BYTES";

/// The server configuration taken from `--args-json`.
#[derive(Clone)]
pub struct ServerConfig {
    /// The model: a built-in name (`toy`, `echo`) or a model directory.
    pub model_tag: String,
    /// Names clients may use for the model; the first is reported in responses.
    pub served_model_names: Vec<String>,
    /// Accepted bearer tokens; empty means no authentication.
    pub api_keys: Vec<String>,
    /// Upper bound on prompt plus `max_tokens`, on top of what the engines report.
    pub max_model_len: Option<u64>,
    /// Where the tokenizer lives, when not in the model directory.
    pub tokenizer: Option<String>,
    /// How long to wait for every engine to register.
    pub engine_ready_timeout: Duration,
    /// How long an idle keep-alive HTTP connection stays open.
    pub http_timeout_keep_alive: Duration,
    /// Log one line per request received and finished.
    pub enable_log_requests: bool,
    /// Do not log periodic throughput stats.
    pub disable_log_stats: bool,
    /// How long a SIGTERM/SIGINT drain may take before in-flight requests are aborted.
    pub shutdown_timeout: Duration,
    /// An engine with requests in flight that sends nothing for this long is hung.
    pub engine_stall_timeout: Duration,
    /// The largest message accepted from an engine.
    pub max_engine_message_bytes: u64,
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("model_tag", &self.model_tag)
            .field("served_model_names", &self.served_model_names)
            .field("api_keys", &if self.api_keys.is_empty() { "none" } else { "***" })
            .field("max_model_len", &self.max_model_len)
            .field("tokenizer", &self.tokenizer)
            .field("engine_ready_timeout", &self.engine_ready_timeout)
            .field("http_timeout_keep_alive", &self.http_timeout_keep_alive)
            .field("enable_log_requests", &self.enable_log_requests)
            .field("disable_log_stats", &self.disable_log_stats)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("engine_stall_timeout", &self.engine_stall_timeout)
            .field("max_engine_message_bytes", &self.max_engine_message_bytes)
            .finish()
    }
}

impl ServerConfig {
    /// Parses and validates `--args-json`. Errors name the offending key.
    pub fn from_args_json(text: &str) -> Result<Self, ExitError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ExitError::usage(format!("--args-json: not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ExitError::usage("--args-json: expected a JSON object"));
        };
        for key in map.keys().filter(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            tracing::debug!(key = %key, "--args-json: ignoring key");
        }
        let keys = Keys(&map);
        let model_tag = match keys.string("model_tag")? {
            Some(tag) => tag,
            None => keys.string("model")?.ok_or_else(|| {
                ExitError::usage("--args-json: `model_tag` is required (a string)")
            })?,
        };
        let served_model_names = keys
            .string_or_list("served_model_name")?
            .filter(|names| !names.is_empty())
            .unwrap_or_else(|| vec![model_tag.clone()]);
        Ok(ServerConfig {
            served_model_names,
            api_keys: keys.string_or_list("api_key")?.unwrap_or_default(),
            max_model_len: keys.positive_int("max_model_len")?,
            tokenizer: keys.string("tokenizer")?,
            engine_ready_timeout: keys.seconds("engine_ready_timeout_secs")?.unwrap_or(Duration::from_secs(600)),
            http_timeout_keep_alive: keys.seconds("http_timeout_keep_alive")?.unwrap_or(Duration::from_secs(5)),
            enable_log_requests: keys.bool("enable_log_requests")?.unwrap_or(false),
            disable_log_stats: keys.bool("disable_log_stats")?.unwrap_or(false),
            shutdown_timeout: keys.seconds("shutdown_timeout")?.unwrap_or(Duration::from_secs(4)),
            engine_stall_timeout: match keys.seconds("engine_stall_timeout_s")? {
                Some(timeout) if timeout.is_zero() => {
                    return Err(ExitError::usage("--args-json: `engine_stall_timeout_s` must be more than 0"))
                }
                Some(timeout) => timeout,
                None => env_positive(STALL_TIMEOUT_ENV)?.map_or(DEFAULT_STALL_TIMEOUT, Duration::from_secs_f64),
            },
            max_engine_message_bytes: match keys.positive_int("max_engine_message_bytes")? {
                Some(bytes) => bytes,
                None => match env_positive(MAX_ENGINE_MESSAGE_ENV)? {
                    Some(bytes) if bytes.fract() == 0.0 => bytes as u64,
                    Some(_) => return Err(ExitError::usage(format!("{MAX_ENGINE_MESSAGE_ENV} must be a whole number of bytes"))),
                    None => DEFAULT_MAX_MESSAGE_BYTES,
                },
            },
            model_tag,
        })
    }

    /// The name reported in responses.
    pub fn primary_model_name(&self) -> &str {
        &self.served_model_names[0]
    }
}

/// A positive, finite number from the environment variable `name`, if set.
fn env_positive(name: &str) -> Result<Option<f64>, ExitError> {
    let Some(value) = std::env::var_os(name) else { return Ok(None) };
    match value.to_str().and_then(|v| v.trim().parse::<f64>().ok()) {
        Some(n) if n.is_finite() && n > 0.0 => Ok(Some(n)),
        _ => Err(ExitError::usage(format!("{name} must be a positive number, got {value:?}"))),
    }
}

/// Typed access to the keys of the `--args-json` object; `null` counts as absent.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn wrong_type(key: &str, expected: &str, got: &Value) -> ExitError {
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

    fn string(&self, key: &str) -> Result<Option<String>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Self::wrong_type(key, "a string", other)),
        }
    }

    fn string_or_list(&self, key: &str) -> Result<Option<Vec<String>>, ExitError> {
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

    fn positive_int(&self, key: &str) -> Result<Option<u64>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(Self::wrong_type(key, "a positive integer", v)),
            },
        }
    }

    fn seconds(&self, key: &str) -> Result<Option<Duration>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(s) if s.is_finite() && s >= 0.0 && !v.is_boolean() => Ok(Some(Duration::from_secs_f64(s))),
                _ => Err(Self::wrong_type(key, "a non-negative number of seconds", v)),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Self::wrong_type(key, "a boolean", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_message(json: &str) -> String {
        match ServerConfig::from_args_json(json) {
            Err(ExitError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = ServerConfig::from_args_json(r#"{"model_tag": "toy", "other": [1]}"#).unwrap();
        assert_eq!(c.served_model_names, vec!["toy"]);
        assert!(c.api_keys.is_empty());
        assert_eq!(c.engine_ready_timeout, Duration::from_secs(600));
        assert_eq!(c.http_timeout_keep_alive, Duration::from_secs(5));
    }

    #[test]
    fn served_model_name_accepts_string_and_list() {
        let c = ServerConfig::from_args_json(r#"{"model_tag": "toy", "served_model_name": ["a", "b"]}"#).unwrap();
        assert_eq!(c.served_model_names, vec!["a", "b"]);
        let c = ServerConfig::from_args_json(r#"{"model_tag": "toy", "served_model_name": "a"}"#).unwrap();
        assert_eq!(c.primary_model_name(), "a");
    }

    #[test]
    fn errors_name_the_key() {
        assert!(usage_message(r#"{"served_model_name": "x"}"#).contains("`model_tag`"));
        assert!(usage_message(r#"{"model_tag": 3}"#).contains("`model_tag`"));
        assert!(usage_message(r#"{"model_tag": "toy", "max_model_len": "big"}"#).contains("`max_model_len`"));
        assert!(usage_message(r#"{"model_tag": "toy", "max_model_len": -1}"#).contains("`max_model_len`"));
        assert!(usage_message(r#"{"model_tag": "toy", "enable_log_requests": 1}"#).contains("`enable_log_requests`"));
        assert!(usage_message(r#"{"model_tag": "toy", "http_timeout_keep_alive": true}"#).contains("`http_timeout_keep_alive`"));
        assert!(usage_message(r#"{"model_tag": "toy", "served_model_name": [1]}"#).contains("`served_model_name`"));
        assert!(usage_message("[1]").contains("object"));
        assert!(usage_message("{").contains("JSON"));
    }

    #[test]
    fn api_key_never_shows_in_debug_output() {
        let c = ServerConfig::from_args_json(r#"{"model_tag": "toy", "api_key": "sekrit-123"}"#).unwrap();
        assert_eq!(c.api_keys, vec!["sekrit-123"]);
        assert!(!format!("{c:?}").contains("sekrit"));
        let m = usage_message(r#"{"model_tag": "toy", "api_key": 12345678}"#);
        assert!(m.contains("`api_key`") && !m.contains("12345678"), "{m}");
    }
}
