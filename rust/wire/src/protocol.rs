//! The messages of the engine-core protocol (docs: engine-protocol.md) as Rust
//! types whose serde derives are their encoding. vLLM's `array_like` structs
//! are tuple-encoded (`Serialize_tuple` / `Deserialize_tuple`: the field order
//! is the slot order, a short array takes the trailing defaults, and slots a
//! newer vLLM appends to an engine's messages are skipped); its maps
//! (sampling params, dataclasses) are plain derives whose field names are the
//! keys, unknown keys skipped. Each type names the vLLM 0.33 definition it mirrors.

pub use super::logprob_rows::{LogprobRows, Logprobs, Pooled};
use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_tuple::{Deserialize_tuple, Serialize_tuple};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;

/// Token ids of one engine output: up to 6 inline (the usual one per step),
/// so the hot path allocates nothing per output.
pub type TokenIds = SmallVec<[u32; 6]>;

/// Type byte of an ADD request (vLLM's `EngineCoreRequestType.ADD`).
pub const REQUEST_ADD: u8 = 0x00;
/// Type byte of an ABORT request.
pub const REQUEST_ABORT: u8 = 0x01;
/// Type byte of a UTILITY call.
pub const REQUEST_UTILITY: u8 = 0x03;
/// The single-frame message an engine sends on its output socket when it dies.
pub const ENGINE_CORE_DEAD: &[u8] = b"ENGINE_CORE_DEAD";

/// The ZeroMQ routing identity of engine `index`: 2 bytes little-endian.
pub fn engine_identity(index: u32) -> [u8; 2] {
    (index as u16).to_le_bytes()
}

/// A slot or field this frontend never fills and never reads: nil when
/// sent, and whatever an engine put there is skipped unread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unused;

impl Serialize for Unused {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_none()
    }
}

impl<'de> Deserialize<'de> for Unused {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer).map(|_| Unused)
    }
}

/// A count an engine may leave nil (this project's mock and older engines
/// do): nil reads as 0, as the hand codec read it.
fn nil_as_zero<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    Option::<u32>::deserialize(deserializer).map(Option::unwrap_or_default)
}

/// An `array_like` struct read from an array that may hold more slots than
/// `T` names: a vLLM newer than 0.33 appends slots at the end, and they are
/// skipped unread, so such an engine is still served. The slots `T` names are
/// read as `T` reads them (a short array still takes the trailing defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct LaterSlotsSkipped<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LaterSlotsSkipped<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Slots<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Slots<T> {
            type Value = LaterSlotsSkipped<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of slots")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let value = T::deserialize(de::value::SeqAccessDeserializer::new(&mut seq))?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LaterSlotsSkipped(value))
            }
        }
        deserializer.deserialize_seq(Slots(std::marker::PhantomData))
    }
}

/// The `outputs` slot: nil reads as none, and each output's later slots are skipped.
fn outputs_later_slots_skipped<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<EngineCoreOutput<'de>>, D::Error> {
    let outputs = Option::<Vec<LaterSlotsSkipped<EngineCoreOutput<'de>>>>::deserialize(deserializer)?;
    Ok(outputs.unwrap_or_default().into_iter().map(|output| output.0).collect())
}

/// The `utility_output` slot, its later slots skipped.
fn utility_later_slots_skipped<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<UtilityOutput>, D::Error> {
    Ok(Option::<LaterSlotsSkipped<UtilityOutput>>::deserialize(deserializer)?.map(|reply| reply.0))
}

fn is_false(flag: &bool) -> bool {
    !flag
}

/// vLLM 0.33's `vllm/sampling_params.py::SamplingParams` (a msgspec struct
/// with `omit_defaults`, encoded as a map): the fields this frontend sets, in
/// vLLM's order. A field left out (`None`, `false`) takes vLLM's default in the
/// engine; the stop-id lists are always sent, as vLLM's encoder does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Presence penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Repetition penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k cut-off (-1: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Min-p cut-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Seed for sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Token ids that stop generation (the request's own).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ignore_eos: bool,
    /// Maximum number of generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Minimum number of generated tokens before stop tokens count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u64>,
    /// Top logprobs per generated token (-1: the whole vocabulary), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<i64>,
    /// Top logprobs per prompt token (-1: the whole vocabulary), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<i64>,
    /// The tokenizer's EOS id, unless `ignore_eos`.
    #[serde(rename = "_eos_token_id", default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
    /// Every stop token: the request's plus EOS unless `ignore_eos`.
    #[serde(rename = "_all_stop_token_ids", default)]
    pub all_stop_token_ids: Vec<u32>,
    /// vLLM's `StructuredOutputsParams` as its encoder writes it (a map of every field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<serde_json::Value>,
}

