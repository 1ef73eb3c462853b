//! The sampling fields every generating request shares ([`SamplingFields`]:
//! one typed struct, read from the HTTP routes' bodies, [`SamplingRequest`]s,
//! and built from gRPC's `SamplingParams`), their checks by the shared rule table ([`RULES`], 400s
//! in vLLM's words) into [`CommonParams`], and the engine's
//! [`SamplingParams`] of them ([`SamplingFields::engine_params`]), so an
//! engine never receives a request vLLM's `SamplingParams` would refuse.
//!
//! A new sampling parameter is a field here, its name in
//! [`SamplingFields::FIELDS`] and [`SamplingFields::read_field`], its check in
//! [`SamplingFields::check`] and its engine value in
//! [`SamplingFields::engine_params`].

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Error as _, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use vllm_rs_chat::DecodeOptions;
use vllm_rs_wire::protocol::SamplingParams;

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// The fields every generating route shares (completions, chat, responses;
/// vLLM's sampling and request options), as sent: all optional (absent or
/// null is `None`). A route's body is a [`SamplingRequest`] of these and the route's own fields, read in one pass.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SamplingFields {
    /// The model asked for.
    pub model: Option<String>,
    /// Stream the answer.
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`).
    pub stream_options: Option<Map<String, Value>>,
    /// Number of choices.
    pub n: Option<i64>,
    /// Candidates per choice (only 1).
    pub best_of: Option<i64>,
    /// Token limit.
    pub max_tokens: Option<i64>,
    /// Tokens to generate before stop tokens count.
    pub min_tokens: Option<i64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus mass.
    pub top_p: Option<f64>,
    /// Top-k cut-off.
    pub top_k: Option<i64>,
    /// Min-p cut-off.
    pub min_p: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Stop token ids.
    pub stop_token_ids: Option<Vec<i64>>,
    /// Keep generating past EOS.
    pub ignore_eos: Option<bool>,
    /// Leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// Put spaces between special tokens in the text (default true).
    pub spaces_between_special_tokens: Option<bool>,
    /// Token id (as a string) to bias.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Words never to generate.
    pub bad_words: Option<Vec<String>>,
    /// The only tokens that may be generated.
    pub allowed_token_ids: Option<Vec<i64>>,
    /// Top logprobs per prompt token (-1: the whole vocabulary).
    pub prompt_logprobs: Option<i64>,
    /// Tokens in logprobs as `token_id:N`; `None`: as the server is configured.
    pub return_tokens_as_token_ids: Option<bool>,
    /// Keep only this many prompt tokens (-1: as many as the model length allows).
    pub truncate_prompt_tokens: Option<i64>,
    /// Which end `truncate_prompt_tokens` cuts (`left`, the default, keeps the last tokens).
    pub truncation_side: Option<String>,
    /// Keep a matched stop string (and the stop token's text) in the output.
    pub include_stop_str_in_output: Option<bool>,
    /// Return the generated token ids (and the prompt's).
    pub return_token_ids: Option<bool>,
    /// The id the response carries (`X-Request-Id` wins over it, as in vLLM).
    pub request_id: Option<String>,
    /// Tokens per streamed chunk: raises the server's `stream_interval` for this request.
    pub stream_interval: Option<i64>,
}

impl SamplingFields {
    /// Every field's key in a body, in declaration order (the order a body
    /// sent as a JSON array fills them in).
    pub const FIELDS: [&'static str; 31] = [
        "model",
        "stream",
        "stream_options",
        "n",
        "best_of",
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "logit_bias",
        "bad_words",
        "allowed_token_ids",
        "prompt_logprobs",
        "return_tokens_as_token_ids",
        "truncate_prompt_tokens",
        "truncation_side",
        "include_stop_str_in_output",
        "return_token_ids",
        "request_id",
        "stream_interval",
    ];

    /// Reads the value of `key` from `map` into its field when `key` is one
    /// of [`Self::FIELDS`] (false, the value left unread, when it is not).
    /// `seen` holds a bit per field read so far: a second one is serde's
    /// duplicate-field error, as a derived struct answers it.
    pub fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
        seen: &mut u64,
    ) -> Result<bool, A::Error> {
        let Some(index) = Self::FIELDS.iter().position(|field| *field == key) else { return Ok(false) };
        if *seen & (1 << index) != 0 {
            return Err(A::Error::duplicate_field(Self::FIELDS[index]));
        }
        *seen |= 1 << index;
        match key {
            "model" => self.model = map.next_value()?,
            "stream" => self.stream = map.next_value()?,
            "stream_options" => self.stream_options = map.next_value()?,
            "n" => self.n = map.next_value()?,
            "best_of" => self.best_of = map.next_value()?,
            "max_tokens" => self.max_tokens = map.next_value()?,
            "min_tokens" => self.min_tokens = map.next_value()?,
            "temperature" => self.temperature = map.next_value()?,
            "top_p" => self.top_p = map.next_value()?,
            "top_k" => self.top_k = map.next_value()?,
            "min_p" => self.min_p = map.next_value()?,
            "frequency_penalty" => self.frequency_penalty = map.next_value()?,
            "presence_penalty" => self.presence_penalty = map.next_value()?,
            "repetition_penalty" => self.repetition_penalty = map.next_value()?,
            "seed" => self.seed = map.next_value()?,
            "stop" => self.stop = map.next_value()?,
            "stop_token_ids" => self.stop_token_ids = map.next_value()?,
            "ignore_eos" => self.ignore_eos = map.next_value()?,
            "skip_special_tokens" => self.skip_special_tokens = map.next_value()?,
            "spaces_between_special_tokens" => self.spaces_between_special_tokens = map.next_value()?,
            "logit_bias" => self.logit_bias = map.next_value()?,
            "bad_words" => self.bad_words = map.next_value()?,
            "allowed_token_ids" => self.allowed_token_ids = map.next_value()?,
            "prompt_logprobs" => self.prompt_logprobs = map.next_value()?,
            "return_tokens_as_token_ids" => self.return_tokens_as_token_ids = map.next_value()?,
            "truncate_prompt_tokens" => self.truncate_prompt_tokens = map.next_value()?,
            "truncation_side" => self.truncation_side = map.next_value()?,
            "include_stop_str_in_output" => self.include_stop_str_in_output = map.next_value()?,
            "return_token_ids" => self.return_token_ids = map.next_value()?,
            "request_id" => self.request_id = map.next_value()?,
            "stream_interval" => self.stream_interval = map.next_value()?,
            _ => unreachable!("every name in FIELDS has its arm"),
        }
        Ok(true)
    }

    /// The engine's sampling parameters of these fields as they are: the
    /// caller has checked them and sets what its API reads otherwise (the
    /// token limits, the seed, logprobs, structured outputs, ...).
    pub fn engine_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            max_tokens: self.max_tokens.and_then(|n| u64::try_from(n).ok()),
            min_tokens: self.min_tokens.and_then(|n| u64::try_from(n).ok()),
            seed: self.seed,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            prompt_logprobs: self.prompt_logprobs,
            ..SamplingParams::default()
        }
    }
}

/// The body of a generating route: the [`SamplingFields`] every generating
/// route shares and the route's own fields `R` (a struct with
/// `#[serde(default)]`), read in one pass in the body's order, so the first
/// bad field is the one named, with its top-level key, as for one struct.
/// Unknown fields are ignored. A body sent as a JSON array fills `R`'s
/// fields, then the sampling fields, in order (as serde reads a struct).
#[derive(Debug, Default)]
pub struct SamplingRequest<R> {
    /// The shared sampling fields.
    pub sampling: SamplingFields,
    /// The route's own fields.
    pub route: R,
}

