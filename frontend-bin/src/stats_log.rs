//! Periodic throughput lines in the log (off with `disable_log_stats`).

use std::sync::Arc;
use std::time::{Duration, Instant};
use vllm_rs_engine::EngineClient;
use vllm_rs_metrics::Metrics;

/// Logs prompt and generation throughput every `interval` while there is traffic.
pub async fn log_stats_forever(metrics: Arc<Metrics>, engines: EngineClient, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    let mut last = (metrics.token_totals(), Instant::now());
    loop {
        ticker.tick().await;
        let totals = metrics.token_totals();
        let now = Instant::now();
        let elapsed = (now - last.1).as_secs_f64().max(1e-9);
        let running = engines.inflight();
        if totals != last.0 || running > 0 {
            tracing::info!(
                "Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs",
                (totals.0 - last.0 .0) as f64 / elapsed,
                (totals.1 - last.0 .1) as f64 / elapsed,
                running
            );
        }
        last = (totals, now);
    }
}
