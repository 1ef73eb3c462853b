//! The part of `/v1/completions` and `/v1/chat/completions` that is the same:
//! model check, length checks, ids, EOS handling, submission to an engine.

use crate::http::error::ApiError;
use crate::http::rules::RULES;
use crate::http::sampling::{check_min_tokens, CommonParams};
use crate::http::state::{unix_now, unix_now_f64, AppState};
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use std::time::Instant;
use vllm_rs_config::ModelTask;
use vllm_rs_engine::ids::random_hex;
use vllm_rs_engine::SubmitError;
use vllm_rs_generate::Generation;
use vllm_rs_wire::protocol::{EngineRequest, SamplingParams, StopReason};

/// Header that pins a request to one engine.
pub const DATA_PARALLEL_RANK_HEADER: &str = "x-data-parallel-rank";
/// Header whose value becomes part of the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Which endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`
    Completions,
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/responses`
    Responses,
}

impl Endpoint {
    /// The id the client sees, as vLLM writes it per endpoint.
    fn external_id(self, client_id: &str) -> String {
        match self {
            Endpoint::Completions => format!("cmpl-{client_id}"),
            Endpoint::Chat => format!("chatcmpl-{client_id}"),
            Endpoint::Responses => format!("resp_{client_id}"),
        }
    }

    /// The API's name in vLLM's "does not support" error.
    fn api_name(self) -> &'static str {
        match self {
            Endpoint::Completions => "Completions",
            Endpoint::Chat => "Chat Completions",
            Endpoint::Responses => "Responses",
        }
    }

    /// The parameter that holds the prompt.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
            Endpoint::Responses => "input",
        }
    }
}

/// A request that is running in an engine.
pub struct Submitted {
    /// The id the client sees.
    pub id: String,
    /// When it was created (unix seconds).
    pub created: u64,
    /// The generation of its first (often only) choice.
    pub generation: Generation,
    /// The generations of choices 1 to n - 1 when `n` > 1; empty, and so
    /// never allocated, for one choice.
    pub more_choices: Vec<Generation>,
    /// The prompt's token ids, when the request asked for them (`return_token_ids`).
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The `max_tokens` a chat request that gives none runs with, for a prompt
/// of `prompt_len` tokens, as [`submit`] sets it: the generation config's
/// default or what the prompt leaves of the model length (the smaller of the
/// two), under the generation config's cap. `None` when nothing bounds it.
pub fn chat_default_max_tokens(state: &AppState, prompt_len: u64) -> Option<u64> {
    let config = &state.generation_config;
    let left = state.max_model_len.map(|max_len| max_len.saturating_sub(prompt_len).max(1));
    let default = match (config.defaults.max_tokens, left) {
        (Some(default), Some(left)) => Some(default.min(left)),
        (default, left) => default.or(left),
    };
    default.map(|n| config.cap_max_tokens(n)).or(config.max_tokens_cap)
}

/// 404 unless `model` is absent or one of the served names.
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if !state.config.served_model_names.iter().any(|n| n == name) => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{name}` does not exist."),
            param: Some("model".into()),
            kind: None,
        }),
        _ => Ok(()),
    }
}

/// vLLM's 400 when the model pools instead of generating (`--runner pooling`).
pub fn check_generates(state: &AppState, endpoint: Endpoint) -> Result<(), ApiError> {
    if state.config.task == ModelTask::Generate {
        return Ok(());
    }
    Err(ApiError::bad_request(format!("The model does not support {} API", endpoint.api_name())))
}