/// One ADD request as this frontend builds it; [`EngineCoreRequest::new`]
/// borrows it for the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// Id inside the engine: the external id plus `-` and 8 random hex digits.
    pub request_id: String,
    /// The prompt as token ids.
    pub prompt_token_ids: Vec<u32>,
    /// How to sample.
    pub sampling: SamplingParams,
    /// When the HTTP request arrived (unix seconds).
    pub arrival_time: f64,
    /// Engine pinned by `X-data-parallel-rank`, if any.
    pub data_parallel_rank: Option<u32>,
    /// Index of this frontend among the engines' clients.
    pub client_index: u32,
    /// The id the client sees (`cmpl-X`, `chatcmpl-X`).
    pub external_request_id: String,
    /// A pooling request's parameters (then `sampling` is not sent).
    pub pooling: Option<PoolingParams>,
}

/// vLLM 0.33's `vllm/pooling_params.py::PoolingParams` (array_like, all 11
/// slots sent as vLLM's encoder sends them). vLLM 0.33 removed `normalize`
/// (an embedding's `use_activation` is its L2 normalization) and
/// `truncate_prompt_tokens` (the frontend cuts prompts before sending).
#[derive(Clone, Debug, PartialEq, Serialize_tuple, Deserialize_tuple)]
pub struct PoolingParams {
    /// Apply the pooler's activation: L2 normalization of an embedding, the
    /// classifier's sigmoid or softmax (None: the model's default).
    #[serde(default)]
    pub use_activation: Option<bool>,
    /// Matryoshka output size of an embedding.
    #[serde(default)]
    pub dimensions: Option<u32>,
    /// Step pooling: not used.
    #[serde(default)]
    pub step_tag_id: Option<i64>,
    /// Step pooling: not used.
    #[serde(default)]
    pub returned_token_ids: Option<Vec<u32>>,
    /// `embed`, `classify`, `token_embed` or `token_classify`.
    #[serde(default)]
    pub task: Option<String>,
    /// Whether outputs need the prompt's token ids: never.
    #[serde(default)]
    pub requires_token_ids: bool,
    /// Skip the prefix cache: the engine's default.
    #[serde(default)]
    pub skip_reading_prefix_cache: Option<bool>,
    /// Late-interaction scoring: not used.
    #[serde(default)]
    pub late_interaction_params: Unused,
    /// `compressed_token_type_ids` of a cross-encoder pair: where the second text starts.
    #[serde(default)]
    pub extra_kwargs: Option<std::collections::BTreeMap<String, u64>>,
    /// vLLM's `RequestOutputKind`: the final output only.
    #[serde(default = "final_only")]
    pub output_kind: u8,
    /// Late chunking of token embeddings: not used.
    #[serde(default)]
    pub late_chunking_params: Unused,
}

/// `RequestOutputKind.FINAL_ONLY`, vLLM's default for pooling.
const FINAL_ONLY: u8 = 2;

fn final_only() -> u8 {
    FINAL_ONLY
}

impl Default for PoolingParams {
    fn default() -> Self {
        Self {
            use_activation: None,
            dimensions: None,
            step_tag_id: None,
            returned_token_ids: None,
            task: None,
            requires_token_ids: false,
            skip_reading_prefix_cache: None,
            late_interaction_params: Unused,
            extra_kwargs: None,
            output_kind: FINAL_ONLY,
            late_chunking_params: Unused,
        }
    }
}

