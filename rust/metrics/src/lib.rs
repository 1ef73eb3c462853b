//! Prometheus metrics in vLLM 0.33's names, help texts, label sets and
//! buckets, kept and rendered for `GET /metrics` by the `prometheus-client`
//! crate (OpenMetrics text): the `vllm:` families (`families.rs`), fed by
//! the engines' scheduler stats and request outputs (`request.rs`), the
//! HTTP request families (`http.rs`) and the sleep-mode ones (`sleep.rs`).

pub mod families;
pub mod http;
pub mod request;
pub mod sleep;

use families::{EngineSeries, Families};
use http::HttpMetrics;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use sleep::SleepModeMetrics;
use std::ops::Range;
use vllm_rs_wire::protocol::SchedulerStats;

pub use request::{EngineTimes, SharedTimes, TokenClock};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The server's metrics, one series per engine as vLLM keeps them. Updating
/// one is an atomic add (counters, gauges) or a short lock (histograms) on
/// series made up front; the registry is only read by [`Metrics::render`].
pub struct Metrics {
    registry: Registry,
    /// The first engine's index: `series[i]` is engine `first + i`'s.
    first: u32,
    series: Vec<EngineSeries>,
    http: HttpMetrics,
    sleep_mode: SleepModeMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("engines", &(self.first..self.first + self.series.len() as u32)).finish()
    }
}

impl Metrics {
    /// Metrics labelled with `model_name`, with series for the `engines`,
    /// the per-request token counts bucketed up to `max_model_len`.
    pub fn new(model_name: &str, engines: Range<u32>, max_model_len: u64) -> Self {
        // The crate writes label values as they are: escape them as the format wants.
        let escaped = model_name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let mut registry = Registry::default();
        let families = Families::register(&mut registry, max_model_len);
        let http = HttpMetrics::register(&mut registry);
        let sleep_mode = SleepModeMetrics::register(&mut registry);
        let series = engines.clone().map(|engine| families.series(&escaped, engine)).collect();
        Metrics { registry, first: engines.start, series, http, sleep_mode }
    }

    /// The series of `engine` (the first engine's for an index it does not serve).
    pub fn of(&self, engine: u32) -> &EngineSeries {
        let slot = engine.checked_sub(self.first).map_or(0, |slot| slot as usize);
        self.series.get(slot).unwrap_or(&self.series[0])
    }

    /// The HTTP request families.
    pub fn http(&self) -> &HttpMetrics {
        &self.http
    }

    /// The sleep-mode operation families.
    pub fn sleep_mode(&self) -> &SleepModeMetrics {
        &self.sleep_mode
    }

    /// `engine` sent its scheduler stats: the gauges take its counts and KV
    /// usage, the prefix-cache counters its lookups since the previous stats.
    /// As in vLLM, requests skipped while waiting (`deferred`) are not among
    /// `num_waiting_reqs` (`capacity`) and count as waiting too.
    pub fn record_scheduler_stats(&self, engine: u32, stats: &SchedulerStats) {
        let series = self.of(engine);
        series.running.set(stats.num_running_reqs);
        series.waiting.set(stats.num_waiting_reqs + stats.num_skipped_waiting_reqs);
        let [capacity, deferred] = &series.waiting_by_reason;
        capacity.set(stats.num_waiting_reqs);
        deferred.set(stats.num_skipped_waiting_reqs);
        series.kv_cache_usage.set(stats.kv_cache_usage);
        series.prefix_cache_queries.inc_by(stats.prefix_cache_stats.queries);
        series.prefix_cache_hits.inc_by(stats.prefix_cache_stats.hits);
        // Hits of the engine's own prefix cache are on the device.
        series.prompt_tokens_cached_by_source[0].inc_by(stats.prefix_cache_stats.hits);
    }

    /// One nonempty output batch of `engine` computed `tokens` (prompt and generated).
    pub fn record_iteration(&self, engine: u32, tokens: u64) {
        if tokens > 0 {
            self.of(engine).iteration_tokens.observe(tokens as f64);
        }
    }

