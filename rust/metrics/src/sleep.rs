//! vLLM 0.33's sleep-mode operation families: how long each `/sleep` and
//! `/wake_up` took (`vllm:sleep_mode_operation_duration_seconds`) and how
//! many are awaited now (`vllm:sleep_mode_operations_in_flight`), by
//! `operation` (`sleep`, `wake`), with vLLM's buckets and no model label.

use super::families::Buckets;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;

/// Bucket bounds (seconds) of `vllm:sleep_mode_operation_duration_seconds`.
pub const DURATION_BUCKETS: &[f64] = &[0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// A sleep-mode operation, as the `operation` label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepOperation {
    /// `POST /sleep`.
    Sleep,
    /// `POST /wake_up`.
    Wake,
}

impl SleepOperation {
    fn label(self) -> OperationLabels {
        OperationLabels {
            operation: match self {
                SleepOperation::Sleep => "sleep",
                SleepOperation::Wake => "wake",
            },
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

/// The sleep-mode families.
pub struct SleepModeMetrics {
    duration: Family<OperationLabels, Histogram, Buckets>,
    in_flight: Family<OperationLabels, Gauge>,
}

impl SleepModeMetrics {
    /// The families, registered in `registry` under vLLM's names.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = SleepModeMetrics {
            duration: Family::new_with_constructor(Buckets(DURATION_BUCKETS.to_vec())),
            in_flight: Family::default(),
        };
        registry.register(
            "vllm:sleep_mode_operation_duration_seconds",
            "Duration of one sleep-mode operation.",
            metrics.duration.clone(),
        );
        registry.register(
            "vllm:sleep_mode_operations_in_flight",
            "Sleep-mode operations currently awaited.",
            metrics.in_flight.clone(),
        );
        metrics
    }

    /// Times one `operation`: in flight until the returned timer drops,
    /// which observes its duration.
    pub fn record(&self, operation: SleepOperation) -> OperationTimer<'_> {
        self.in_flight.get_or_create(&operation.label()).inc();
        OperationTimer { metrics: self, operation, started: Instant::now() }
    }
}

/// One sleep-mode operation in flight (see [`SleepModeMetrics::record`]).
pub struct OperationTimer<'a> {
    metrics: &'a SleepModeMetrics,
    operation: SleepOperation,
    started: Instant,
}

impl Drop for OperationTimer<'_> {
    fn drop(&mut self) {
        let label = self.operation.label();
        self.metrics.in_flight.get_or_create(&label).dec();
        self.metrics.duration.get_or_create(&label).observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn an_operation_is_in_flight_until_it_ends_then_timed() {
        let mut registry = Registry::default();
        let metrics = SleepModeMetrics::register(&mut registry);
        let render = |registry: &Registry| {
            let mut out = String::new();
            encode(&mut out, registry).unwrap();
            out
        };
        let timer = metrics.record(SleepOperation::Sleep);
        assert!(render(&registry).contains("vllm:sleep_mode_operations_in_flight{operation=\"sleep\"} 1\n"));
        drop(timer);
        drop(metrics.record(SleepOperation::Wake));
        let text = render(&registry);
        for line in [
            "vllm:sleep_mode_operations_in_flight{operation=\"sleep\"} 0",
            "vllm:sleep_mode_operation_duration_seconds_count{operation=\"sleep\"} 1",
            "vllm:sleep_mode_operation_duration_seconds_count{operation=\"wake\"} 1",
            "vllm:sleep_mode_operation_duration_seconds_bucket{le=\"600.0\",operation=\"wake\"} 1",
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line} in\n{text}");
        }
    }
}