/// vLLM 0.33's `vllm/v1/engine/__init__.py::EngineCoreRequest` (array_like:
/// each field is a slot, in this order, all 22 sent as vLLM sends them).
/// Strings and lists borrow from an [`EngineRequest`] when encoding; decoding
/// (tests read vLLM's own requests with it) owns them.
#[derive(Clone, Debug, PartialEq, Serialize_tuple, Deserialize_tuple)]
pub struct EngineCoreRequest<'a> {
    /// Id inside the engine.
    pub request_id: Cow<'a, str>,
    /// The prompt as token ids.
    pub prompt_token_ids: Cow<'a, [u32]>,
    /// Multimodal inputs: none from this frontend.
    pub mm_features: Unused,
    /// How to sample (nil for a pooling request).
    pub sampling_params: Option<Cow<'a, SamplingParams>>,
    /// How to pool (nil for a generation request).
    pub pooling_params: Option<Cow<'a, PoolingParams>>,
    /// When the request arrived (unix seconds).
    pub arrival_time: f64,
    /// LoRA adapters: not served.
    pub lora_request: Unused,
    /// Prefix-cache salt.
    pub cache_salt: Option<Cow<'a, str>>,
    /// The engine the request was pinned to, if any.
    pub data_parallel_rank: Option<u32>,
    /// Prompt embeddings: not served.
    #[serde(default)]
    pub prompt_embeds: Unused,
    /// Mixed token/embedding prompts: not served.
    #[serde(default)]
    pub prompt_is_token_ids: Unused,
    /// Which frontend gets the outputs.
    #[serde(default)]
    pub client_index: u32,
    /// The data-parallel request wave (the coordinator's; 0 without one).
    #[serde(default)]
    pub current_wave: u64,
    /// Scheduling priority.
    #[serde(default)]
    pub priority: i32,
    /// Tracing headers: none.
    #[serde(default)]
    pub trace_headers: Unused,
    /// Whether the request may be resumed.
    #[serde(default)]
    pub resumable: bool,
    /// The id the client sees.
    #[serde(default)]
    pub external_req_id: Option<Cow<'a, str>>,
    /// Whether reasoning already ended in the prompt.
    #[serde(default)]
    pub reasoning_ended: Option<bool>,
    /// Reasoning-parser kwargs for structured outputs: none.
    #[serde(default)]
    pub reasoning_parser_kwargs: Unused,
    /// Add the request only to abort it at once.
    #[serde(default)]
    pub abort_immediately: bool,
    /// Session shared by related requests.
    #[serde(default)]
    pub session_id: Option<Cow<'a, str>>,
    /// KV hints: none.
    #[serde(default)]
    pub kv_hints: Unused,
}

impl<'a> EngineCoreRequest<'a> {
    /// The wire form of `request` for request wave `current_wave`, borrowing its strings and lists.
    pub fn new(request: &'a EngineRequest, current_wave: u64) -> Self {
        EngineCoreRequest {
            request_id: Cow::Borrowed(&request.request_id),
            prompt_token_ids: Cow::Borrowed(&request.prompt_token_ids),
            mm_features: Unused,
            sampling_params: request.pooling.is_none().then_some(Cow::Borrowed(&request.sampling)),
            pooling_params: request.pooling.as_ref().map(Cow::Borrowed),
            arrival_time: request.arrival_time,
            lora_request: Unused,
            cache_salt: None,
            data_parallel_rank: request.data_parallel_rank,
            prompt_embeds: Unused,
            prompt_is_token_ids: Unused,
            client_index: request.client_index,
            current_wave,
            priority: 0,
            trace_headers: Unused,
            resumable: false,
            external_req_id: Some(Cow::Borrowed(&request.external_request_id)),
            reasoning_ended: None,
            reasoning_parser_kwargs: Unused,
            abort_immediately: false,
            session_id: None,
            kv_hints: Unused,
        }
    }
}

/// A UTILITY payload: the tuple `(client_index, call_id, method, args)` that
/// vLLM 0.33's `vllm/v1/engine/core_client.py::AsyncMPClient._call_utility_async` sends.
#[derive(Clone, Debug, PartialEq, Serialize_tuple)]
pub struct UtilityCall<'a> {
    /// Which frontend gets the reply.
    pub client_index: u32,
    /// The id the reply carries back.
    pub call_id: i64,
    /// The engine method.
    pub method: &'a str,
    /// Its positional arguments.
    pub args: &'a [rmpv::Value],
}

