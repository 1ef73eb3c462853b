//! The `vllm:` metric families as vLLM 0.33's frontend registers them: names,
//! help texts, types, label sets and bucket bounds; and one engine's series
//! of each, made up front so that recording takes no registry lock.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use vllm_rs_wire::protocol::FinishReason;

/// Bucket bounds (seconds) of time to first token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// Bucket bounds (seconds) of inter-token latency and time per output token.
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Bucket bounds (seconds) of the request phases and end-to-end latency.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// Bucket bounds of the `n` request parameter.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// Bucket bounds of the preemptions of one request.
pub const NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];
/// Bucket bounds of the tokens one engine output batch computed.
pub const ITERATION_TOKENS_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
/// Bounds 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's
/// `build_1_2_5_buckets`, for the per-request token counts up to the model length).
pub fn one_two_five_buckets(max: u64) -> Vec<f64> {
    (0..20)
        .map(|exponent| 10u64.saturating_pow(exponent))
        .flat_map(|scale| [1u64, 2, 5].map(|mantissa| mantissa.saturating_mul(scale)))
        .take_while(|&bound| bound <= max)
        .map(|bound| bound as f64)
        .collect()
}

/// Every finish reason, in the order of [`EngineSeries::finished`].
pub const FINISH_REASONS: [FinishReason; 5] =
    [FinishReason::Stop, FinishReason::Length, FinishReason::Abort, FinishReason::Error, FinishReason::Repetition];

/// Where prompt tokens came from, in the order of [`EngineSeries::prompt_tokens_by_source`].
pub const PROMPT_TOKEN_SOURCES: [&str; 3] = ["local_compute", "local_cache_hit", "external_kv_transfer"];

/// The cache tiers prompt tokens are found in, in the order of
/// [`EngineSeries::prompt_tokens_cached_by_source`] (vLLM's `CacheHitSource`).
pub const CACHE_HIT_SOURCES: [&str; 5] = ["device", "host", "p2p", "disk", "external_unspecified"];

/// Why waiting requests wait, in the order of [`EngineSeries::waiting_by_reason`].
pub const WAITING_REASONS: [&str; 2] = ["capacity", "deferred"];

/// A counter of whole numbers.
pub type U64Counter = Counter<u64, AtomicU64>;
/// A gauge of whole numbers.
pub type U64Gauge = Gauge<u64, AtomicU64>;
/// A gauge of fractions.
pub type F64Gauge = Gauge<f64, AtomicU64>;

/// The labels of most families: the served model and the engine (its data
/// parallel rank). `model_name` is kept escaped for the text format.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    /// The served model name.
    pub model_name: String,
    /// The engine index.
    pub engine: u32,
}

/// The labels of `vllm:request_success`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedReasonLabels {
    model_name: String,
    engine: u32,
    finished_reason: &'static str,
}

/// The labels of `vllm:prompt_tokens_by_source`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PromptSourceLabels {
    model_name: String,
    engine: u32,
    source: &'static str,
}

/// The labels of `vllm:num_requests_waiting_by_reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingReasonLabels {
    model_name: String,
    engine: u32,
    reason: &'static str,
}

/// Makes the histograms of one family, with its bucket bounds.
#[derive(Clone)]
pub struct Buckets(pub Vec<f64>);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

type Histograms = Family<EngineLabels, Histogram, Buckets>;

