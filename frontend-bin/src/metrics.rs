//! Prometheus metrics in vLLM's names, rendered as text for `GET /metrics`.

use crate::engine::protocol::FinishReason;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Bucket bounds (seconds) for time to first token.
const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Bucket bounds (seconds) for inter-token latency.
const ITL_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0];
/// Bucket bounds (seconds) for end-to-end latency.
const E2E_BUCKETS: &[f64] =
    &[0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0];

/// Every finish reason, in the order they are rendered.
const FINISH_REASONS: [FinishReason; 5] =
    [FinishReason::Stop, FinishReason::Length, FinishReason::Abort, FinishReason::Error, FinishReason::Repetition];

/// A cumulative histogram with fixed bucket bounds.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Debug, Default)]
struct HistogramState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, state: Mutex::new(HistogramState { counts: vec![0; bounds.len()], ..Default::default() }) }
    }

    fn observe(&self, seconds: f64) {
        self.observe_many(seconds, 1);
    }

    /// Records `times` observations of the same value.
    fn observe_many(&self, seconds: f64, times: u64) {
        let mut state = self.state.lock().unwrap();
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            state.counts[i] += times;
        }
        state.sum += seconds * times as f64;
        state.count += times;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let state = self.state.lock().unwrap();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&state.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", state.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", state.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", state.count);
    }
}

/// The server's request metrics.
#[derive(Debug)]
pub struct Metrics {
    labels: String,
    finished: [AtomicU64; 5],
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    e2e_latency: Histogram,
}

impl Metrics {
    /// Metrics labelled with `model_name`.
    pub fn new(model_name: &str) -> Self {
        let escaped = model_name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        Metrics {
            labels: format!("model_name=\"{escaped}\""),
            finished: Default::default(),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            e2e_latency: Histogram::new(E2E_BUCKETS),
        }
    }

    /// A request with this many prompt tokens was sent to an engine.
    pub fn record_prompt(&self, tokens: usize) {
        self.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Tokens arrived: the first ones after `ttft`, or `tokens` more after `gap` since the last ones.
    pub fn record_tokens(&self, tokens: usize, first: Option<Duration>, gap: Option<Duration>) {
        self.generation_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        if let Some(ttft) = first {
            self.time_to_first_token.observe(ttft.as_secs_f64());
        }
        if let (Some(gap), true) = (gap, tokens > 0) {
            self.inter_token_latency.observe_many(gap.as_secs_f64() / tokens as f64, tokens as u64);
        }
    }

    /// A request finished for `reason` after `elapsed`.
    pub fn record_finished(&self, reason: FinishReason, elapsed: Duration) {
        let i = FINISH_REASONS.iter().position(|&r| r == reason).unwrap_or(0);
        self.finished[i].fetch_add(1, Ordering::Relaxed);
        self.e2e_latency.observe(elapsed.as_secs_f64());
    }

    /// Total prompt and generation tokens so far.
    pub fn token_totals(&self) -> (u64, u64) {
        (self.prompt_tokens.load(Ordering::Relaxed), self.generation_tokens.load(Ordering::Relaxed))
    }

    /// The Prometheus text exposition, with `running` requests in flight.
    pub fn render(&self, running: u64) -> String {
        let labels = &self.labels;
        let mut out = String::with_capacity(8192);
        let _ = writeln!(out, "# HELP vllm:num_requests_running Number of requests in flight in the engines.");
        let _ =
            writeln!(out, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} {running}");
        let _ = writeln!(out, "# HELP vllm:request_success_total Count of finished requests by finish reason.");
        let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
        for (reason, count) in FINISH_REASONS.iter().zip(&self.finished) {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let (prompt, generation) = self.token_totals();
        let _ = writeln!(out, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.");
        let _ = writeln!(out, "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{labels}}} {prompt}");
        let _ = writeln!(out, "# HELP vllm:generation_tokens_total Number of generation tokens processed.");
        let _ = writeln!(
            out,
            "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{labels}}} {generation}"
        );
        self.time_to_first_token.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
        );
        self.inter_token_latency.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
        );
        self.e2e_latency.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
        );
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
        assert!(text.contains("vllm:num_requests_running{model_name=\"toy\"} 1"));
        assert!(text.contains("vllm:request_success_total{model_name=\"toy\",finished_reason=\"length\"} 1"));
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"toy\"} 5"));
        assert!(text.contains("vllm:generation_tokens_total{model_name=\"toy\"} 4"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"toy\",le=\"0.005\"} 1"));
        assert!(text.contains("vllm:inter_token_latency_seconds_count{model_name=\"toy\"} 2"));
        assert!(text.contains("vllm:e2e_request_latency_seconds_bucket{model_name=\"toy\",le=\"+Inf\"} 1"));
    }
}
