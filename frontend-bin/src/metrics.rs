//! Prometheus metrics in vLLM's names, help texts and buckets, kept and
//! rendered for `GET /metrics` by the `prometheus-client` crate (OpenMetrics text).

use crate::engine::protocol::FinishReason;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds (seconds) for time to first token.
const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Bucket bounds (seconds) for inter-token latency.
const ITL_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0];
/// Bucket bounds (seconds) for end-to-end latency.
const E2E_BUCKETS: &[f64] =
    &[0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0];

/// Every finish reason, in the order of [`Metrics::finished`].
const FINISH_REASONS: [FinishReason; 5] =
    [FinishReason::Stop, FinishReason::Length, FinishReason::Abort, FinishReason::Error, FinishReason::Repetition];

/// The label every metric has besides the model name: the engine (its data
/// parallel rank) the request went to, as vLLM labels its metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineLabel {
    engine: u32,
}

/// The labels of `vllm:request_success`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedLabel {
    engine: u32,
    finished_reason: &'static str,
}

/// One engine's series of every metric.
#[derive(Debug)]
struct EngineSeries {
    running: Gauge,
    /// Per finish reason, in the order of `FINISH_REASONS`.
    finished: [Counter; 5],
    prompt_tokens: Counter,
    generation_tokens: Counter,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    e2e_latency: Histogram,
}

/// The families (one series per engine) registered under vLLM's names.
struct Families {
    running: Family<EngineLabel, Gauge>,
    success: Family<FinishedLabel, Counter>,
    prompt_tokens: Family<EngineLabel, Counter>,
    generation_tokens: Family<EngineLabel, Counter>,
    time_to_first_token: Family<EngineLabel, Histogram, Buckets>,
    inter_token_latency: Family<EngineLabel, Histogram, Buckets>,
    e2e_latency: Family<EngineLabel, Histogram, Buckets>,
}

/// Makes the histograms of one family, with its bucket bounds.
#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

impl Families {
    /// The families, registered in `registry`.
    fn register(registry: &mut Registry) -> Self {
        let histograms = |bounds| Family::new_with_constructor(Buckets(bounds));
        let families = Families {
            running: Family::default(),
            success: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            time_to_first_token: histograms(TTFT_BUCKETS),
            inter_token_latency: histograms(ITL_BUCKETS),
            e2e_latency: histograms(E2E_BUCKETS),
        };
        // The crate ends each help text with a full stop.
        let f = &families;
        registry.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches",
            f.running.clone(),
        );
        registry.register("vllm:request_success", "Count of successfully processed requests", f.success.clone());
        registry.register("vllm:prompt_tokens", "Number of prefill tokens processed", f.prompt_tokens.clone());
        registry.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed",
            f.generation_tokens.clone(),
        );
        registry.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            f.time_to_first_token.clone(),
        );
        registry.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            f.inter_token_latency.clone(),
        );
        registry.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds",
            f.e2e_latency.clone(),
        );
        families
    }

    /// Engine `engine`'s series (handles sharing the families' values).
    fn series(&self, engine: u32) -> EngineSeries {
        let label = EngineLabel { engine };
        EngineSeries {
            running: self.running.get_or_create(&label).clone(),
            finished: FINISH_REASONS.map(|reason| {
                self.success.get_or_create(&FinishedLabel { engine, finished_reason: reason.as_str() }).clone()
            }),
            prompt_tokens: self.prompt_tokens.get_or_create(&label).clone(),
            generation_tokens: self.generation_tokens.get_or_create(&label).clone(),
            time_to_first_token: self.time_to_first_token.get_or_create(&label).clone(),
            inter_token_latency: self.inter_token_latency.get_or_create(&label).clone(),
            e2e_latency: self.e2e_latency.get_or_create(&label).clone(),
        }
    }
}

/// The server's request metrics, one series per engine as vLLM keeps them.
/// Updating one is an atomic add (counters) or a short lock (histograms) on
/// series made up front; the registry is only read by [`Metrics::render`].
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The first engine's index: `series[i]` is engine `first + i`'s.
    first: u32,
    series: Vec<EngineSeries>,
}