/// Why a request finished: vLLM 0.33's
/// `vllm/v1/engine/__init__.py::FinishReason` (an IntEnum, sent as its value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A stop token, a stop string or EOS.
    Stop,
    /// `max_tokens` or the model length reached.
    Length,
    /// Aborted.
    Abort,
    /// The engine failed the request.
    Error,
    /// Stopped for repetition.
    Repetition,
}

impl FinishReason {
    /// The reason for a wire code (STOP=0 .. REPETITION=4).
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => FinishReason::Stop,
            1 => FinishReason::Length,
            2 => FinishReason::Abort,
            3 => FinishReason::Error,
            4 => FinishReason::Repetition,
            _ => return None,
        })
    }

    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
            FinishReason::Repetition => "repetition",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = i64::deserialize(deserializer)?;
        FinishReason::from_code(code).ok_or_else(|| de::Error::custom(format!("unknown finish_reason {code}")))
    }
}

/// What stopped a request with reason STOP: `stop_reason: int | str | None`
/// of vLLM 0.33's `EngineCoreOutput` (a stop token id or a stop string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token id.
    Token(i64),
    /// A stop string.
    Text(String),
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokenOrText;
        impl Visitor<'_> for TokenOrText {
            type Value = StopReason;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stop token id or a stop string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StopReason, E> {
                Ok(StopReason::Token(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StopReason, E> {
                i64::try_from(v).map(StopReason::Token).map_err(|_| E::custom(format!("stop token {v} out of range")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StopReason, E> {
                Ok(StopReason::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(TokenOrText)
    }
}

/// One EngineCoreOutput: new tokens of one request. vLLM 0.33's
/// `vllm/v1/engine/__init__.py::EngineCoreOutput` (array_like, 19 slots;
/// the request id borrowed from the frame, logprobs resolved by `decode_outputs`).
#[derive(Clone, Debug, PartialEq, Deserialize_tuple)]
pub struct EngineCoreOutput<'a> {
    /// The engine-side request id.
    pub request_id: &'a str,
    /// Tokens generated since the previous output.
    pub new_token_ids: TokenIds,
    /// Their logprobs, when the request asked for them (vLLM's `LogprobsLists`).
    #[serde(default, borrow)]
    pub new_logprobs: Option<Logprobs<'a>>,
    /// The prompt's logprobs, once, when asked for (vLLM's `LogprobsTensors`).
    #[serde(default, borrow)]
    pub new_prompt_logprobs_tensors: Option<Logprobs<'a>>,
    /// A pooling request's result (a float tensor), resolved by `decode_outputs`.
    #[serde(default, borrow)]
    pub pooling_output: Option<Pooled<'a>>,
    /// Set on the last output of the request.
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    /// What stopped it, when known.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// The request's lifecycle events since its previous output (kinds this
    /// frontend does not know are left out).
    #[serde(default, deserialize_with = "known_events")]
    pub events: SmallVec<[EngineEvent; 2]>,
    /// KV-transfer parameters: not used.
    #[serde(default)]
    pub kv_transfer_params: Unused,
    /// Encoder-cache transfer parameters: not used.
    #[serde(default)]
    pub ec_transfer_params: Unused,
    /// Tracing headers: not used.
    #[serde(default)]
    pub trace_headers: Unused,
    /// How its prompt was filled, with its first token.
    #[serde(default)]
    pub prefill_stats: Option<PrefillStats>,
    /// Routed experts: not used.
    #[serde(default)]
    pub routed_experts: Unused,
    /// NaNs the engine found in its logits (more than 0: corrupted).
    #[serde(default, deserialize_with = "nil_as_zero")]
    pub num_nans_in_logits: u32,
    /// Multimodal cache misses: not used.
    #[serde(default)]
    pub mm_cache_miss_hashes: Unused,
    /// Sampling masks: not used.
    #[serde(default)]
    pub new_sampling_mask: Unused,
    /// Speculative-decoding metrics: not used.
    #[serde(default)]
    pub spec_decode_metrics: Unused,
    /// Logprobs of chosen prompt token ids: not used.
    #[serde(default)]
    pub prompt_token_id_logprobs: Unused,
    /// Why the engine refused the request (sent with finish reason ERROR).
    #[serde(default)]
    pub error: Option<RequestError>,
}

/// What happened to a request in its engine: vLLM 0.33's
/// `vllm/v1/engine/__init__.py::EngineCoreEventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineEventKind {
    /// It joined the waiting queue.
    Queued,
    /// It was scheduled (again, after a preemption).
    Scheduled,
    /// It was preempted: its KV cache freed, to be computed again later.
    Preempted,
}

impl EngineEventKind {
    /// The kind for a wire code (QUEUED=1, SCHEDULED=2, PREEMPTED=3).
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            1 => EngineEventKind::Queued,
            2 => EngineEventKind::Scheduled,
            3 => EngineEventKind::Preempted,
            _ => return None,
        })
    }
}

/// One timestamped request event (vLLM's `EngineCoreEvent`); `timestamp` is
/// the engine's monotonic clock, comparable only with that engine's others.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineEvent {
    /// What happened.
    pub kind: EngineEventKind,
    /// When, in engine seconds.
    pub timestamp: f64,
}

