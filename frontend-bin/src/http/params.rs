//! Request bodies: the JSON object extractor (413 when too large, 400 when not
//! JSON) and typed parameter readers whose errors name the parameter.

use super::error::ApiError;
use crate::engine::protocol::SamplingParams;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{Map, Value};

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A request body that is a JSON object.
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds {MAX_BODY_BYTES} bytes"))
            } else {
                ApiError::bad_request(format!("cannot read the request body: {rejection}"))
            }
        })?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(map)) => Ok(JsonObject(map)),
            Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
        }
    }
}

/// Typed, named access to the parameters of a request; `null` counts as absent.
pub struct Params<'a>(pub &'a Map<String, Value>);

impl<'a> Params<'a> {
    /// The raw value of `name`, unless absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, expected: &str) -> ApiError {
        ApiError::invalid_param(name, format!("`{name}` must be {expected}"))
    }

    /// A boolean parameter.
    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name).map(|v| v.as_bool().ok_or_else(|| Self::wrong(name, "a boolean"))).transpose()
    }

    /// A string parameter.
    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(name).map(|v| v.as_str().ok_or_else(|| Self::wrong(name, "a string"))).transpose()
    }

    /// An integer parameter.
    pub fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name).map(|v| v.as_i64().ok_or_else(|| Self::wrong(name, "an integer"))).transpose()
    }

    /// A number parameter.
    pub fn float(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name).map(|v| v.as_f64().ok_or_else(|| Self::wrong(name, "a number"))).transpose()
    }

    /// A number that must lie in `range`, described as `what` in errors.
    pub fn float_in(&self, name: &str, ok: impl Fn(f64) -> bool, what: &str) -> Result<Option<f64>, ApiError> {
        match self.float(name)? {
            Some(v) if !ok(v) => Err(Self::wrong(name, what)),
            other => Ok(other),
        }
    }

    /// A non-negative integer, at least `min`.
    pub fn count(&self, name: &str, min: u64) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(Self::wrong(name, &format!("an integer of at least {min}"))),
            },
        }
    }

    /// A list of token ids.
    pub fn token_ids(&self, name: &str) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let expected = "a list of token ids (non-negative integers)";
        let items = v.as_array().ok_or_else(|| Self::wrong(name, expected))?;
        items
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| Self::wrong(name, expected)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A string or a list of strings.
    pub fn strings(&self, name: &str) -> Result<Vec<String>, ApiError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| Self::wrong(name, "a string or a list of strings")))
                .collect(),
            Some(_) => Err(Self::wrong(name, "a string or a list of strings")),
        }
    }

    /// Refuses a parameter unless it is absent or equal to its accepted value.
    pub fn only(&self, name: &str, accepted: &Value, why: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if v != accepted => Err(ApiError::invalid_param(name, format!("`{name}`: {why}"))),
            _ => Ok(()),
        }
    }
}

/// The parameters completions and chat share.
#[derive(Debug, Default)]
pub struct CommonParams {
    /// The `model` asked for, if any.
    pub model: Option<String>,
    /// Sampling parameters, `max_tokens` not yet defaulted.
    pub sampling: SamplingParams,
    /// Stop strings, matched in the frontend.
    pub stop: Vec<String>,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of the stream.
    pub include_usage: bool,
}