/// The `vllm:` families, registered under vLLM's names.
pub struct Families {
    running: Family<EngineLabels, U64Gauge>,
    waiting: Family<EngineLabels, U64Gauge>,
    waiting_by_reason: Family<WaitingReasonLabels, U64Gauge>,
    kv_cache_usage: Family<EngineLabels, F64Gauge>,
    prefix_cache_queries: Family<EngineLabels, U64Counter>,
    prefix_cache_hits: Family<EngineLabels, U64Counter>,
    iteration_tokens: Histograms,
    num_preemptions: Family<EngineLabels, U64Counter>,
    prompt_tokens: Family<EngineLabels, U64Counter>,
    prompt_tokens_by_source: Family<PromptSourceLabels, U64Counter>,
    prompt_tokens_cached: Family<EngineLabels, U64Counter>,
    prompt_tokens_cached_by_source: Family<PromptSourceLabels, U64Counter>,
    generation_tokens: Family<EngineLabels, U64Counter>,
    corrupted_requests: Family<EngineLabels, U64Counter>,
    success: Family<FinishedReasonLabels, U64Counter>,
    request_prompt_tokens: Histograms,
    request_generation_tokens: Histograms,
    request_max_num_generation_tokens: Histograms,
    request_params_max_tokens: Histograms,
    request_params_n: Histograms,
    request_num_preemptions: Histograms,
    request_prefill_kv_computed_tokens: Histograms,
    time_to_first_token: Histograms,
    inter_token_latency: Histograms,
    e2e_latency: Histograms,
    queue_time: Histograms,
    prefill_time: Histograms,
    decode_time: Histograms,
    inference_time: Histograms,
    time_per_output_token: Histograms,
}