impl Metrics {
    /// Metrics labelled with `model_name`, with series for the `engines`.
    pub fn new(model_name: &str, engines: Range<u32>) -> Self {
        // The crate writes label values as they are: escape them as the format wants.
        let escaped = model_name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let model_label = (Cow::Borrowed("model_name"), Cow::Owned(escaped));
        let mut registry = Registry::with_labels(std::iter::once(model_label));
        let families = Families::register(&mut registry);
        let series = engines.clone().map(|engine| families.series(engine)).collect();
        Metrics { registry, first: engines.start, series }
    }

    /// The series of `engine` (the first engine's for an index it does not serve).
    fn of(&self, engine: u32) -> &EngineSeries {
        let slot = engine.checked_sub(self.first).map_or(0, |slot| slot as usize);
        self.series.get(slot).unwrap_or(&self.series[0])
    }

    /// A request with this many prompt tokens was sent to `engine`.
    pub fn record_prompt(&self, engine: u32, tokens: usize) {
        self.of(engine).prompt_tokens.inc_by(tokens as u64);
    }

    /// Tokens arrived from `engine`: the first ones after `ttft`, or `tokens`
    /// more after `gap` since the last ones (each token counts `gap / tokens`).
    pub fn record_tokens(&self, engine: u32, tokens: usize, first: Option<Duration>, gap: Option<Duration>) {
        let series = self.of(engine);
        series.generation_tokens.inc_by(tokens as u64);
        if let Some(ttft) = first {
            series.time_to_first_token.observe(ttft.as_secs_f64());
        }
        if let (Some(gap), true) = (gap, tokens > 0) {
            let per_token = gap.as_secs_f64() / tokens as f64;
            for _ in 0..tokens {
                series.inter_token_latency.observe(per_token);
            }
        }
    }

    /// A request on `engine` finished for `reason` after `elapsed`.
    pub fn record_finished(&self, engine: u32, reason: FinishReason, elapsed: Duration) {
        let series = self.of(engine);
        let i = FINISH_REASONS.iter().position(|&r| r == reason).unwrap_or(0);
        series.finished[i].inc();
        series.e2e_latency.observe(elapsed.as_secs_f64());
    }

    /// Total prompt and generation tokens so far, over all engines.
    pub fn token_totals(&self) -> (u64, u64) {
        let sum = |count: fn(&EngineSeries) -> u64| self.series.iter().map(count).sum();
        (sum(|s| s.prompt_tokens.get()), sum(|s| s.generation_tokens.get()))
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]), with `running(engine)`
    /// requests in flight on each engine.
    pub fn render(&self, running: impl Fn(u32) -> u64) -> String {
        for (engine, series) in (self.first..).zip(&self.series) {
            series.running.set(i64::try_from(running(engine)).unwrap_or(i64::MAX));
        }
        let mut out = String::with_capacity(8192);
        encode(&mut out, &self.registry).expect("write to String");
        out
    }
}

/// One engine request's timing as the metrics see it, shared by the HTTP
/// and gRPC paths: its prompt counts when it starts, time to first token and
/// inter-token latency as its tokens arrive, end-to-end latency and the
/// finish reason once. As in vLLM, each child of an `n` > 1 request is a
/// request of its own here (its own TTFT, latency and `request_success`),
/// its clock started when the parent arrived.
#[derive(Debug)]
pub struct TokenClock {
    metrics: Arc<Metrics>,
    engine: u32,
    started: Instant,
    last_tokens_at: Option<Instant>,
    generated: usize,
    finished: bool,
}

impl TokenClock {
    /// A clock for a request of `prompt_tokens` on `engine` that arrived at
    /// `started`; counts the prompt tokens.
    pub fn start(metrics: Arc<Metrics>, engine: u32, prompt_tokens: usize, started: Instant) -> Self {
        metrics.record_prompt(engine, prompt_tokens);
        TokenClock { metrics, engine, started, last_tokens_at: None, generated: 0, finished: false }
    }