impl<'de, R: Deserialize<'de>> Deserialize<'de> for SamplingRequest<R> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("SamplingRequest", &[], SamplingRequestVisitor(PhantomData))
    }
}

struct SamplingRequestVisitor<R>(PhantomData<R>);

impl<'de, R: Deserialize<'de>> Visitor<'de> for SamplingRequestVisitor<R> {
    type Value = SamplingRequest<R>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a request body")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut sampling = SamplingFields::default();
        let entries = RouteEntries { map: &mut map, sampling: &mut sampling, seen: 0 };
        let route = R::deserialize(MapAccessDeserializer::new(entries))?;
        Ok(SamplingRequest { sampling, route })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let route = R::deserialize(SeqAccessDeserializer::new(&mut seq))?;
        let sampling = SamplingFields::deserialize(SeqAccessDeserializer::new(&mut seq))?;
        Ok(SamplingRequest { sampling, route })
    }
}

/// A body's entries as the route's fields see them: the sampling fields are
/// read into `sampling` as they come, every other entry passes through.
struct RouteEntries<'a, A> {
    map: &'a mut A,
    sampling: &'a mut SamplingFields,
    /// The sampling fields read so far (see [`SamplingFields::read_field`]).
    seen: u64,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for RouteEntries<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        while let Some(Key(key)) = self.map.next_key()? {
            if !self.sampling.read_field(&key, self.map, &mut self.seen)? {
                return seed.deserialize(key.into_deserializer()).map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A key, borrowed from the body when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a field name")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }

            fn visit_string<E>(self, key: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
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

impl SamplingFields {
    /// Checks every shared field; `max_tokens` is the token limit the
    /// endpoint reads (its name and value), the first one given.
    pub fn check(mut self, max_tokens: Option<(&'static str, i64)>) -> Result<CommonParams, ApiError> {
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
        float("presence_penalty", self.presence_penalty)?;
        float("frequency_penalty", self.frequency_penalty)?;
        float("repetition_penalty", self.repetition_penalty)?;
        let temperature = float("temperature", self.temperature)?;
        float("top_p", self.top_p)?;
        if let Some(k) = self.top_k {
            RULES.check_int("top_k", k)?;
        }
        float("min_p", self.min_p)?;
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
        let stop_token_ids = self.stop_token_ids.take().unwrap_or_default();
        bounded("stop_token_ids", stop_token_ids.len())?;
        let stop = match self.stop.take() {
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
        let request_id = checked_request_id(self.request_id.take())?;
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
        let sampling = SamplingParams { max_tokens, min_tokens, seed, ..self.engine_params() };
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
    use crate::http::body::parse_body;
    use axum::http::StatusCode;
    use serde::de::IgnoredAny;
    use serde_json::json;

    fn parse(body: Value) -> Result<CommonParams, ApiError> {
        let input: SamplingRequest<IgnoredAny> = parse_body(&serde_json::to_vec(&body).unwrap())?;
        let max = input.sampling.max_tokens.map(|n| ("max_tokens", n));
        input.sampling.check(max)
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
    fn every_field_is_read_from_a_body_as_serde_reads_the_struct() {
        for field in SamplingFields::FIELDS {
            let body = serde_json::to_vec(&json!({ field: [[[]]] })).unwrap();
            let err = parse_body::<SamplingRequest<IgnoredAny>>(&body).unwrap_err();
            assert_eq!((err.status, err.param.as_deref()), (StatusCode::BAD_REQUEST, Some(field)));
        }
        let body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "n": 2,
            "best_of": 1, "max_tokens": 5, "min_tokens": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
            "min_p": 0.1, "frequency_penalty": 0.2, "presence_penalty": 0.3, "repetition_penalty": 1.1,
            "seed": 7, "stop": ["x"], "stop_token_ids": [1], "ignore_eos": true, "skip_special_tokens": false,
            "spaces_between_special_tokens": false, "logit_bias": {"1": 2.0}, "bad_words": ["w"],
            "allowed_token_ids": [3], "prompt_logprobs": 1, "return_tokens_as_token_ids": true,
            "truncate_prompt_tokens": 4, "truncation_side": "right", "include_stop_str_in_output": true,
            "return_token_ids": true, "request_id": "r", "stream_interval": 2});
        assert_eq!(body.as_object().unwrap().len(), SamplingFields::FIELDS.len());
        let read: SamplingRequest<IgnoredAny> = parse_body(&serde_json::to_vec(&body).unwrap()).unwrap();
        let derived: SamplingFields = serde_json::from_value(body).unwrap();
        assert_eq!(format!("{:?}", read.sampling), format!("{derived:?}"));
    }

    /// A route's own fields, for the tests.
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct RouteFields {
        messages: Option<Vec<String>>,
    }

    #[test]
    fn the_first_bad_field_in_the_body_is_named_and_duplicates_are_refused() {
        let first = |body: &str| parse_body::<SamplingRequest<RouteFields>>(body.as_bytes()).unwrap_err().param;
        assert_eq!(first(r#"{"max_tokens": "x", "messages": 5}"#).as_deref(), Some("max_tokens"));
        assert_eq!(first(r#"{"messages": 5, "max_tokens": "x"}"#).as_deref(), Some("messages"));
        let err = parse_body::<SamplingRequest<RouteFields>>(br#"{"n": 1, "n": 2}"#).unwrap_err();
        assert!(err.message.contains("duplicate field `n`"), "{}", err.message);
        let read: SamplingRequest<RouteFields> =
            parse_body(br#"{"messages": ["a"], "unknown": {"x": 1}, "n": 3}"#).unwrap();
        assert_eq!((read.route.messages, read.sampling.n), (Some(vec!["a".to_string()]), Some(3)));
        // An array fills the route's fields, then the sampling fields, as serde reads a struct.
        let read: SamplingRequest<RouteFields> = parse_body(br#"[null, "model"]"#).unwrap();
        assert_eq!(read.sampling.model.as_deref(), Some("model"));
        assert!(parse_body::<SamplingRequest<RouteFields>>(b"[]").is_ok());
        let err = parse_body::<SamplingRequest<RouteFields>>(b"[1]").unwrap_err();
        assert_eq!(err.message, "the request body must be a JSON object");
    }
}