    /// Total prompt and generation tokens so far, over all engines.
    pub fn token_totals(&self) -> (u64, u64) {
        let sum = |count: fn(&EngineSeries) -> u64| self.series.iter().map(count).sum();
        (sum(|s| s.prompt_tokens.get()), sum(|s| s.generation_tokens.get()))
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(32768);
        encode(&mut out, &self.registry).expect("write to String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;
    use vllm_rs_wire::protocol::{EngineEvent, EngineEventKind, FinishReason, PrefillStats, PrefixCacheStats};

    fn event(kind: EngineEventKind, timestamp: f64) -> EngineEvent {
        EngineEvent { kind, timestamp }
    }

    fn has(text: &str, line: &str) {
        assert!(text.contains(&format!("{line}\n")), "missing {line} in\n{text}");
    }

    #[test]
    fn scheduler_stats_set_gauges_and_add_prefix_lookups() {
        let m = Metrics::new("toy", 0..2, 128);
        let stats = SchedulerStats {
            num_running_reqs: 3,
            num_waiting_reqs: 4,
            num_skipped_waiting_reqs: 1,
            kv_cache_usage: 0.25,
            prefix_cache_stats: PrefixCacheStats { queries: 32, hits: 16 },
        };
        m.record_scheduler_stats(1, &stats);
        m.record_scheduler_stats(
            1,
            &SchedulerStats { prefix_cache_stats: PrefixCacheStats { queries: 8, hits: 16 }, ..stats },
        );
        let text = m.render();
        for line in [
            r#"vllm:num_requests_running{model_name="toy",engine="1"} 3"#,
            r#"vllm:num_requests_running{model_name="toy",engine="0"} 0"#,
            r#"vllm:num_requests_waiting{model_name="toy",engine="1"} 5"#,
            r#"vllm:num_requests_waiting_by_reason{model_name="toy",engine="1",reason="capacity"} 4"#,
            r#"vllm:num_requests_waiting_by_reason{model_name="toy",engine="1",reason="deferred"} 1"#,
            r#"vllm:kv_cache_usage_perc{model_name="toy",engine="1"} 0.25"#,
            r#"vllm:prefix_cache_queries_total{model_name="toy",engine="1"} 40"#,
            r#"vllm:prefix_cache_hits_total{model_name="toy",engine="1"} 32"#,
            r#"vllm:prompt_tokens_cached_by_source_total{model_name="toy",engine="1",source="device"} 32"#,
            r#"vllm:prompt_tokens_cached_by_source_total{model_name="toy",engine="1",source="disk"} 0"#,
        ] {
            has(&text, line);
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn model_name_is_escaped_in_labels() {
        let text = Metrics::new("a\"b\\c\nd", 0..1, 128).render();
        has(&text, r#"vllm:num_requests_running{model_name="a\"b\\c\nd",engine="0"} 0"#);
    }

    #[test]
    fn a_request_is_timed_from_its_engine_events_and_counted_once() {
        let metrics = Arc::new(Metrics::new("toy", 0..1, 128));
        let times = EngineTimes::shared(40, Some(3));
        let mut clock = TokenClock::start(metrics.clone(), 0, times.clone(), 2, Instant::now());
        let series = metrics.of(0);
        let prefill = PrefillStats {
            num_prompt_tokens: 40,
            num_computed_tokens: 24,
            num_cached_tokens: 16,
            num_local_cached_tokens: 16,
            num_external_cached_tokens: 0,
        };
        let queued = [event(EngineEventKind::Queued, 10.0), event(EngineEventKind::Scheduled, 10.5)];
        let mut t = times.lock().unwrap();
        assert_eq!(t.observe_output(series, 11.0, 1, &queued, Some(&prefill)), 25);
        t.note_nans(3);
        let preempted = [event(EngineEventKind::Preempted, 11.2), event(EngineEventKind::Scheduled, 11.4)];
        assert_eq!(t.observe_output(series, 12.0, 1, &preempted, None), 1);
        assert_eq!(t.observe_output(series, 13.0, 1, &[], None), 1);
        drop(t);
        metrics.record_iteration(0, 25);
        clock.tokens(0);
        clock.tokens(2);
        clock.tokens(1);
        assert_eq!(clock.generated(), 3);
        clock.finish(FinishReason::Length);
        clock.finish(FinishReason::Error);
        assert!(clock.is_finished());
        drop(clock);
        assert_eq!(metrics.token_totals(), (40, 3));
        let text = metrics.render();
        let labels = r#"model_name="toy",engine="0""#;
        for line in [
            format!(r#"vllm:request_success_total{{{labels},finished_reason="length"}} 1"#),
            format!(r#"vllm:request_success_total{{{labels},finished_reason="error"}} 0"#),
            format!(r#"vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} 24"#),
            format!(r#"vllm:prompt_tokens_by_source_total{{{labels},source="local_cache_hit"}} 16"#),
            format!(r#"vllm:prompt_tokens_by_source_total{{{labels},source="external_kv_transfer"}} 0"#),
            format!("vllm:prompt_tokens_cached_total{{{labels}}} 16"),
            format!("vllm:num_preemptions_total{{{labels}}} 1"),
            format!("vllm:generation_tokens_total{{{labels}}} 3"),
            format!("vllm:time_to_first_token_seconds_count{{{labels}}} 1"),
            // One gap per batch after the first, from the engine's timestamps.
            format!("vllm:inter_token_latency_seconds_sum{{{labels}}} 2.0"),
            format!("vllm:iteration_tokens_total_sum{{{labels}}} 25.0"),
            // Queued 10.0, scheduled 10.5 (the first SCHEDULED counts), tokens at 11, 12 and 13.
            format!("vllm:request_queue_time_seconds_sum{{{labels}}} 0.5"),
            format!("vllm:request_prefill_time_seconds_sum{{{labels}}} 0.5"),
            format!("vllm:request_decode_time_seconds_sum{{{labels}}} 2.0"),
            format!("vllm:request_inference_time_seconds_sum{{{labels}}} 2.5"),
            format!("vllm:request_time_per_output_token_seconds_sum{{{labels}}} 1.0"),
            format!("vllm:request_prefill_kv_computed_tokens_sum{{{labels}}} 24.0"),
            format!("vllm:request_prompt_tokens_sum{{{labels}}} 40.0"),
            format!("vllm:request_generation_tokens_sum{{{labels}}} 3.0"),
            format!("vllm:request_params_max_tokens_sum{{{labels}}} 3.0"),
            format!("vllm:request_params_n_sum{{{labels}}} 2.0"),
            format!("vllm:request_num_preemptions_sum{{{labels}}} 1.0"),
            format!("vllm:corrupted_requests_total{{{labels}}} 1"),
            format!("vllm:e2e_request_latency_seconds_count{{{labels}}} 1"),
        ] {
            has(&text, &line);
        }
    }

    #[test]
    fn a_prompt_without_prefill_stats_counts_as_computed_and_an_unfinished_clock_as_aborted() {
        let metrics = Arc::new(Metrics::new("toy", 0..1, 128));
        let times = EngineTimes::shared(7, None);
        assert_eq!(times.lock().unwrap().observe_output(metrics.of(0), 1.0, 1, &[], None), 8);
        drop(TokenClock::start(metrics.clone(), 0, times, 1, Instant::now()));
        let text = metrics.render();
        let labels = r#"model_name="toy",engine="0""#;
        has(&text, &format!("vllm:prompt_tokens_total{{{labels}}} 7"));
        has(&text, &format!(r#"vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} 7"#));
        has(&text, &format!(r#"vllm:request_success_total{{{labels},finished_reason="abort"}} 1"#));
        has(&text, &format!("vllm:request_params_max_tokens_count{{{labels}}} 0"));
    }
}
