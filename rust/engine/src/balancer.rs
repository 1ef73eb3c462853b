//! Least-loaded routing across the engines of one frontend.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use vllm_rs_wire::protocol::SchedulerStats;

/// What one engine is known to be doing.
#[derive(Debug, Default)]
pub struct EngineLoad {
    inflight: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    has_stats: AtomicBool,
}

impl EngineLoad {
    /// Requests sent to this engine and not yet finished.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Counts one more request in flight.
    pub fn started(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request less in flight.
    pub fn finished(&self) {
        let _ = self.inflight.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Records the engine's latest scheduler stats.
    pub fn record_stats(&self, stats: SchedulerStats) {
        self.running.store(stats.num_running_reqs, Ordering::Relaxed);
        self.waiting.store(stats.num_waiting_reqs, Ordering::Relaxed);
        self.has_stats.store(true, Ordering::Relaxed);
    }

    /// Routing score, lower is better: the in-flight count until stats arrive,
    /// then `max(inflight, running + waiting) + 3 * waiting`.
    pub fn score(&self) -> u64 {
        let inflight = self.inflight();
        if !self.has_stats.load(Ordering::Relaxed) {
            return inflight;
        }
        let running = self.running.load(Ordering::Relaxed);
        let waiting = self.waiting.load(Ordering::Relaxed);
        inflight.max(running + waiting) + 3 * waiting
    }
}

/// Picks engines by lowest score; ties rotate so equal engines share the work.
#[derive(Debug)]
pub struct Balancer {
    engines: Vec<EngineLoad>,
    next_tie_break: AtomicUsize,
}

impl Balancer {
    /// A balancer over `count` idle engines.
    pub fn new(count: usize) -> Self {
        Balancer { engines: (0..count).map(|_| EngineLoad::default()).collect(), next_tie_break: AtomicUsize::new(0) }
    }

    /// The load of engine `slot` (0-based within this frontend).
    pub fn engine(&self, slot: usize) -> &EngineLoad {
        &self.engines[slot]
    }

    /// Every engine's load, in slot order.
    pub fn engines(&self) -> &[EngineLoad] {
        &self.engines
    }

    /// The slot of the least-loaded engine.
    pub fn choose(&self) -> usize {
        let n = self.engines.len();
        let offset = self.next_tie_break.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|i| (i + offset) % n).min_by_key(|&slot| self.engines[slot].score()).expect("at least one engine")
    }

    /// Requests in flight over all engines.
    pub fn total_inflight(&self) -> u64 {
        self.engines.iter().map(EngineLoad::inflight).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_engines_share_requests() {
        let b = Balancer::new(2);
        let picks: Vec<usize> = (0..4).map(|_| b.choose()).collect();
        assert_eq!(picks.iter().filter(|&&p| p == 0).count(), 2);
    }

    #[test]
    fn least_inflight_wins_until_stats_arrive() {
        let b = Balancer::new(2);
        b.engine(0).started();
        assert_eq!(b.choose(), 1);
        b.engine(1).started();
        b.engine(1).started();
        assert_eq!(b.choose(), 0);
    }

    #[test]
    fn waiting_requests_weigh_three_times() {
        let b = Balancer::new(2);
        b.engine(0).record_stats(SchedulerStats { num_running_reqs: 4, num_waiting_reqs: 0, ..Default::default() });
        b.engine(1).record_stats(SchedulerStats { num_running_reqs: 1, num_waiting_reqs: 1, ..Default::default() });
        assert_eq!(b.engine(0).score(), 4);
        assert_eq!(b.engine(1).score(), 5);
        assert_eq!(b.choose(), 0);
    }

    #[test]
    fn finished_never_underflows() {
        let e = EngineLoad::default();
        e.finished();
        assert_eq!(e.inflight(), 0);
    }
}
