//! Prometheus metrics in vLLM's names, help texts and buckets, kept and
//! rendered for `GET /metrics` by the `prometheus-client` crate (OpenMetrics text).

use crate::engine::protocol::FinishReason;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::time::Duration;

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

/// The label `vllm:request_success` adds to the model name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedLabel {
    finished_reason: &'static str,
}

/// The server's request metrics. Updating one is an atomic add (counters) or a
/// short lock (histograms); the registry is only read by [`Metrics::render`].
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    running: Gauge,
    /// Per finish reason, in the order of `FINISH_REASONS`.
    finished: [Counter; 5],
    prompt_tokens: Counter,
    generation_tokens: Counter,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    e2e_latency: Histogram,
}

impl Metrics {
    /// Metrics labelled with `model_name`.
    pub fn new(model_name: &str) -> Self {
        // The crate writes label values as they are: escape them as the format wants.
        let escaped = model_name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let model_label = (Cow::Borrowed("model_name"), Cow::Owned(escaped));
        let mut registry = Registry::with_labels(std::iter::once(model_label));
        // The crate ends each help text with a full stop.
        let running = Gauge::default();
        registry.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches",
            running.clone(),
        );
        let success = Family::<FinishedLabel, Counter>::default();
        registry.register("vllm:request_success", "Count of successfully processed requests", success.clone());
        let finished = FINISH_REASONS
            .map(|reason| success.get_or_create(&FinishedLabel { finished_reason: reason.as_str() }).clone());
        let prompt_tokens = Counter::default();
        registry.register("vllm:prompt_tokens", "Number of prefill tokens processed", prompt_tokens.clone());
        let generation_tokens = Counter::default();
        registry.register("vllm:generation_tokens", "Number of generation tokens processed", generation_tokens.clone());
        let histogram = |registry: &mut Registry, name: &str, help: &str, bounds: &[f64]| {
            let histogram = Histogram::new(bounds.iter().copied());
            registry.register(name, help, histogram.clone());
            histogram
        };
        let time_to_first_token = histogram(
            &mut registry,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            TTFT_BUCKETS,
        );
        let inter_token_latency = histogram(
            &mut registry,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            ITL_BUCKETS,
        );
        let e2e_latency = histogram(
            &mut registry,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds",
            E2E_BUCKETS,
        );
        Metrics {
            registry,
            running,
            finished,
            prompt_tokens,
            generation_tokens,
            time_to_first_token,
            inter_token_latency,
            e2e_latency,
        }
    }

    /// A request with this many prompt tokens was sent to an engine.
    pub fn record_prompt(&self, tokens: usize) {
        self.prompt_tokens.inc_by(tokens as u64);
    }

    /// Tokens arrived: the first ones after `ttft`, or `tokens` more after `gap`
    /// since the last ones (each token counts `gap / tokens`).
    pub fn record_tokens(&self, tokens: usize, first: Option<Duration>, gap: Option<Duration>) {
        self.generation_tokens.inc_by(tokens as u64);
        if let Some(ttft) = first {
            self.time_to_first_token.observe(ttft.as_secs_f64());
        }
        if let (Some(gap), true) = (gap, tokens > 0) {
            let per_token = gap.as_secs_f64() / tokens as f64;
            for _ in 0..tokens {
                self.inter_token_latency.observe(per_token);
            }
        }
    }

    /// A request finished for `reason` after `elapsed`.
    pub fn record_finished(&self, reason: FinishReason, elapsed: Duration) {
        let i = FINISH_REASONS.iter().position(|&r| r == reason).unwrap_or(0);
        self.finished[i].inc();
        self.e2e_latency.observe(elapsed.as_secs_f64());
    }

    /// Total prompt and generation tokens so far.
    pub fn token_totals(&self) -> (u64, u64) {
        (self.prompt_tokens.get(), self.generation_tokens.get())
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]), with `running` requests in flight.
    pub fn render(&self, running: u64) -> String {
        self.running.set(i64::try_from(running).unwrap_or(i64::MAX));
        let mut out = String::with_capacity(8192);
        encode(&mut out, &self.registry).expect("write to String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = Metrics::new("toy");
        m.record_prompt(5);
        m.record_tokens(2, Some(Duration::from_millis(3)), None);
        m.record_tokens(2, None, Some(Duration::from_millis(4)));
        m.record_finished(FinishReason::Length, Duration::from_millis(20));
        let text = m.render(1);
        assert!(text.contains("# HELP vllm:request_success Count of successfully processed requests.\n"), "{text}");
        assert!(text.contains("# TYPE vllm:request_success counter\n"), "{text}");
        assert!(text.contains("vllm:num_requests_running{model_name=\"toy\"} 1\n"), "{text}");
        assert!(text.contains("vllm:request_success_total{model_name=\"toy\",finished_reason=\"length\"} 1\n"));
        assert!(text.contains("vllm:request_success_total{model_name=\"toy\",finished_reason=\"abort\"} 0\n"));
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"toy\"} 5\n"));
        assert!(text.contains("vllm:generation_tokens_total{model_name=\"toy\"} 4\n"));
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"toy\",le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("vllm:inter_token_latency_seconds_count{model_name=\"toy\"} 2\n"));
        assert!(text.contains("vllm:e2e_request_latency_seconds_bucket{model_name=\"toy\",le=\"+Inf\"} 1\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn model_name_is_escaped_in_labels() {
        let text = Metrics::new("a\"b\\c\nd").render(0);
        assert!(text.contains(r#"vllm:num_requests_running{model_name="a\"b\\c\nd"} 0"#), "{text}");
    }
}