    /// `count` new tokens arrived now (nothing happens for none).
    pub fn tokens(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        let now = Instant::now();
        let (first, gap) = match self.last_tokens_at {
            None => (Some(now - self.started), None),
            Some(last) => (None, Some(now - last)),
        };
        self.metrics.record_tokens(self.engine, count, first, gap);
        self.last_tokens_at = Some(now);
        self.generated += count;
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// True once [`TokenClock::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The request finished for `reason`; only the first call counts.
    pub fn finish(&mut self, reason: FinishReason) {
        if !self.finished {
            self.finished = true;
            self.metrics.record_finished(self.engine, reason, self.started.elapsed());
        }
    }
}

impl Drop for TokenClock {
    fn drop(&mut self) {
        // Dropped unfinished: the client went away, and the request stream's
        // own drop aborts the engine request.
        self.finish(FinishReason::Abort);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = Metrics::new("toy", 0..2);
        m.record_prompt(1, 5);
        m.record_tokens(1, 2, Some(Duration::from_millis(3)), None);
        m.record_tokens(1, 2, None, Some(Duration::from_millis(4)));
        m.record_finished(1, FinishReason::Length, Duration::from_millis(20));
        m.record_prompt(0, 7);
        assert_eq!(m.token_totals(), (12, 4));
        let text = m.render(|engine| u64::from(engine == 1));
        assert!(text.contains("# HELP vllm:request_success Count of successfully processed requests.\n"), "{text}");
        assert!(text.contains("# TYPE vllm:request_success counter\n"), "{text}");
        for line in [
            r#"vllm:num_requests_running{model_name="toy",engine="1"} 1"#,
            r#"vllm:num_requests_running{model_name="toy",engine="0"} 0"#,
            r#"vllm:request_success_total{model_name="toy",engine="1",finished_reason="length"} 1"#,
            r#"vllm:request_success_total{model_name="toy",engine="1",finished_reason="abort"} 0"#,
            r#"vllm:request_success_total{model_name="toy",engine="0",finished_reason="length"} 0"#,
            r#"vllm:prompt_tokens_total{model_name="toy",engine="1"} 5"#,
            r#"vllm:prompt_tokens_total{model_name="toy",engine="0"} 7"#,
            r#"vllm:generation_tokens_total{model_name="toy",engine="1"} 4"#,
            r#"vllm:time_to_first_token_seconds_bucket{model_name="toy",le="0.005",engine="1"} 1"#,
            r#"vllm:inter_token_latency_seconds_count{model_name="toy",engine="1"} 2"#,
            r#"vllm:e2e_request_latency_seconds_bucket{model_name="toy",le="+Inf",engine="1"} 1"#,
            r#"vllm:e2e_request_latency_seconds_count{model_name="toy",engine="0"} 0"#,
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn model_name_is_escaped_in_labels() {
        let text = Metrics::new("a\"b\\c\nd", 0..1).render(|_| 0);
        assert!(text.contains(r#"vllm:num_requests_running{model_name="a\"b\\c\nd",engine="0"} 0"#), "{text}");
    }

    #[test]
    fn token_clock_times_tokens_and_finishes_once() {
        let metrics = Arc::new(Metrics::new("toy", 0..1));
        let mut clock = TokenClock::start(metrics.clone(), 0, 3, Instant::now());
        clock.tokens(0);
        clock.tokens(2);
        clock.tokens(1);
        assert_eq!((clock.generated(), metrics.token_totals()), (3, (3, 3)));
        clock.finish(FinishReason::Stop);
        clock.finish(FinishReason::Error);
        assert!(clock.is_finished());
        drop(clock);
        // A clock dropped unfinished counts as aborted.
        drop(TokenClock::start(metrics.clone(), 0, 1, Instant::now()));
        let text = metrics.render(|_| 0);
        for line in [
            r#"vllm:request_success_total{model_name="toy",engine="0",finished_reason="stop"} 1"#,
            r#"vllm:request_success_total{model_name="toy",engine="0",finished_reason="error"} 0"#,
            r#"vllm:request_success_total{model_name="toy",engine="0",finished_reason="abort"} 1"#,
            r#"vllm:time_to_first_token_seconds_count{model_name="toy",engine="0"} 1"#,
            r#"vllm:inter_token_latency_seconds_count{model_name="toy",engine="0"} 1"#,
            r#"vllm:e2e_request_latency_seconds_count{model_name="toy",engine="0"} 2"#,
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line} in\n{text}");
        }
    }
}