/// vLLM 0.33's `vllm/v1/engine/__init__.py::EngineCoreEvent` as sent (a map);
/// its kind stays a code so that a kind added later is skipped, not an error.
#[derive(Deserialize)]
struct EngineCoreEvent {
    r#type: i64,
    timestamp: f64,
}

/// `events` (nil or a list), keeping the kinds this frontend knows.
fn known_events<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SmallVec<[EngineEvent; 2]>, D::Error> {
    let events = Option::<SmallVec<[EngineCoreEvent; 2]>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(events
        .into_iter()
        .filter_map(|e| EngineEventKind::from_code(e.r#type).map(|kind| EngineEvent { kind, timestamp: e.timestamp }))
        .collect())
}

/// How a request's prompt was filled: vLLM 0.33's
/// `vllm/v1/metrics/stats.py::PrefillStats` (a dataclass, sent as a map):
/// computed here, found in the local prefix cache, or received from another instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PrefillStats {
    /// Prompt tokens in all.
    pub num_prompt_tokens: u64,
    /// Prompt tokens computed.
    pub num_computed_tokens: u64,
    /// Prompt tokens not computed: local plus external cache hits.
    pub num_cached_tokens: u64,
    /// Prompt tokens found in the local prefix cache.
    pub num_local_cached_tokens: u64,
    /// Prompt tokens transferred from elsewhere (a KV connector).
    pub num_external_cached_tokens: u64,
}

/// vLLM 0.33's `vllm/v1/engine/__init__.py::RequestError` (sent as a map):
/// a request-level failure that leaves the engine healthy (the request was
/// refused on arrival or failed in a retryable way).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RequestError {
    /// `validation_error` for a request the engine refused as invalid.
    pub code: String,
    /// The engine's message.
    pub message: String,
    /// The client may send the request again.
    pub retryable: bool,
}

/// The part of an engine's scheduler stats the frontend uses: vLLM 0.33's
/// `vllm/v1/metrics/stats.py::SchedulerStats` (a dataclass, sent as a map
/// of every field; the others are skipped). The counts steer load balancing,
/// and all of it feeds `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SchedulerStats {
    /// Requests running in the engine.
    pub num_running_reqs: u64,
    /// Requests waiting in the engine for capacity.
    pub num_waiting_reqs: u64,
    /// Waiting requests deferred by a transient constraint instead (not
    /// among `num_waiting_reqs`).
    pub num_skipped_waiting_reqs: u64,
    /// Fraction of the KV cache in use, 0 to 1.
    pub kv_cache_usage: f64,
    /// The prefix cache's counts since the previous stats (nil: none).
    #[serde(deserialize_with = "nil_as_default")]
    pub prefix_cache_stats: PrefixCacheStats,
}

/// vLLM 0.33's `vllm/v1/metrics/stats.py::PrefixCacheStats` (a map): the
/// counts this frontend exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up in the prefix cache.
    pub queries: u64,
    /// Of those, the tokens found cached.
    pub hits: u64,
}

