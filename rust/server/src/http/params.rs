//! Request bodies: the body extractor (408 when it arrives too slowly, 413 when
//! too large), typed request models read with `serde` (400 naming the field
//! when one has the wrong type), and the checks of the shared rule table
//! ([`RULES`]) on every value that reaches an engine, so an engine never
//! receives a request vLLM's `SamplingParams` would refuse.

use crate::http::error::ApiError;
use crate::http::middleware::body_deadline::is_body_timeout;
use crate::http::rules::RULES;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use http_body_util::LengthLimitError;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use vllm_rs_chat::DecodeOptions;
use vllm_rs_wire::protocol::SamplingParams;

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A request body, read whole.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await.map(JsonBody).map_err(|e| body_error(&e))
    }
}

/// A request body deserialized as the route's typed request `T` in one pass
/// (the body read as [`JsonBody`] reads it), or the 400 [`parse_body`] gives.
pub struct JsonRequest<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonRequest<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBody(bytes) = JsonBody::from_request(req, state).await?;
        parse_body(&bytes).map(JsonRequest)
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

/// The body as the typed request model `T`, or a 400 saying why not: not
/// JSON (syntax, nesting deeper than 128, numbers out of range), not an
/// object, or a field of the wrong type (named, with the type it must have).
/// Unknown fields are ignored, as vLLM ignores them.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(field_error)?;
    deserializer.end().map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