/// Checks the prompt against the vocabulary and the model length, fills in
/// `max_tokens` and the stop tokens, and sends the request to an engine.
pub fn submit(
    state: &AppState,
    headers: &HeaderMap,
    endpoint: Endpoint,
    mut prompt_token_ids: Vec<u32>,
    mut common: CommonParams,
) -> Result<Submitted, ApiError> {
    let started = Instant::now();
    let prompt_param = endpoint.prompt_param();
    if let Some(reason) = state.engines.failure() {
        return Err(ApiError::unavailable(reason.to_string()));
    }
    if let Some(truncation) = &common.truncation {
        truncation.apply(&mut prompt_token_ids, state.max_model_len)?;
    }
    if prompt_token_ids.is_empty() {
        return Err(ApiError::invalid_param(prompt_param, format!("`{prompt_param}` must not be empty")));
    }
    let vocab_size = state.tokenizer.vocab_size();
    if let Some(bad) = prompt_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(ApiError::invalid_param(
            prompt_param,
            format!("token id {bad} is out of vocabulary (vocab size {vocab_size})"),
        ));
    }
    let prompt_len = prompt_token_ids.len() as u64;
    let sampling = &mut common.sampling;
    let generation_config = &state.generation_config;
    generation_config.fill_sampling_defaults(sampling);
    if endpoint == Endpoint::Chat && sampling.max_tokens.is_none() {
        sampling.max_tokens = generation_config.defaults.max_tokens;
        if let (Some(max_len), Some(max_tokens)) = (state.max_model_len, &mut sampling.max_tokens) {
            // vLLM takes the smaller of the default and what the prompt leaves.
            *max_tokens = (*max_tokens).min(max_len.saturating_sub(prompt_len).max(1));
        }
    }
    if let Some(max_len) = state.max_model_len {
        if prompt_len >= max_len {
            return Err(ApiError::invalid_param(
                prompt_param,
                format!("This model's maximum context length is {max_len} tokens. However, your prompt has {prompt_len} tokens, leaving no room for completion tokens."),
            ));
        }
        let max_tokens = sampling.max_tokens.get_or_insert(match endpoint {
            Endpoint::Completions => DEFAULT_COMPLETION_MAX_TOKENS.min(max_len - prompt_len),
            Endpoint::Chat | Endpoint::Responses => max_len - prompt_len,
        });
        *max_tokens = generation_config.cap_max_tokens(*max_tokens);
        let max_tokens = *max_tokens;
        if prompt_len + max_tokens > max_len {
            return Err(ApiError::invalid_param(
                common.max_tokens_param.unwrap_or("max_tokens"),
                format!("This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({prompt_len} in the {prompt_param}, {max_tokens} in the completion). Please reduce the length of the {prompt_param} or completion.", prompt_len + max_tokens),
            ));
        }
    } else {
        if endpoint == Endpoint::Completions {
            sampling.max_tokens.get_or_insert(DEFAULT_COMPLETION_MAX_TOKENS);
        }
        sampling.max_tokens = match sampling.max_tokens {
            Some(n) => Some(generation_config.cap_max_tokens(n)),
            None => generation_config.max_tokens_cap,
        };
    }
    // Checked again once max_tokens may have been defaulted: vLLM refuses min > max.
    if let (Some(min), Some(max)) = (sampling.min_tokens, sampling.max_tokens) {
        check_min_tokens(min, max)?;
    }
    check_vocabulary(&common.stop_token_ids, "stop_token_ids", vocab_size)?;
    check_vocabulary(&common.logit_bias_ids, "logit_bias", vocab_size)?;
    if let Some(ids) = &common.allowed_token_ids {
        if ids.iter().any(|&t| t < 0 || t as u64 >= vocab_size as u64) {
            return Err(RULES.refuse("allowed_token_ids", "allowed_token_ids_out_of_vocab", &[]));
        }
    }
    if !common.vocabulary_read {
        check_logprobs(state, sampling)?;
    }
    // In the vocabulary, so each fits a u32.
    sampling.stop_token_ids = common.stop_token_ids.iter().map(|&t| t as u32).collect();
    generation_config.set_stop_token_ids(sampling, state.tokenizer.eos_token_id());

    let id = endpoint.external_id(&client_request_id(headers, common.request_id.take()));
    let pinned_rank = pinned_rank(headers)?;
    let request = EngineRequest {
        request_id: format!("{id}-{}", random_hex(8)),
        prompt_token_ids,
        sampling: common.sampling,
        arrival_time: unix_now_f64(),
        data_parallel_rank: None,
        client_index: 0,
        external_request_id: id.clone(),
        pooling: None,
    };
    let scored = request.sampling.logprobs.is_some() || request.sampling.prompt_logprobs.is_some();
    // As vLLM: a request may raise the server's stream interval, never lower it.
    let stream_interval = common.stream_interval.unwrap_or(1).max(state.config.stream_interval);
    let start = |request: EngineRequest, stop: Vec<String>| -> Result<Generation, ApiError> {
        if state.config.enable_log_requests {
            tracing::info!(
                request_id = %request.request_id,
                prompt_tokens = prompt_len,
                max_tokens = ?request.sampling.max_tokens,
                temperature = ?request.sampling.temperature,
                stream = common.stream,
                "received request"
            );
        }
        let decoder = state.tokenizer.decoder(&request.prompt_token_ids, common.decode);
        let stream = state.engines.submit(request, pinned_rank).map_err(|e| match e {
            SubmitError::RankOutOfRange { .. } => ApiError::invalid_param(DATA_PARALLEL_RANK_HEADER, e.to_string()),
            SubmitError::Unavailable(why) => ApiError::unavailable(why),
        })?;
        let generation =
            Generation::new(stream, decoder, stop, prompt_len as usize, state.metrics.clone(), common.n, started)
                .with_output_options(common.include_stop_str_in_output, common.return_token_ids)
                .with_stream_interval(stream_interval);
        Ok(if scored { generation.with_logprobs(state.tokenizer.clone()) } else { generation })
    };
    let prompt_token_ids = common.return_token_ids.then(|| request.prompt_token_ids.clone());
    if common.n <= 1 {
        let generation = start(request, common.stop)?;
        return Ok(Submitted { id, created: unix_now(), generation, more_choices: Vec::new(), prompt_token_ids });
    }
    // Each child goes to an engine of its own choosing, as vLLM's AsyncLLM adds
    // them; the ones already started are aborted (dropped) when one cannot be.
    let mut more_choices = child_requests(&request, common.n)
        .map(|child| start(child, common.stop.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let generation = more_choices.remove(0);
    Ok(Submitted { id, created: unix_now(), generation, more_choices, prompt_token_ids })
}

/// The `n` child requests of `request`, as vLLM's `ParentRequest` makes them:
/// ids `{index}_{request id}`, the same external id, seeds `seed + index`
/// when the request has a seed. The gRPC servicer fans out the same way.
pub fn child_requests(request: &EngineRequest, n: u32) -> impl Iterator<Item = EngineRequest> + '_ {
    (0..n).map(move |index| {
        let mut child = request.clone();
        child.request_id = format!("{index}_{}", request.request_id);
        // The seed was checked to leave room for n - 1 more.
        child.sampling.seed = request.sampling.seed.map(|seed| seed + i64::from(index));
        child
    })
}

