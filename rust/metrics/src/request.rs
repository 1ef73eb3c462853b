//! One request's metrics, in two halves that share an [`EngineTimes`]: the
//! engine client records what the engine reports as outputs arrive (events,
//! prefill stats, batch timestamps, tokens), and the handler's [`TokenClock`]
//! records time to first token and, once the request finishes, everything
//! vLLM records per finished request.

use super::families::{EngineSeries, FINISH_REASONS};
use super::Metrics;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vllm_rs_wire::protocol::{EngineEvent, EngineEventKind, FinishReason, PrefillStats};

/// What the engine reported about one request so far. Timestamps are the
/// engine's clock (seconds); 0 means "not seen", as in vLLM.
#[derive(Debug)]
pub struct EngineTimes {
    prompt_tokens: u64,
    max_tokens: Option<u64>,
    queued: f64,
    scheduled: f64,
    first_token: f64,
    last_token: f64,
    cached_tokens: u64,
    prefilling: bool,
    preemptions: u32,
    corrupted: bool,
}

/// [`EngineTimes`] shared by the engine client and the request's handler.
pub type SharedTimes = Arc<Mutex<EngineTimes>>;

impl EngineTimes {
    /// The record of a request with `prompt_tokens` and this `max_tokens` parameter.
    pub fn shared(prompt_tokens: usize, max_tokens: Option<u64>) -> SharedTimes {
        Arc::new(Mutex::new(EngineTimes {
            prompt_tokens: prompt_tokens as u64,
            max_tokens,
            queued: 0.0,
            scheduled: 0.0,
            first_token: 0.0,
            last_token: 0.0,
            cached_tokens: 0,
            prefilling: true,
            preemptions: 0,
            corrupted: false,
        }))
    }

    /// One engine output of this request arrived in a batch the engine sent
    /// at `batch_timestamp`, with `tokens` new tokens (after the frontend's
    /// `max_tokens` cut): counts its events, its prompt (with the first
    /// token) and its tokens on `series`, observes the inter-token latency
    /// between batches. Returns the tokens it computed (prompt and
    /// generated), for `vllm:iteration_tokens_total`.
    pub fn observe_output(
        &mut self,
        series: &EngineSeries,
        batch_timestamp: f64,
        tokens: usize,
        events: &[EngineEvent],
        prefill: Option<&PrefillStats>,
    ) -> u64 {
        for event in events {
            match event.kind {
                EngineEventKind::Queued => self.queued = event.timestamp,
                EngineEventKind::Scheduled if self.scheduled == 0.0 => self.scheduled = event.timestamp,
                EngineEventKind::Scheduled => {}
                EngineEventKind::Preempted => {
                    self.preemptions += 1;
                    series.num_preemptions.inc();
                }
            }
        }
        if let Some(prefill) = prefill {
            self.cached_tokens = prefill.num_cached_tokens;
        }
        if tokens == 0 {
            // A final output without tokens (an abort) times nothing.
            return 0;
        }
        series.generation_tokens.inc_by(tokens as u64);
        let mut computed = tokens as u64;
        if self.prefilling {
            self.prefilling = false;
            computed += self.count_prompt(series, prefill);
            self.first_token = batch_timestamp;
        } else if self.last_token > 0.0 {
            series.inter_token_latency.observe((batch_timestamp - self.last_token).max(0.0));
        }
        self.last_token = batch_timestamp;
        computed
    }

    /// A pooling request's one output (nothing generated): counts its events
    /// and its prompt, and marks its end as its first "token" for the
    /// latency series. Returns the prompt tokens it computed.
    pub fn observe_pooled(
        &mut self,
        series: &EngineSeries,
        batch_timestamp: f64,
        events: &[EngineEvent],
        prefill: Option<&PrefillStats>,
    ) -> u64 {
        self.observe_output(series, batch_timestamp, 0, events, prefill);
        self.prefilling = false;
        (self.first_token, self.last_token) = (batch_timestamp, batch_timestamp);
        self.count_prompt(series, prefill)
    }

    /// The engine found `nans` NaNs in the logits of an output: the request
    /// counts as corrupted when it finishes.
    pub fn note_nans(&mut self, nans: u32) {
        self.corrupted |= nans > 0;
    }

