//! The messages of the engine-core protocol (docs: engine-protocol.md), as Rust types.

pub use super::logprob_rows::LogprobRows;
use smallvec::SmallVec;
use std::fmt;

/// Token ids of one engine output: up to 6 inline (the usual one per step),
/// so the hot path allocates nothing per output.
pub type TokenIds = SmallVec<[u32; 6]>;

/// Type byte of an ADD request.
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

/// Sampling parameters sent in slot 3 of an EngineCoreRequest; `None` fields are left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingParams {
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    pub top_p: Option<f64>,
    /// Top-k cut-off (-1: off).
    pub top_k: Option<i64>,
    /// Min-p cut-off.
    pub min_p: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Maximum number of generated tokens.
    pub max_tokens: Option<u64>,
    /// Minimum number of generated tokens before stop tokens count.
    pub min_tokens: Option<u64>,
    /// Seed for sampling.
    pub seed: Option<i64>,
    /// Token ids that stop generation (the request's own).
    pub stop_token_ids: Vec<u32>,
    /// Every stop token: the request's plus EOS unless `ignore_eos`.
    pub all_stop_token_ids: Vec<u32>,
    /// The tokenizer's EOS id, unless `ignore_eos`.
    pub eos_token_id: Option<u32>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// vLLM's `StructuredOutputsParams` as its encoder writes it (a map of every field).
    pub structured_outputs: Option<serde_json::Value>,
    /// Top logprobs per generated token (-1: the whole vocabulary), when asked for.
    pub logprobs: Option<i64>,
    /// Top logprobs per prompt token (-1: the whole vocabulary), when asked for.
    pub prompt_logprobs: Option<i64>,
}

/// One ADD request (EngineCoreRequest).
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
}

/// Why a request finished (EngineCoreOutput slot 5).
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

/// What stopped a request with reason STOP: a stop token id or a stop string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token id.
    Token(i64),
    /// A stop string.
    Text(String),
}

/// One EngineCoreOutput: new tokens of one request (the id borrowed from the frame).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOutput<'a> {
    /// The engine-side request id.
    pub request_id: &'a str,
    /// Tokens generated since the previous output.
    pub new_token_ids: TokenIds,
    /// Their logprobs, when the request asked for them (`new_logprobs`).
    pub logprobs: Option<Box<LogprobRows>>,
    /// The prompt's logprobs, once, when asked for (`new_prompt_logprobs_tensors`).
    pub prompt_logprobs: Option<Box<LogprobRows>>,
    /// Set on the last output of the request.
    pub finish_reason: Option<FinishReason>,
    /// What stopped it, when known.
    pub stop_reason: Option<StopReason>,
    /// Why the engine refused the request (sent with finish reason ERROR).
    pub error: Option<RequestError>,
    /// The request's lifecycle events since its previous output.
    pub events: SmallVec<[EngineEvent; 2]>,
    /// How its prompt was filled, with its first token (`prefill_stats`).
    pub prefill_stats: Option<PrefillStats>,
    /// NaNs the engine found in its logits (more than 0: corrupted).
    pub num_nans_in_logits: u32,
}

/// What happened to a request in its engine (vLLM's `EngineCoreEventType`).
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

/// How a request's prompt was filled (vLLM's `PrefillStats`): computed here,
/// found in the local prefix cache, or received from another instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// vLLM's `RequestError`: a request-level failure that leaves the engine
/// healthy (the request was refused on arrival or failed in a retryable way).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// `validation_error` for a request the engine refused as invalid.
    pub code: String,
    /// The engine's message.
    pub message: String,
    /// The client may send the request again.
    pub retryable: bool,
}

/// The part of an engine's scheduler stats the frontend uses: the counts
/// steer load balancing, and all of it feeds `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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
    /// Prompt tokens looked up in the prefix cache since the previous stats.
    pub prefix_cache_queries: u64,
    /// Of those, the tokens found cached.
    pub prefix_cache_hits: u64,
}

/// The reply to a UTILITY call.
#[derive(Clone, Debug, PartialEq)]
pub struct UtilityReply {
    /// The call id the frontend chose.
    pub call_id: i64,
    /// Set when the call failed.
    pub failure_message: Option<String>,
    /// The result value, when any.
    pub result: Option<rmpv::Value>,
}

/// One message received on the output socket (strings borrowed from the frame).
#[derive(Clone, Debug, PartialEq)]
pub enum OutputsMessage<'a> {
    /// Request outputs, scheduler stats and/or finished request ids.
    Batch {
        /// The engine that sent it.
        engine_index: u32,
        /// Per-request outputs.
        outputs: Vec<EngineOutput<'a>>,
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
        reply: UtilityReply,
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