impl Families {
    /// The families, registered in `registry` in vLLM's order, the token
    /// counts bucketed up to `max_model_len`. (The crate ends each help text
    /// with a full stop, and counters' names with `_total`.)
    pub fn register(registry: &mut Registry, max_model_len: u64) -> Self {
        let histograms = |bounds: &[f64]| Family::new_with_constructor(Buckets(bounds.to_vec()));
        let token_counts = || Family::new_with_constructor(Buckets(one_two_five_buckets(max_model_len)));
        let f = Families {
            running: Family::default(),
            waiting: Family::default(),
            waiting_by_reason: Family::default(),
            kv_cache_usage: Family::default(),
            prefix_cache_queries: Family::default(),
            prefix_cache_hits: Family::default(),
            iteration_tokens: histograms(ITERATION_TOKENS_BUCKETS),
            num_preemptions: Family::default(),
            prompt_tokens: Family::default(),
            prompt_tokens_by_source: Family::default(),
            prompt_tokens_cached: Family::default(),
            prompt_tokens_cached_by_source: Family::default(),
            generation_tokens: Family::default(),
            corrupted_requests: Family::default(),
            success: Family::default(),
            request_prompt_tokens: token_counts(),
            request_generation_tokens: token_counts(),
            request_max_num_generation_tokens: token_counts(),
            request_params_max_tokens: token_counts(),
            request_params_n: histograms(PARAMS_N_BUCKETS),
            request_num_preemptions: histograms(NUM_PREEMPTIONS_BUCKETS),
            request_prefill_kv_computed_tokens: token_counts(),
            time_to_first_token: histograms(TTFT_BUCKETS),
            inter_token_latency: histograms(ITL_BUCKETS),
            e2e_latency: histograms(REQUEST_LATENCY_BUCKETS),
            queue_time: histograms(REQUEST_LATENCY_BUCKETS),
            prefill_time: histograms(REQUEST_LATENCY_BUCKETS),
            decode_time: histograms(REQUEST_LATENCY_BUCKETS),
            inference_time: histograms(REQUEST_LATENCY_BUCKETS),
            time_per_output_token: histograms(ITL_BUCKETS),
        };
        let r = registry;
        r.register("vllm:num_requests_running", "Number of requests in model execution batches", f.running.clone());
        r.register("vllm:num_requests_waiting", "Number of requests waiting to be processed", f.waiting.clone());
        r.register(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; \
             'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). \
             Sum of all reasons equals vllm:num_requests_waiting",
            f.waiting_by_reason.clone(),
        );
        r.register("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage", f.kv_cache_usage.clone());
        r.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens",
            f.prefix_cache_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens",
            f.prefix_cache_hits.clone(),
        );
        r.register(
            "vllm:iteration_tokens_total",
            "Histogram of computed prompt and generated tokens per nonempty engine output batch",
            f.iteration_tokens.clone(),
        );
        r.register("vllm:num_preemptions", "Cumulative number of preemption events", f.num_preemptions.clone());
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens summed over sequences, including prefix-cache hits; each parallel-sampling child \
             counts its prompt separately. Equals the sum of vllm:prompt_tokens_by_source_total",
            f.prompt_tokens.clone(),
        );
        r.register(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source",
            f.prompt_tokens_by_source.clone(),
        );
        r.register(
            "vllm:prompt_tokens_cached",
            "Number of prompt tokens with prefix cache hits",
            f.prompt_tokens_cached.clone(),
        );
        r.register(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded \
             to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at \
             admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits",
            f.prompt_tokens_cached_by_source.clone(),
        );
        r.register("vllm:generation_tokens", "Number of generation tokens processed", f.generation_tokens.clone());
        r.register(
            "vllm:corrupted_requests",
            "Corrupted requests, in terms of total number of requests with NaNs in logits",
            f.corrupted_requests.clone(),
        );
        r.register("vllm:request_success", "Count of successfully processed requests", f.success.clone());
        r.register(
            "vllm:request_prompt_tokens",
            "Prompt length of each finished sequence; each parallel-sampling child is one observation",
            f.request_prompt_tokens.clone(),
        );
        r.register(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed",
            f.request_generation_tokens.clone(),
        );
        r.register(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens",
            f.request_max_num_generation_tokens.clone(),
        );
        r.register(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter",
            f.request_params_max_tokens.clone(),
        );
        r.register("vllm:request_params_n", "Histogram of the n request parameter", f.request_params_n.clone());
        r.register(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted",
            f.request_num_preemptions.clone(),
        );
        r.register(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens)",
            f.request_prefill_kv_computed_tokens.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            f.time_to_first_token.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            f.inter_token_latency.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds",
            f.e2e_latency.clone(),
        );
        r.register(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request",
            f.queue_time.clone(),
        );
        r.register(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request",
            f.prefill_time.clone(),
        );
        r.register(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request",
            f.decode_time.clone(),
        );
        r.register(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request",
            f.inference_time.clone(),
        );
        r.register(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request",
            f.time_per_output_token.clone(),
        );
        f
    }

    /// Engine `engine`'s series of every family (handles sharing the families' values).
    pub fn series(&self, model_name: &str, engine: u32) -> EngineSeries {
        let labels = EngineLabels { model_name: model_name.to_owned(), engine };
        let model_name = || model_name.to_owned();
        let one = |family: &Histograms| family.get_or_create(&labels).clone();
        EngineSeries {
            running: self.running.get_or_create(&labels).clone(),
            waiting: self.waiting.get_or_create(&labels).clone(),
            waiting_by_reason: WAITING_REASONS.map(|reason| {
                let labels = WaitingReasonLabels { model_name: model_name(), engine, reason };
                self.waiting_by_reason.get_or_create(&labels).clone()
            }),
            kv_cache_usage: self.kv_cache_usage.get_or_create(&labels).clone(),
            prefix_cache_queries: self.prefix_cache_queries.get_or_create(&labels).clone(),
            prefix_cache_hits: self.prefix_cache_hits.get_or_create(&labels).clone(),
            iteration_tokens: one(&self.iteration_tokens),
            num_preemptions: self.num_preemptions.get_or_create(&labels).clone(),
            prompt_tokens: self.prompt_tokens.get_or_create(&labels).clone(),
            prompt_tokens_by_source: PROMPT_TOKEN_SOURCES.map(|source| {
                let labels = PromptSourceLabels { model_name: model_name(), engine, source };
                self.prompt_tokens_by_source.get_or_create(&labels).clone()
            }),
            prompt_tokens_cached: self.prompt_tokens_cached.get_or_create(&labels).clone(),
            prompt_tokens_cached_by_source: CACHE_HIT_SOURCES.map(|source| {
                let labels = PromptSourceLabels { model_name: model_name(), engine, source };
                self.prompt_tokens_cached_by_source.get_or_create(&labels).clone()
            }),
            generation_tokens: self.generation_tokens.get_or_create(&labels).clone(),
            corrupted_requests: self.corrupted_requests.get_or_create(&labels).clone(),
            finished: FINISH_REASONS.map(|reason| {
                let labels =
                    FinishedReasonLabels { model_name: model_name(), engine, finished_reason: reason.as_str() };
                self.success.get_or_create(&labels).clone()
            }),
            request_prompt_tokens: one(&self.request_prompt_tokens),
            request_generation_tokens: one(&self.request_generation_tokens),
            request_max_num_generation_tokens: one(&self.request_max_num_generation_tokens),
            request_params_max_tokens: one(&self.request_params_max_tokens),
            request_params_n: one(&self.request_params_n),
            request_num_preemptions: one(&self.request_num_preemptions),
            request_prefill_kv_computed_tokens: one(&self.request_prefill_kv_computed_tokens),
            time_to_first_token: one(&self.time_to_first_token),
            inter_token_latency: one(&self.inter_token_latency),
            e2e_latency: one(&self.e2e_latency),
            queue_time: one(&self.queue_time),
            prefill_time: one(&self.prefill_time),
            decode_time: one(&self.decode_time),
            inference_time: one(&self.inference_time),
            time_per_output_token: one(&self.time_per_output_token),
        }
    }
}