/// Reads the shared parameters; `max_tokens_names` lists the accepted spellings
/// of the token limit, the first present wins.
pub fn common_params(p: &Params, max_tokens_names: &[&str]) -> Result<CommonParams, ApiError> {
    p.only("n", &Value::from(1), "only n=1 is supported")?;
    p.only("best_of", &Value::from(1), "only best_of=1 is supported")?;
    let stream = p.bool("stream")?.unwrap_or(false);
    let include_usage = match p.get("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid_param("stream_options", "`stream_options` can only be given when `stream` is true"))
        }
        Some(Value::Object(options)) => Params(options).bool("include_usage")
            .map_err(|_| ApiError::invalid_param("stream_options", "`stream_options.include_usage` must be a boolean"))?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::invalid_param("stream_options", "`stream_options` must be an object")),
    };
    let mut max_tokens = None;
    for name in max_tokens_names {
        if let Some(n) = p.count(name, 1)? {
            max_tokens = Some(n);
            break;
        }
    }
    let top_k = match p.int("top_k")? {
        Some(k) if k < -1 => return Err(ApiError::invalid_param("top_k", "`top_k` must be -1 (off), 0 (off) or positive")),
        other => other,
    };
    let min_tokens = p.count("min_tokens", 0)?;
    if let (Some(min), Some(max)) = (min_tokens, max_tokens) {
        if min > max {
            return Err(ApiError::invalid_param("min_tokens", "`min_tokens` must not exceed `max_tokens`"));
        }
    }
    let penalty = |v: f64| (-2.0..=2.0).contains(&v);
    let sampling = SamplingParams {
        temperature: p.float_in("temperature", |v| v >= 0.0, "a non-negative number")?,
        top_p: p.float_in("top_p", |v| v > 0.0 && v <= 1.0, "in (0, 1]")?,
        top_k,
        min_p: p.float_in("min_p", |v| (0.0..=1.0).contains(&v), "in [0, 1]")?,
        frequency_penalty: p.float_in("frequency_penalty", penalty, "in [-2, 2]")?,
        presence_penalty: p.float_in("presence_penalty", penalty, "in [-2, 2]")?,
        repetition_penalty: p.float_in("repetition_penalty", |v| v > 0.0, "a positive number")?,
        max_tokens,
        min_tokens,
        seed: p.int("seed")?,
        stop_token_ids: p.token_ids("stop_token_ids")?.unwrap_or_default(),
        ignore_eos: p.bool("ignore_eos")?.unwrap_or(false),
        ..Default::default()
    };
    Ok(CommonParams {
        model: p.str("model")?.map(str::to_owned),
        sampling,
        stop: p.strings("stop")?,
        stream,
        include_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<CommonParams, ApiError> {
        common_params(&Params(body.as_object().unwrap()), &["max_completion_tokens", "max_tokens"])
    }

    #[test]
    fn reads_sampling_parameters() {
        let c = parse(json!({"model": "toy", "max_tokens": 5, "temperature": 0, "top_p": 0.9, "top_k": 3,
            "seed": 7, "stop": "x", "stop_token_ids": [1, 2], "ignore_eos": true,
            "stream": true, "stream_options": {"include_usage": true}}))
        .unwrap();
        assert_eq!(c.model.as_deref(), Some("toy"));
        assert_eq!(c.sampling.max_tokens, Some(5));
        assert_eq!(c.sampling.temperature, Some(0.0));
        assert_eq!(c.sampling.top_k, Some(3));
        assert_eq!(c.sampling.seed, Some(7));
        assert_eq!(c.sampling.stop_token_ids, vec![1, 2]);
        assert!(c.sampling.ignore_eos && c.stream && c.include_usage);
        assert_eq!(c.stop, vec!["x"]);
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let c = parse(json!({"max_tokens": 5, "max_completion_tokens": 9})).unwrap();
        assert_eq!(c.sampling.max_tokens, Some(9));
    }

    #[test]
    fn invalid_values_name_the_parameter() {
        for (body, param) in [
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": "5"}), "max_tokens"),
            (json!({"temperature": -1}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"top_k": -5}), "top_k"),
            (json!({"n": 2}), "n"),
            (json!({"stop": 3}), "stop"),
            (json!({"stop_token_ids": [-1]}), "stop_token_ids"),
            (json!({"stream_options": {"include_usage": true}}), "stream_options"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"seed": 1.5}), "seed"),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert_eq!(err.param.as_deref(), Some(param), "{body}");
        }
    }
}