    /// Counts the prompt by source; returns the tokens computed for it. An
    /// engine that sends no prefill stats computed the whole prompt, as far as
    /// anyone can tell (vLLM's frontend counts nothing then).
    fn count_prompt(&self, series: &EngineSeries, prefill: Option<&PrefillStats>) -> u64 {
        let stats = prefill.copied().unwrap_or(PrefillStats {
            num_prompt_tokens: self.prompt_tokens,
            num_computed_tokens: self.prompt_tokens,
            ..PrefillStats::default()
        });
        series.prompt_tokens.inc_by(stats.num_prompt_tokens);
        let [computed, local_hit, external] = &series.prompt_tokens_by_source;
        computed.inc_by(stats.num_computed_tokens);
        local_hit.inc_by(stats.num_local_cached_tokens);
        external.inc_by(stats.num_external_cached_tokens);
        series.prompt_tokens_cached.inc_by(stats.num_cached_tokens);
        stats.num_computed_tokens
    }

    /// Observes the per-request histograms of a finished request that
    /// generated `generated` tokens and was one of `n` parallel samples.
    fn record_finished(&self, series: &EngineSeries, generated: usize, n: u32) {
        let between = |end: f64, start: f64| if end > 0.0 && start > 0.0 && end >= start { end - start } else { 0.0 };
        let generated = generated as u64;
        series.request_prompt_tokens.observe(self.prompt_tokens as f64);
        series.request_generation_tokens.observe(generated as f64);
        series.request_max_num_generation_tokens.observe(generated as f64);
        if let Some(max_tokens) = self.max_tokens {
            series.request_params_max_tokens.observe(max_tokens as f64);
        }
        series.request_params_n.observe(f64::from(n));
        series.request_num_preemptions.observe(f64::from(self.preemptions));
        if self.corrupted {
            series.corrupted_requests.inc();
        }
        series.request_prefill_kv_computed_tokens.observe(self.prompt_tokens.saturating_sub(self.cached_tokens) as f64);
        series.queue_time.observe(between(self.scheduled, self.queued));
        series.prefill_time.observe(between(self.first_token, self.scheduled));
        let decode = between(self.last_token, self.first_token);
        series.decode_time.observe(decode);
        series.inference_time.observe(between(self.last_token, self.scheduled));
        let per_token = if generated > 1 { decode / (generated - 1) as f64 } else { 0.0 };
        series.time_per_output_token.observe(per_token);
    }
}

/// One engine request's metrics as its handler sees them, shared by the HTTP
/// and gRPC paths: time to first token as its tokens arrive, and once it
/// finishes its end-to-end latency, finish reason and per-request histograms.
/// As in vLLM, each child of an `n` > 1 request is a request of its own here,
/// its clock started when the parent arrived.
#[derive(Debug)]
pub struct TokenClock {
    metrics: Arc<Metrics>,
    engine: u32,
    times: SharedTimes,
    n: u32,
    started: Instant,
    generated: usize,
    finished: bool,
}

impl TokenClock {
    /// A clock for a request on `engine` whose engine reports land in
    /// `times`, one of `n` samples, that arrived at `started`.
    pub fn start(metrics: Arc<Metrics>, engine: u32, times: SharedTimes, n: u32, started: Instant) -> Self {
        TokenClock { metrics, engine, times, n, started, generated: 0, finished: false }
    }

    /// `count` new tokens reached the handler now (nothing happens for none).
    pub fn tokens(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        if self.generated == 0 {
            self.metrics.of(self.engine).time_to_first_token.observe(self.started.elapsed().as_secs_f64());
        }
        self.generated += count;
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Prompt tokens the engine found in its prefix cache, as its prefill
    /// stats said (0 until they came, and from engines that send none).
    pub fn cached_tokens(&self) -> usize {
        self.times.lock().unwrap().cached_tokens as usize
    }

    /// True once [`TokenClock::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The request finished for `reason`; only the first call counts.
    pub fn finish(&mut self, reason: FinishReason) {
        if self.finished {
            return;
        }
        self.finished = true;
        let series = self.metrics.of(self.engine);
        let i = FINISH_REASONS.iter().position(|&r| r == reason).unwrap_or(0);
        series.finished[i].inc();
        series.e2e_latency.observe(self.started.elapsed().as_secs_f64());
        self.times.lock().unwrap().record_finished(series, self.generated, self.n);
    }
}

impl Drop for TokenClock {
    fn drop(&mut self) {
        // Dropped unfinished: the client went away, and the request stream's
        // own drop aborts the engine request.
        self.finish(FinishReason::Abort);
    }
}