/// vLLM's SamplingParams check against `--max-logprobs` (-1 counts as the
/// whole vocabulary on both sides); the gRPC servicer checks the same.
pub fn check_logprobs(state: &AppState, sampling: &SamplingParams) -> Result<(), ApiError> {
    let vocab = state.tokenizer.vocab_size() as i64;
    let limit = if state.config.max_logprobs == -1 { vocab } else { state.config.max_logprobs };
    for (param, key, value) in [
        ("logprobs", "logprobs_above_max", sampling.logprobs),
        ("prompt_logprobs", "prompt_logprobs_above_max", sampling.prompt_logprobs),
    ] {
        let Some(value) = value else { continue };
        let count = if value == -1 { vocab } else { value };
        if count > limit {
            return Err(RULES.refuse(param, key, &[("count", &count.to_string()), ("limit", &limit.to_string())]));
        }
    }
    Ok(())
}

/// 400 naming `param` when a token id lies outside the vocabulary, in vLLM's words.
fn check_vocabulary(ids: &[i64], param: &str, vocab_size: usize) -> Result<(), ApiError> {
    let outside: Vec<String> =
        ids.iter().filter(|&&t| t < 0 || t as u64 >= vocab_size as u64).map(i64::to_string).collect();
    if outside.is_empty() {
        return Ok(());
    }
    Err(RULES.refuse(
        param,
        "token_ids_out_of_vocab",
        &[
            ("token_ids", &format!("[{}]", outside.join(", "))),
            ("param", param),
            ("vocab_size", &vocab_size.to_string()),
        ],
    ))
}

/// `max_tokens` of a completion that does not say (OpenAI's default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u64 = 16;

/// The `X-Request-Id` header when it is a usable id, else the body's
/// `request_id` (already checked), else random hex: vLLM's `_base_request_id`.
pub(crate) fn client_request_id(headers: &HeaderMap, body_id: Option<String>) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .or(body_id)
        .unwrap_or_else(|| random_hex(32))
}

/// The engine `X-data-parallel-rank` pins a request to, or a 400.
pub(crate) fn pinned_rank(headers: &HeaderMap) -> Result<Option<u32>, ApiError> {
    let Some(value) = headers.get(DATA_PARALLEL_RANK_HEADER) else { return Ok(None) };
    value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()).map(Some).ok_or_else(|| {
        ApiError::invalid_param(DATA_PARALLEL_RANK_HEADER, "X-data-parallel-rank must be a non-negative integer")
    })
}

/// The `stop_reason` field: a token id, a stop string, or null.
pub fn stop_reason_json(reason: &Option<StopReason>) -> Value {
    match reason {
        None => Value::Null,
        Some(StopReason::Token(id)) => Value::from(*id),
        Some(StopReason::Text(s)) => Value::from(s.as_str()),
    }
}