/// A field vLLM may send as nil, read as its default then.
fn nil_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(deserializer: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The reply to a UTILITY call: vLLM 0.33's
/// `vllm/v1/engine/__init__.py::UtilityOutput` (array_like).
#[derive(Clone, Debug, PartialEq, Deserialize_tuple)]
pub struct UtilityOutput {
    /// The call id the frontend chose.
    pub call_id: i64,
    /// Set when the call failed.
    #[serde(default)]
    pub failure_message: Option<String>,
    /// The result, when the call succeeded.
    #[serde(default)]
    pub result: Option<UtilityResult>,
}

/// vLLM 0.33's `vllm/v1/serial_utils.py::UtilityResult` as its encoder
/// writes it: `[type_info, value]`; the value is read as a generic msgpack value.
#[derive(Clone, Debug, PartialEq, Deserialize_tuple)]
pub struct UtilityResult {
    /// How vLLM rebuilds the value's Python type: not needed here.
    pub type_info: Unused,
    /// The value (`None` for nil).
    #[serde(default)]
    pub value: Option<rmpv::Value>,
}

/// One message of the output socket: vLLM 0.33's
/// `vllm/v1/engine/__init__.py::EngineCoreOutputs` (array_like, 9 slots; a
/// short array takes the trailing defaults, and so does a nil slot).
/// `decode_outputs` tells its kinds apart.
#[derive(Clone, Debug, PartialEq, Deserialize_tuple)]
pub struct EngineCoreOutputs<'a> {
    /// The engine that sent it.
    #[serde(default, deserialize_with = "nil_as_default")]
    pub engine_index: u32,
    /// Per-request outputs.
    #[serde(default, borrow, deserialize_with = "outputs_later_slots_skipped")]
    pub outputs: Vec<EngineCoreOutput<'a>>,
    /// Scheduler stats, when sent.
    #[serde(default)]
    pub scheduler_stats: Option<SchedulerStats>,
    /// When the engine sent it (its monotonic clock, seconds).
    #[serde(default, deserialize_with = "nil_as_default")]
    pub timestamp: f64,
    /// A utility reply.
    #[serde(default, deserialize_with = "utility_later_slots_skipped")]
    pub utility_output: Option<UtilityOutput>,
    /// Ids of requests the engine finished.
    #[serde(default, borrow)]
    pub finished_requests: Option<Vec<&'a str>>,
    /// Data-parallel wave that completed, if any.
    #[serde(default)]
    pub wave_complete: Option<i64>,
    /// Data-parallel wave to start, if any.
    #[serde(default)]
    pub start_wave: Option<i64>,
    /// Weight version: not used.
    #[serde(default)]
    pub weight_version: Unused,
}

/// One message received on the output socket, by kind (strings borrowed from the frame).
#[derive(Clone, Debug, PartialEq)]
pub enum OutputsMessage<'a> {
    /// Request outputs, scheduler stats and/or finished request ids.
    Batch {
        /// The engine that sent it.
        engine_index: u32,
        /// Per-request outputs.
        outputs: Vec<EngineCoreOutput<'a>>,
        /// When the engine sent it (its monotonic clock, seconds).
        timestamp: f64,
        /// Scheduler stats, when sent.
        stats: Option<SchedulerStats>,
        /// Ids of requests the engine finished.
        finished_requests: Vec<&'a str>,
    },
    /// A utility reply.
    Utility {
        /// The engine that sent it.
        engine_index: u32,
        /// The reply.
        reply: UtilityOutput,
    },
    /// A data-parallel wave message.
    Wave {
        /// The engine that sent it.
        engine_index: u32,
        /// Wave that completed, if any.
        wave_complete: Option<i64>,
        /// Wave to start, if any.
        start_wave: Option<i64>,
    },
    /// The engine died (the `ENGINE_CORE_DEAD` frame).
    EngineDead,
}

/// An engine's registration message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registration {
    /// The engine's maximum model length, when it says.
    pub max_model_len: Option<u64>,
    /// KV-cache blocks, when it says.
    pub num_gpu_blocks: Option<u64>,
    /// Where it publishes data-parallel stats, when it does.
    pub dp_stats_address: Option<String>,
}