fn field_error(error: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    use serde_path_to_error::Segment;
    let inner = error.inner();
    if !inner.is_data() {
        return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
    }
    // The top-level field names the fault, also for one deep inside it (the
    // Python API server's pydantic paths differ there; the messages must not).
    match error.path().iter().next() {
        Some(Segment::Map { key }) => RULES.wrong_type(key),
        _ if inner.to_string().starts_with("invalid type") => {
            ApiError::bad_request("the request body must be a JSON object")
        }
        _ => ApiError::bad_request(format!("the request body is invalid: {inner}")),
    }
}

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Declares a request body: the route's own fields and the fields every
/// sampling route shares (listed once, here), all optional (`serde(default)`:
/// absent or null is `None`; unknown fields are ignored, as vLLM ignores
/// them), with `take_sampling` moving the shared ones out as a
/// [`SamplingInput`]. One struct per route, so a body is parsed once.
macro_rules! sampling_request {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $crate::http::params::sampling_request!(@fields take [$(#[$meta])* $vis struct $name { $($(#[$fmeta])* $field : $ty),* }]);
    };
    (@shared $(#[$meta:meta])* $vis:vis struct $name:ident) => {
        $crate::http::params::sampling_request!(@fields shared [$(#[$meta])* $vis struct $name {}]);
    };
    (@fields $kind:ident [$($declared:tt)*]) => {
        $crate::http::params::sampling_request!(@struct $kind [$($declared)*]

    /// The model asked for.
    model: Option<String>,
    /// Stream the answer.
    stream: Option<bool>,
    /// Streaming options (`include_usage`).
    stream_options: Option<Map<String, Value>>,
    /// Number of choices.
    n: Option<i64>,
    /// Candidates per choice (only 1).
    best_of: Option<i64>,
    /// Token limit.
    max_tokens: Option<i64>,
    /// Tokens to generate before stop tokens count.
    min_tokens: Option<i64>,
    /// Sampling temperature.
    temperature: Option<f64>,
    /// Nucleus mass.
    top_p: Option<f64>,
    /// Top-k cut-off.
    top_k: Option<i64>,
    /// Min-p cut-off.
    min_p: Option<f64>,
    /// Frequency penalty.
    frequency_penalty: Option<f64>,
    /// Presence penalty.
    presence_penalty: Option<f64>,
    /// Repetition penalty.
    repetition_penalty: Option<f64>,
    /// Sampling seed.
    seed: Option<i64>,
    /// Stop strings.
    stop: Option<$crate::http::params::StopInput>,
    /// Stop token ids.
    stop_token_ids: Option<Vec<i64>>,
    /// Keep generating past EOS.
    ignore_eos: Option<bool>,
    /// Leave special tokens out of the text (default true).
    skip_special_tokens: Option<bool>,
    /// Put spaces between special tokens in the text (default true).
    spaces_between_special_tokens: Option<bool>,
    /// Token id (as a string) to bias.
    logit_bias: Option<::std::collections::BTreeMap<String, f64>>,
    /// Words never to generate.
    bad_words: Option<Vec<String>>,
    /// The only tokens that may be generated.
    allowed_token_ids: Option<Vec<i64>>,
    /// Top logprobs per prompt token (-1: the whole vocabulary).
    prompt_logprobs: Option<i64>,
    /// Tokens in logprobs as `token_id:N`; `None`: as the server is configured.
    return_tokens_as_token_ids: Option<bool>,
    /// Keep only this many prompt tokens (-1: as many as the model length allows).
    truncate_prompt_tokens: Option<i64>,
    /// Which end `truncate_prompt_tokens` cuts (`left`, the default, keeps the last tokens).
    truncation_side: Option<String>,
    /// Keep a matched stop string (and the stop token's text) in the output.
    include_stop_str_in_output: Option<bool>,
    /// Return the generated token ids (and the prompt's).
    return_token_ids: Option<bool>,
    /// The id the response carries (`X-Request-Id` wins over it, as in vLLM).
    request_id: Option<String>,
    /// Tokens per streamed chunk: raises the server's `stream_interval` for this request.
    stream_interval: Option<i64>,
        );
    };
    (@struct $kind:ident [$(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* }]
        $($(#[$smeta:meta])* $sfield:ident : $sty:ty,)*) => {
        $(#[$meta])*
        #[derive(Debug, Default, ::serde::Deserialize)]
        #[serde(default)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            $($(#[$smeta])* pub $sfield: $sty,)*
        }
        $crate::http::params::sampling_request!(@take $kind $name [$($sfield)*]);
    };
    (@take shared $name:ident [$($sfield:ident)*]) => {};
    (@take take $name:ident [$($sfield:ident)*]) => {
        impl $name {
            /// The fields every sampling route shares, moved out to be checked.
            pub fn take_sampling(&mut self) -> $crate::http::params::SamplingInput {
                $crate::http::params::SamplingInput { $($sfield: ::std::mem::take(&mut self.$sfield),)* }
            }
        }
    };
}
pub(crate) use sampling_request;

sampling_request! {
    @shared
    /// The fields completions, chat and responses share, as sent.
    pub struct SamplingInput
}

/// The parameters completions and chat share, checked.
#[derive(Debug, Default)]
pub struct CommonParams {
    /// The `model` asked for, if any.
    pub model: Option<String>,
    /// Sampling parameters, `max_tokens` not yet defaulted.
    pub sampling: SamplingParams,
    /// The parameter `sampling.max_tokens` came from, when given.
    pub max_tokens_param: Option<&'static str>,
    /// Stop strings, matched in the frontend.
    pub stop: Vec<String>,
    /// How generated ids become text.
    pub decode: DecodeOptions,
    /// Number of choices, each its own engine request when above 1.
    pub n: u32,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of the stream.
    pub include_usage: bool,
    /// Put the usage so far on every chunk (`stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// Keep a matched stop string (and the stop token's text) in the output.
    pub include_stop_str_in_output: bool,
    /// Return the generated token ids (and the prompt's).
    pub return_token_ids: bool,
    /// The request's own id (body `request_id`), checked.
    pub request_id: Option<String>,
    /// Prompt truncation, when asked for.
    pub truncation: Option<Truncation>,
    /// `logit_bias` token ids, checked against the vocabulary at submission.
    pub logit_bias_ids: Vec<i64>,
    /// `allowed_token_ids`, checked against the vocabulary at submission.
    pub allowed_token_ids: Option<Vec<i64>>,
    /// The server's own read of the whole vocabulary's logprobs (generative
    /// scoring reads its label tokens from it): not the client's ask, so
    /// `--max-logprobs` does not limit it.
    pub vocabulary_read: bool,
    /// `stop_token_ids` as sent, checked against the vocabulary at submission.
    pub stop_token_ids: Vec<i64>,
    /// Tokens in logprobs as `token_id:N`; `None`: as the server is configured.
    pub return_tokens_as_token_ids: Option<bool>,
    /// The request's `stream_interval` (at least 1), when given.
    pub stream_interval: Option<usize>,
}

/// `truncate_prompt_tokens` and `truncation_side`, as vLLM's `TokenizeParams` reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Tokens to keep; `None` for -1 (the model length less one).
    pub keep: Option<u64>,
    /// Keep the first tokens (`right`) instead of the last (`left`, vLLM's default for generation).
    pub keep_first: bool,
}

impl Truncation {
    /// `prompt` cut as vLLM cuts it, or a 400 naming `truncate_prompt_tokens`
    /// when it asks for more than the model length.
    pub fn apply(&self, prompt: &mut Vec<u32>, max_model_len: Option<u64>) -> Result<(), ApiError> {
        let keep = match (self.keep, max_model_len) {
            (Some(keep), Some(max_len)) if keep > max_len => {
                return Err(ApiError::invalid_param(
                    "truncate_prompt_tokens",
                    format!("truncate_prompt_tokens={keep} cannot be greater than max_model_len = {max_len}. Please request a smaller truncation size."),
                ))
            }
            (Some(keep), _) => keep,
            // -1: the model length less one token, held back for the output.
            (None, Some(max_len)) => max_len.saturating_sub(1),
            (None, None) => return Ok(()),
        };
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        if keep < prompt.len() {
            if self.keep_first {
                prompt.truncate(keep);
            } else {
                prompt.drain(..prompt.len() - keep);
            }
        }
        Ok(())
    }
}

/// The body's `request_id`, or a 400 naming it: at most 128 printable ASCII
/// characters, as the `X-Request-Id` header's (it becomes part of engine ids and logs).
fn checked_request_id(id: Option<String>) -> Result<Option<String>, ApiError> {
    match id {
        Some(id) if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) => {
            Err(ApiError::invalid_param(
                "request_id",
                "request_id must be 1 to 128 printable ASCII characters without spaces",
            ))
        }
        id => Ok(id),
    }
}

fn truncation(keep: Option<i64>, side: Option<&str>) -> Result<Option<Truncation>, ApiError> {
    let keep_first = match side {
        None | Some("left") => false,
        Some("right") => true,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "truncation_side",
                "`truncation_side` must be either 'left' or 'right'.",
            ))
        }
    };
    let Some(keep) = keep else { return Ok(None) };
    if keep < -1 {
        return Err(ApiError::invalid_param(
            "truncate_prompt_tokens",
            format!("truncate_prompt_tokens must be at least -1, got {keep}."),
        ));
    }
    Ok(Some(Truncation { keep: u64::try_from(keep).ok(), keep_first }))
}

/// Temperatures below this are greedy sampling (vLLM's `_SAMPLING_EPS`).
const GREEDY_TEMPERATURE: f64 = 1e-5;

/// `value` in `param`'s integer range, as a count.
fn count(param: &str, value: i64) -> Result<u64, ApiError> {
    RULES.check_int(param, value)?;
    u64::try_from(value).map_err(|_| RULES.wrong_type(param))
}

fn float(param: &str, value: Option<f64>) -> Result<Option<f64>, ApiError> {
    if let Some(v) = value {
        RULES.check_float(param, v)?;
    }
    Ok(value)
}

/// 400 unless the list `param` has at most `max_list_items` items.
pub fn bounded(param: &str, items: usize) -> Result<(), ApiError> {
    let limit = RULES.limits.max_list_items;
    if items > limit {
        return Err(RULES.refuse(
            param,
            "too_many_items",
            &[("param", param), ("limit", &limit.to_string()), ("count", &items.to_string())],
        ));
    }
    Ok(())
}

/// Python's `repr` of a list of strings, as vLLM's messages show them.
fn python_str_list(items: &[String]) -> String {
    let quoted: Vec<String> =
        items.iter().map(|s| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))).collect();
    format!("[{}]", quoted.join(", "))
}

impl SamplingInput {
    /// Checks every shared field; `max_tokens` is the token limit the
    /// endpoint reads (its name and value), the first one given.
    pub fn check(self, max_tokens: Option<(&'static str, i64)>) -> Result<CommonParams, ApiError> {
        let stream = self.stream.unwrap_or(false);
        let (include_usage, continuous_usage) = match &self.stream_options {
            // vLLM refuses options only when there are some (an empty object passes).
            Some(options) if !options.is_empty() && !stream => {
                return Err(RULES.refuse("stream_options", "stream_options_without_stream", &[]))
            }
            // vLLM's should_include_usage: continuous stats only with include_usage.
            Some(options) => {
                let include = stream_option(options, "include_usage")?;
                (include, include && stream_option(options, "continuous_usage_stats")?)
            }
            None => (false, false),
        };
        if let Some(p) = self.prompt_logprobs {
            RULES.check_int("prompt_logprobs", p)?;
            if stream && (p > 0 || p == -1) {
                return Err(RULES.refuse("prompt_logprobs", "prompt_logprobs_with_stream", &[]));
            }
        }
        let n = match self.n {
            // In range 1 to 16384, so it fits.
            Some(n) => RULES.check_int("n", n).map(|()| n as u32)?,
            None => 1,
        };
        if let Some(best_of) = self.best_of {
            RULES.check_int("best_of", best_of)?;
        }
        let presence_penalty = float("presence_penalty", self.presence_penalty)?;
        let frequency_penalty = float("frequency_penalty", self.frequency_penalty)?;
        let repetition_penalty = float("repetition_penalty", self.repetition_penalty)?;
        let temperature = float("temperature", self.temperature)?;
        let top_p = float("top_p", self.top_p)?;
        if let Some(k) = self.top_k {
            RULES.check_int("top_k", k)?;
        }
        let min_p = float("min_p", self.min_p)?;
        if n > 1 && temperature.is_some_and(|t| t < GREEDY_TEMPERATURE) {
            // vLLM's SamplingParams refuses it with no parameter named.
            return Err(ApiError::bad_request(RULES.message("n_with_greedy_sampling", &[("n", &n.to_string())])));
        }
        let max_tokens_param = max_tokens.map(|(param, _)| param);
        let max_tokens = max_tokens.map(|(param, n)| count(param, n)).transpose()?;
        let min_tokens = self.min_tokens.map(|n| count("min_tokens", n)).transpose()?;
        if let (Some(min), Some(max)) = (min_tokens, max_tokens) {
            check_min_tokens(min, max)?;
        }
        if let Some(interval) = self.stream_interval {
            RULES.check_int("stream_interval", interval)?;
        }
        let stream_interval = self.stream_interval.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let stop_token_ids = self.stop_token_ids.unwrap_or_default();
        bounded("stop_token_ids", stop_token_ids.len())?;
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopInput::One(s)) => vec![s],
            Some(StopInput::Many(list)) => list,
        };
        check_stop(&stop)?;
        if let Some(words) = &self.bad_words {
            bounded("bad_words", words.len())?;
            if words.iter().any(String::is_empty) {
                return Err(RULES.refuse("bad_words", "empty_bad_word", &[("bad_words", &python_str_list(words))]));
            }
        }
        if let Some(ids) = &self.allowed_token_ids {
            bounded("allowed_token_ids", ids.len())?;
            if ids.is_empty() {
                return Err(RULES.refuse("allowed_token_ids", "empty_allowed_token_ids", &[]));
            }
        }
        let logit_bias_ids = match &self.logit_bias {
            None => Vec::new(),
            Some(bias) => logit_bias_ids(bias)?,
        };
        let truncation = truncation(self.truncate_prompt_tokens, self.truncation_side.as_deref())?;
        let request_id = checked_request_id(self.request_id)?;
        // vLLM reads seed -1 as no seed.
        let seed = self.seed.filter(|&s| s != -1);
        if let Some(seed) = seed {
            // Child i of n samples with seed + i (vLLM's ParentRequest).
            if seed.checked_add(i64::from(n) - 1).is_none() {
                return Err(ApiError::invalid_param(
                    "seed",
                    format!("seed + n - 1 must fit in a signed 64-bit integer, got seed={seed} with n={n}."),
                ));
            }
        }
        let sampling = SamplingParams {
            temperature,
            top_p,
            top_k: self.top_k,
            min_p,
            frequency_penalty,
            presence_penalty,
            repetition_penalty,
            max_tokens,
            min_tokens,
            seed,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            prompt_logprobs: self.prompt_logprobs,
            ..Default::default()
        };
        Ok(CommonParams {
            return_tokens_as_token_ids: self.return_tokens_as_token_ids,
            model: self.model,
            sampling,
            max_tokens_param,
            stop,
            decode: DecodeOptions {
                skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
                spaces_between_special_tokens: self.spaces_between_special_tokens.unwrap_or(true),
            },
            n,
            stream,
            include_usage,
            continuous_usage,
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
            request_id,
            truncation,
            logit_bias_ids,
            allowed_token_ids: self.allowed_token_ids,
            stop_token_ids,
            stream_interval,
            vocabulary_read: false,
        })
    }
}

