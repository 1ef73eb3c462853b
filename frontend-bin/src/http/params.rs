//! Request bodies: the JSON object extractor (408 when it arrives too slowly,
//! 413 when too large, 400 when not JSON) and typed parameter readers whose
//! errors name the parameter, with every value that reaches the engine
//! range-checked and every list bounded.

use super::body_deadline::is_body_timeout;
use super::error::ApiError;
use crate::engine::protocol::SamplingParams;
use crate::tokenizer::DecodeOptions;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use http_body_util::LengthLimitError;
use serde_json::{Map, Value};

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Most items in a request list: `stop`, `stop_token_ids`, and the entries of
/// `logit_bias`, `bad_words` and `allowed_token_ids` (a million stop ids cost
/// an engine seconds per request).
pub const MAX_LIST_ITEMS: usize = 1024;

/// Largest `max_tokens` / `min_tokens`: what fits the engines' 32-bit counts.
pub const MAX_TOKEN_COUNT: u64 = i32::MAX as u64;

/// A request body that is a JSON object.
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await.map_err(|e| body_error(&e))?;
        parse_json_object(&bytes).map(JsonObject)
    }
}

/// Why a body could not be read: too slow (408), too large (413), or broken (400).
fn body_error(error: &axum::Error) -> ApiError {
    let too_large = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| e.source())
        .any(|e| e.is::<LengthLimitError>());
    if is_body_timeout(error) {
        ApiError::new(StatusCode::REQUEST_TIMEOUT, error.to_string())
    } else if too_large {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds {MAX_BODY_BYTES} bytes"))
    } else {
        ApiError::bad_request(format!("cannot read the request body: {error}"))
    }
}

/// The body as a JSON object, or a 400 saying why not (syntax, nesting deeper
/// than 128, numbers out of range, not an object).
pub fn parse_json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
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

    /// An integer parameter from `min` to `max`.
    pub fn int_in(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(Self::wrong(name, &format!("an integer from {min} to {max}"))),
            },
        }
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

    /// A token count from `min` to [`MAX_TOKEN_COUNT`].
    pub fn count(&self, name: &str, min: u64) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=MAX_TOKEN_COUNT).contains(&n) => Ok(Some(n)),
                _ => Err(Self::wrong(name, &format!("an integer from {min} to {MAX_TOKEN_COUNT}"))),
            },
        }
    }

    /// 400 unless the list or object `name`, when given, has at most [`MAX_LIST_ITEMS`] items.
    pub fn bounded(&self, name: &str) -> Result<(), ApiError> {
        let items = match self.get(name) {
            Some(Value::Array(items)) => items.len(),
            Some(Value::Object(entries)) => entries.len(),
            _ => 0,
        };
        if items > MAX_LIST_ITEMS {
            return Err(ApiError::invalid_param(
                name,
                format!("`{name}` may hold at most {MAX_LIST_ITEMS} items, got {items}"),
            ));
        }
        Ok(())
    }

    /// A list of at most [`MAX_LIST_ITEMS`] token ids.
    pub fn token_ids(&self, name: &str) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let expected = "a list of token ids (non-negative integers)";
        let items = v.as_array().ok_or_else(|| Self::wrong(name, expected))?;
        self.bounded(name)?;
        items
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| Self::wrong(name, expected)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A string or a list of at most [`MAX_LIST_ITEMS`] strings.
    pub fn strings(&self, name: &str) -> Result<Vec<String>, ApiError> {
        self.bounded(name)?;
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|s| {
                    s.as_str().map(str::to_owned).ok_or_else(|| Self::wrong(name, "a string or a list of strings"))
                })
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
    /// How generated ids become text.
    pub decode: DecodeOptions,
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
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` can only be given when `stream` is true",
            ))
        }
        Some(Value::Object(options)) => Params(options)
            .bool("include_usage")
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
    // -1 and 0 both mean off; the engines hold top_k in 32 bits.
    let top_k = p.int_in("top_k", -1, i64::from(i32::MAX))?;
    // Ignored here, but bounded like the lists that reach the engine.
    for name in ["logit_bias", "bad_words", "allowed_token_ids"] {
        p.bounded(name)?;
    }
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
        seed: p.int_in("seed", i64::MIN, i64::MAX)?,
        stop_token_ids: p.token_ids("stop_token_ids")?.unwrap_or_default(),
        ignore_eos: p.bool("ignore_eos")?.unwrap_or(false),
        ..Default::default()
    };
    Ok(CommonParams {
        model: p.str("model")?.map(str::to_owned),
        sampling,
        stop: p.strings("stop")?,
        decode: DecodeOptions {
            skip_special_tokens: p.bool("skip_special_tokens")?.unwrap_or(true),
            spaces_between_special_tokens: p.bool("spaces_between_special_tokens")?.unwrap_or(true),
        },
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
            (json!({"seed": 9223372036854775808u64}), "seed"),
            (json!({"top_k": 2147483648u64}), "top_k"),
            (json!({"max_tokens": 2147483648u64}), "max_tokens"),
            (json!({"min_tokens": 18446744073709551615u64}), "min_tokens"),
            (json!({"temperature": 1e308, "top_p": 1.5}), "top_p"),
            (json!({"stop": vec!["x"; MAX_LIST_ITEMS + 1]}), "stop"),
            (json!({"stop_token_ids": vec![1; MAX_LIST_ITEMS + 1]}), "stop_token_ids"),
            (json!({"stop_token_ids": [4294967296u64]}), "stop_token_ids"),
            (
                json!({"logit_bias": (0..=MAX_LIST_ITEMS).map(|i| (i.to_string(), json!(1))).collect::<Map<_, _>>()}),
                "logit_bias",
            ),
            (json!({"bad_words": vec!["x"; MAX_LIST_ITEMS + 1]}), "bad_words"),
            (json!({"allowed_token_ids": vec![1; MAX_LIST_ITEMS + 1]}), "allowed_token_ids"),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert_eq!(err.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn list_limits_are_inclusive_and_extremes_in_range_pass() {
        let c = parse(json!({"stop": vec!["x"; MAX_LIST_ITEMS], "stop_token_ids": vec![7; MAX_LIST_ITEMS],
            "seed": i64::MIN, "top_k": i32::MAX, "max_tokens": MAX_TOKEN_COUNT, "min_tokens": 0}))
        .unwrap();
        assert_eq!((c.stop.len(), c.sampling.stop_token_ids.len()), (MAX_LIST_ITEMS, MAX_LIST_ITEMS));
        assert_eq!((c.sampling.seed, c.sampling.top_k), (Some(i64::MIN), Some(i64::from(i32::MAX))));
        assert_eq!(parse(json!({"top_k": -1})).unwrap().sampling.top_k, Some(-1));
    }

    #[test]
    fn bodies_that_are_not_a_json_object_are_400s() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let huge_integer = format!("{{\"max_tokens\": {}}}", "9".repeat(5000));
        for body in
            ["", "{", "[1]", "null", "\"x\"", deep.as_str(), huge_integer.as_str(), "{\"a\": 1e999}", "\u{feff}{}"]
        {
            let err = parse_json_object(body.as_bytes()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{body:.40}");
        }
        assert!(parse_json_object(&[b'{', 0xff, b'}']).is_err());
        assert_eq!(parse_json_object(b"{\"a\": [1]}").unwrap()["a"], json!([1]));
    }
}