/// One engine's series of every `vllm:` family.
#[derive(Debug)]
pub struct EngineSeries {
    /// `vllm:num_requests_running`.
    pub running: U64Gauge,
    /// `vllm:num_requests_waiting`.
    pub waiting: U64Gauge,
    /// `vllm:num_requests_waiting_by_reason`, in the order of [`WAITING_REASONS`].
    pub waiting_by_reason: [U64Gauge; 2],
    /// `vllm:kv_cache_usage_perc`.
    pub kv_cache_usage: F64Gauge,
    /// `vllm:prefix_cache_queries`.
    pub prefix_cache_queries: U64Counter,
    /// `vllm:prefix_cache_hits`.
    pub prefix_cache_hits: U64Counter,
    /// `vllm:iteration_tokens_total`.
    pub iteration_tokens: Histogram,
    /// `vllm:num_preemptions`.
    pub num_preemptions: U64Counter,
    /// `vllm:prompt_tokens`.
    pub prompt_tokens: U64Counter,
    /// `vllm:prompt_tokens_by_source`, in the order of [`PROMPT_TOKEN_SOURCES`].
    pub prompt_tokens_by_source: [U64Counter; 3],
    /// `vllm:prompt_tokens_cached`.
    pub prompt_tokens_cached: U64Counter,
    /// `vllm:prompt_tokens_cached_by_source`, in the order of [`CACHE_HIT_SOURCES`].
    pub prompt_tokens_cached_by_source: [U64Counter; 5],
    /// `vllm:generation_tokens`.
    pub generation_tokens: U64Counter,
    /// `vllm:corrupted_requests`.
    pub corrupted_requests: U64Counter,
    /// `vllm:request_success`, in the order of [`FINISH_REASONS`].
    pub finished: [U64Counter; 5],
    /// `vllm:request_prompt_tokens`.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_max_num_generation_tokens`.
    pub request_max_num_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`.
    pub request_params_max_tokens: Histogram,
    /// `vllm:request_params_n`.
    pub request_params_n: Histogram,
    /// `vllm:request_num_preemptions`.
    pub request_num_preemptions: Histogram,
    /// `vllm:request_prefill_kv_computed_tokens`.
    pub request_prefill_kv_computed_tokens: Histogram,
    /// `vllm:time_to_first_token_seconds`.
    pub time_to_first_token: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub inter_token_latency: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e_latency: Histogram,
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// `vllm:request_prefill_time_seconds`.
    pub prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`.
    pub decode_time: Histogram,
    /// `vllm:request_inference_time_seconds`.
    pub inference_time: Histogram,
    /// `vllm:request_time_per_output_token_seconds`.
    pub time_per_output_token: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_stop_at_the_maximum() {
        assert_eq!(one_two_five_buckets(128), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(one_two_five_buckets(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(one_two_five_buckets(131_072).last(), Some(&100_000.0));
    }
}