/// A boolean of `stream_options` (absent or null: false), or a 400 naming `stream_options`.
fn stream_option(options: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match options.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(RULES.wrong_type("stream_options")),
    }
}

/// 400 when `min_tokens` exceeds `max_tokens` (given or defaulted), in vLLM's words.
pub fn check_min_tokens(min: u64, max: u64) -> Result<(), ApiError> {
    if min > max {
        return Err(RULES.refuse(
            "min_tokens",
            "min_tokens_above_max_tokens",
            &[("max_tokens", &max.to_string()), ("min_tokens", &min.to_string())],
        ));
    }
    Ok(())
}

/// vLLM's and the project's rules for stop strings: at most
/// `max_stop_strings`, none empty, at most `max_stop_chars` in all.
fn check_stop(stop: &[String]) -> Result<(), ApiError> {
    let limits = &RULES.limits;
    if stop.len() > limits.max_stop_strings {
        return Err(RULES.refuse(
            "stop",
            "too_many_stop_strings",
            &[("limit", &limits.max_stop_strings.to_string()), ("count", &stop.len().to_string())],
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(RULES.refuse("stop", "empty_stop_string", &[]));
    }
    let chars: usize = stop.iter().map(|s| s.chars().count()).sum();
    if chars > limits.max_stop_chars {
        return Err(RULES.refuse(
            "stop",
            "too_many_stop_chars",
            &[("limit", &limits.max_stop_chars.to_string()), ("count", &chars.to_string())],
        ));
    }
    Ok(())
}

/// The token ids of `logit_bias`: keys must read as integers (as Python's
/// `int()` reads them), values lie in [-100, 100].
fn logit_bias_ids(bias: &BTreeMap<String, f64>) -> Result<Vec<i64>, ApiError> {
    bounded("logit_bias", bias.len())?;
    let bad: Vec<String> = bias.keys().filter(|k| python_int(k).is_none()).cloned().collect();
    if !bad.is_empty() {
        return Err(RULES.refuse("logit_bias", "logit_bias_bad_keys", &[("keys", &python_str_list(&bad))]));
    }
    if bias.values().any(|v| !(-100.0..=100.0).contains(v)) {
        return Err(RULES.refuse("logit_bias", "logit_bias_value_out_of_range", &[]));
    }
    Ok(bias.keys().filter_map(|k| python_int(k)).collect())
}

/// `text` as Python's `int(text)` reads a decimal: surrounding whitespace,
/// an optional sign, digits with single underscores between them.
fn python_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if !clean.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Ids past i64 are out of any vocabulary: saturate, the vocabulary check refuses them.
    let magnitude = clean.parse::<i64>().unwrap_or(i64::MAX);
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<CommonParams, ApiError> {
        let input: SamplingInput = parse_body(&serde_json::to_vec(&body).unwrap())?;
        let max = input.max_tokens.map(|n| ("max_tokens", n));
        input.check(max)
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
        assert_eq!(c.stop_token_ids, vec![1, 2]);
        assert!(c.sampling.ignore_eos && c.stream && c.include_usage);
        assert_eq!(c.stop, vec!["x"]);
        assert_eq!(parse(json!({"seed": -1})).unwrap().sampling.seed, None);
        assert!(parse(json!({"stream_options": {}})).is_ok(), "vLLM lets an empty stream_options through");
    }

    #[test]
    fn n_is_read_and_refused_with_greedy_sampling_as_vllm_does() {
        assert_eq!(parse(json!({})).unwrap().n, 1);
        assert_eq!(parse(json!({"n": 3, "temperature": 0.5})).unwrap().n, 3);
        assert_eq!(parse(json!({"n": 1, "temperature": 0})).unwrap().n, 1);
        assert_eq!(parse(json!({"n": 2, "seed": i64::MAX})).unwrap_err().param.as_deref(), Some("seed"));
        assert_eq!(parse(json!({"n": 1, "seed": i64::MAX})).unwrap().sampling.seed, Some(i64::MAX));
        let err = parse(json!({"n": 2, "temperature": 0})).unwrap_err();
        assert_eq!(
            (err.status, err.param, err.message.as_str()),
            (StatusCode::BAD_REQUEST, None, "n must be 1 when using greedy sampling, got 2.")
        );
    }

    #[test]
    fn invalid_values_name_the_parameter_with_vllms_message() {
        for (body, param, message) in [
            (json!({"max_tokens": 0}), "max_tokens", "max_tokens must be at least 1, got 0."),
            (json!({"temperature": 2.5}), "temperature", "temperature must be in [0, 2], got 2.5."),
            (json!({"top_p": 0}), "top_p", "top_p must be in (0, 1], got 0.0."),
            (json!({"top_k": -5}), "top_k", "top_k must be 0 (disable), or at least 1, got -5."),
            (json!({"n": 0}), "n", "n must be at least 1, got 0."),
            (json!({"n": 16385}), "n", "n must be at most 16384, got 16385."),
            (
                json!({"min_tokens": 5, "max_tokens": 2}),
                "min_tokens",
                "min_tokens must be less than or equal to max_tokens=2, got 5.",
            ),
            (json!({"stop": ["a", ""]}), "stop", "stop cannot contain an empty string."),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
            ),
            (
                json!({"logit_bias": {"x": 1}}),
                "logit_bias",
                "logit_bias contains key(s) that cannot be converted to integer token IDs: ['x']",
            ),
            (
                json!({"bad_words": ["", "a"]}),
                "bad_words",
                "bad_words cannot contain an empty string. Got bad_words=['', 'a']",
            ),
            (json!({"allowed_token_ids": []}), "allowed_token_ids", "allowed_token_ids is not None and empty!"),
            (
                json!({"repetition_penalty": 0}),
                "repetition_penalty",
                "repetition_penalty must be greater than zero, got 0.0.",
            ),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(
                (err.status, err.param.as_deref(), err.message.as_str()),
                (StatusCode::BAD_REQUEST, Some(param), message),
                "{body}"
            );
        }
    }

    #[test]
    fn wrong_types_and_project_limits_name_the_parameter() {
        for (body, param) in [
            (json!({"max_tokens": "5"}), "max_tokens"),
            (json!({"n": 1.5}), "n"),
            (json!({"stop": 3}), "stop"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"seed": 1.5}), "seed"),
            (json!({"seed": 9223372036854775808u64}), "seed"),
            (json!({"top_k": 2147483648u64}), "top_k"),
            (json!({"max_tokens": 2147483648u64}), "max_tokens"),
            (json!({"min_tokens": 18446744073709551615u64}), "min_tokens"),
            (json!({"stop": vec!["x"; 5]}), "stop"),
            (json!({"stop_token_ids": vec![1; 1025]}), "stop_token_ids"),
            (json!({"logit_bias": {"1": 101}}), "logit_bias"),
            (json!({"bad_words": vec!["x"; 1025]}), "bad_words"),
            (json!({"allowed_token_ids": vec![1; 1025]}), "allowed_token_ids"),
            (json!({"truncate_prompt_tokens": -2}), "truncate_prompt_tokens"),
            (json!({"truncation_side": "middle"}), "truncation_side"),
            (json!({"request_id": "has space"}), "request_id"),
            (json!({"request_id": ""}), "request_id"),
            (json!({"include_stop_str_in_output": 1}), "include_stop_str_in_output"),
            (json!({"return_token_ids": "yes"}), "return_token_ids"),
            (json!({"prompt_logprobs": -2}), "prompt_logprobs"),
            (json!({"prompt_logprobs": 1, "stream": true}), "prompt_logprobs"),
            (json!({"return_tokens_as_token_ids": 1}), "return_tokens_as_token_ids"),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!((err.status, err.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{body}");
        }
    }

    #[test]
    fn limits_are_inclusive_and_extremes_in_range_pass() {
        let c = parse(json!({"stop": vec!["x"; 4], "stop_token_ids": vec![7; 1024],
            "seed": i64::MIN, "top_k": i32::MAX, "max_tokens": i32::MAX, "min_tokens": 0, "top_k": 0}))
        .unwrap();
        assert_eq!((c.stop.len(), c.stop_token_ids.len()), (4, 1024));
        assert_eq!(c.sampling.seed, Some(i64::MIN));
        assert_eq!(parse(json!({"top_k": -1})).unwrap().sampling.top_k, Some(-1));
    }

    #[test]
    fn python_int_reads_what_int_reads() {
        for (text, value) in [
            ("5", Some(5)),
            (" -3 ", Some(-3)),
            ("+1_0", Some(10)),
            ("1__0", None),
            ("5.0", None),
            ("", None),
            ("x", None),
        ] {
            assert_eq!(python_int(text), value, "{text}");
        }
    }

    #[test]
    fn bodies_that_are_not_a_json_object_are_400s() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let huge_integer = format!("{{\"max_tokens\": {}}}", "9".repeat(5000));
        for body in [
            "",
            "{",
            "[1]",
            "null",
            "\"x\"",
            deep.as_str(),
            huge_integer.as_str(),
            "{\"a\": 1e999}",
            "\u{feff}{}",
            "{} x",
        ] {
            let err = parse_body::<Map<String, Value>>(body.as_bytes()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{body:.40}");
        }
        assert!(parse_body::<Map<String, Value>>(&[b'{', 0xff, b'}']).is_err());
        assert_eq!(parse_body::<Map<String, Value>>(b"{\"a\": [1]}").unwrap()["a"], json!([1]));
        let err = parse_body::<SamplingInput>(b"[1]").unwrap_err();
        assert_eq!(err.message, "the request body must be a JSON object");
    }
}
