//! The engine client: submits requests to engines, routes their outputs back to
//! the waiting HTTP handlers, aborts, utility calls, and engine failure.
//!
//! Both engine sockets are spoken in the async runtime (`zmtp.rs`): whoever
//! submits or aborts queues the message on the input ROUTER (`input_socket.rs`),
//! and each engine's output connection is read by its own task as a PULL,
//! which decodes every message and dispatches it to the per-request inboxes;
//! the handlers it wakes run on the same worker, with no thread in between.
//!
//! What engines send is checked, not trusted: a message that does not decode
//! drops only its connection, outputs for unknown requests are dropped, and no
//! request gets more than its `max_tokens`. An engine whose registered input
//! connection ends, or that has requests in flight and sends nothing for the
//! stall timeout, fails the client as `ENGINE_CORE_DEAD` does.

use super::balancer::Balancer;
use super::inbox::{Inbox, RequestEvent, Take};
use super::input_socket::EngineInputSocket;
use super::zmtp::{handshake, pong_frame, FrameLimits, Incoming};
use crate::listener::{accept_engine_connections, AcceptedStream, PendingPermit, StreamListener};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tokio::time::Instant;
use vllm_rs_config::DEFAULT_STALL_TIMEOUT;
use vllm_rs_metrics::{EngineTimes, Metrics, SharedTimes};
use vllm_rs_wire::codec::{decode_outputs, encode_abort, encode_add, encode_utility, DecodeError};
use vllm_rs_wire::protocol::{
    engine_identity, EngineCoreOutput, EngineRequest, FinishReason, Logprobs, OutputsMessage, Pooled, SchedulerStats,
    UtilityOutput, REQUEST_ABORT, REQUEST_ADD, REQUEST_UTILITY,
};

/// Engine messages a connection's task handles before it lets the handlers it
/// woke run: bounds the latency one busy engine adds to every stream.
const MESSAGES_PER_TURN: usize = 1024;

/// How the client treats its engines.
#[derive(Clone, Copy, Debug)]
pub struct EngineSettings {
    /// What an engine output connection may send.
    pub limits: FrameLimits,
    /// An engine with requests in flight that sends nothing for this long is hung.
    pub stall_timeout: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings { limits: FrameLimits::default(), stall_timeout: DEFAULT_STALL_TIMEOUT }
    }
}

/// Why a request could not be submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The engines are gone or the client is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// `X-data-parallel-rank` names an engine this frontend does not serve.
    #[error("data parallel rank {rank} is out of range: this frontend serves engines {first}..={last}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: u32,
        /// First engine served.
        first: u32,
        /// Last engine served.
        last: u32,
    },
}

/// One message for an engine's input socket.
struct InputCommand<'a> {
    engine: u32,
    kind: u8,
    payload: Vec<u8>,
    /// The request to fail if the send fails.
    request_id: Option<&'a str>,
}

/// A request in flight, as the dispatcher sees it. Dropping it (finished,
/// failed or aborted) closes the handler's inbox.
struct RequestSlot {
    slot: usize,
    inbox: Arc<Inbox>,
    /// Tokens the request may still receive (its `max_tokens`), when bounded.
    tokens_left: Option<u64>,
    /// What its engine reported, for its metrics.
    times: SharedTimes,
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        self.inbox.close();
    }
}

type UtilityResult = Result<Option<rmpv::Value>, UtilityError>;

/// Why a utility call got no result.
#[derive(Debug, thiserror::Error)]
pub enum UtilityError {
    /// The engines are unusable (dead, lost or hung), for this reason.
    #[error("{0}")]
    EnginesFailed(String),
    /// The engine ran the call and reported this failure.
    #[error("{0}")]
    Failed(String),
    /// The client dropped the call before its reply came.
    #[error("utility call {method} to engine {engine} was dropped")]
    Dropped {
        /// The method called.
        method: String,
        /// The engine called.
        engine: u32,
    },
    /// No reply came in time.
    #[error("utility call {method} to engine {engine} timed out after {timeout:?}")]
    TimedOut {
        /// The method called.
        method: String,
        /// The engine called.
        engine: u32,
        /// How long the call waited.
        timeout: Duration,
    },
}

struct Shared {
    start_index: u32,
    client_index: u32,
    balancer: Balancer,
    requests: Mutex<HashMap<String, RequestSlot>>,
    utility_calls: Mutex<HashMap<i64, oneshot::Sender<UtilityResult>>>,
    next_call_id: AtomicI64,
    /// The request wave the coordinator last published (0 without one).
    current_wave: AtomicU64,
    /// Set once a coordinator published engine counts: from then on they
    /// steer balancing (as vLLM's DP client balances on the coordinator's
    /// counts alone), and the engines' own stats only feed the metrics; an
    /// engine's stats sent before the coordinator saw its new load would
    /// otherwise undo the coordinator's view.
    coordinator_counts: AtomicBool,
    input_socket: Arc<EngineInputSocket>,
    failure: OnceLock<String>,
    /// Woken once `failure` is set.
    failed: tokio::sync::Notify,
    stopping: AtomicBool,
    /// Per engine slot: when it last sent something (or last became busy),
    /// in milliseconds since `epoch`.
    last_heard_ms: Vec<AtomicU64>,
    epoch: Instant,
    /// Where the engines' stats and request outputs are counted.
    metrics: Arc<Metrics>,
}

/// Handle to the engines of this frontend. Cheap to clone.
#[derive(Clone)]
pub struct EngineClient {
    shared: Arc<Shared>,
}

impl EngineClient {
    /// Starts reading engine outputs from `output` (the `input_socket` has seen
    /// every engine register), watching for a lost or hung engine, counting
    /// what the engines report in `metrics`. Must be called from inside the
    /// tokio runtime.
    pub fn start(
        input_socket: Arc<EngineInputSocket>,
        output: StreamListener,
        start_index: u32,
        engine_count: u32,
        client_index: u32,
        settings: EngineSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut lost_engine = input_socket.lost_engine();
        let shared = Arc::new(Shared {
            start_index,
            client_index,
            balancer: Balancer::new(engine_count as usize),
            requests: Mutex::new(HashMap::new()),
            utility_calls: Mutex::new(HashMap::new()),
            next_call_id: AtomicI64::new(1),
            current_wave: AtomicU64::new(0),
            coordinator_counts: AtomicBool::new(false),
            input_socket,
            failure: OnceLock::new(),
            failed: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            last_heard_ms: (0..engine_count).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            metrics,
        });
        let for_outputs = shared.clone();
        tokio::spawn(async move {
            accept_engine_connections(output, "an engine output connection", move |stream, pending| {
                read_engine_outputs(stream, pending, settings.limits, for_outputs.clone())
            })
            .await
        });
        let for_lost = Arc::downgrade(&shared);
        tokio::spawn(async move {
            let Ok(Some(lost)) = lost_engine.wait_for(Option::is_some).await.map(|lost| lost.clone()) else {
                return;
            };
            if let Some(shared) = for_lost.upgrade() {
                shared.fail_all(format!(
                    "engine {} is gone: {} (handled as ENGINE_CORE_DEAD); requests in flight were failed",
                    engine_name(&lost.identity),
                    lost.how
                ));
            }
        });
        tokio::spawn(watch_for_stalls(Arc::downgrade(&shared), settings.stall_timeout));
        EngineClient { shared }
    }

    /// Sends `request` to the engine `pinned_rank` names, or else to the least
    /// loaded one, and returns the stream of its outputs.
    pub fn submit(&self, mut request: EngineRequest, pinned_rank: Option<u32>) -> Result<RequestStream, SubmitError> {
        let shared = &self.shared;
        if let Some(reason) = shared.failure.get() {
            return Err(SubmitError::Unavailable(reason.clone()));
        }
        if shared.stopping.load(Ordering::Relaxed) {
            return Err(SubmitError::Unavailable("the server is shutting down".into()));
        }
        let count = shared.balancer.engines().len() as u32;
        let slot = match pinned_rank {
            Some(rank) if rank >= shared.start_index && rank < shared.start_index + count => {
                (rank - shared.start_index) as usize
            }
            Some(rank) => {
                return Err(SubmitError::RankOutOfRange {
                    rank,
                    first: shared.start_index,
                    last: shared.start_index + count - 1,
                })
            }
            None => shared.balancer.choose(),
        };
        request.data_parallel_rank = pinned_rank;
        request.client_index = shared.client_index;
        let inbox = Arc::new(Inbox::default());
        let request_id = request.request_id.clone();
        let tokens_left = request.sampling.max_tokens;
        let times = EngineTimes::shared(request.prompt_token_ids.len(), tokens_left);
        let entry = RequestSlot { slot, inbox: inbox.clone(), tokens_left, times: times.clone() };
        shared.requests.lock().unwrap().insert(request_id.clone(), entry);
        if shared.balancer.engine(slot).inflight() == 0 {
            // An idle engine owes nothing: its stall clock starts now.
            shared.heard_from(slot);
        }
        shared.balancer.engine(slot).started();
        let engine = shared.start_index + slot as u32;
        let payload = encode_add(&request, shared.current_wave.load(Ordering::Relaxed));
        shared.send(InputCommand { engine, kind: REQUEST_ADD, payload, request_id: Some(&request_id) });
        Ok(RequestStream { request_id, engine, inbox, times, shared: shared.clone(), done: false })
    }

    /// Calls `method` on engine `engine` and waits at most `timeout` for its reply.
    pub async fn call_utility(
        &self,
        engine: u32,
        method: &str,
        args: Vec<rmpv::Value>,
        timeout: Duration,
    ) -> UtilityResult {
        let shared = &self.shared;
        if let Some(reason) = shared.failure.get() {
            return Err(UtilityError::EnginesFailed(reason.clone()));
        }
        let call_id = shared.next_call_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        shared.utility_calls.lock().unwrap().insert(call_id, tx);
        let payload = encode_utility(shared.client_index, call_id, method, &args);
        shared.send(InputCommand { engine, kind: REQUEST_UTILITY, payload, request_id: None });
        let outcome = tokio::time::timeout(timeout, rx).await;
        shared.utility_calls.lock().unwrap().remove(&call_id);
        match outcome {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(UtilityError::Dropped { method: method.to_owned(), engine }),
            Err(_) => Err(UtilityError::TimedOut { method: method.to_owned(), engine, timeout }),
        }
    }

    /// Takes the coordinator's latest state: the counts of this frontend's
    /// engines (the message lists every engine of the deployment) steer
    /// balancing, and new requests join `current_wave`.
    pub fn apply_coordinator_update(&self, update: &vllm_rs_coordinator::Published) {
        let shared = &self.shared;
        if let Some(counts) = &update.counts {
            shared.coordinator_counts.store(true, Ordering::Relaxed);
            let ours = counts.iter().skip(shared.start_index as usize);
            for (load, counts) in shared.balancer.engines().iter().zip(ours) {
                load.record_stats(SchedulerStats {
                    num_running_reqs: counts.running,
                    num_waiting_reqs: counts.waiting,
                    ..Default::default()
                });
            }
        }
        shared.current_wave.store(update.current_wave, Ordering::Relaxed);
    }

    /// The request wave new requests are sent with.
    pub fn current_wave(&self) -> u64 {
        self.shared.current_wave.load(Ordering::Relaxed)
    }

    /// The indices of the engines this frontend serves.
    pub fn engine_indices(&self) -> std::ops::Range<u32> {
        let start = self.shared.start_index;
        start..start + self.shared.balancer.engines().len() as u32
    }

    /// Why the engines are unusable, once they are.
    pub fn failure(&self) -> Option<&str> {
        self.shared.failure.get().map(String::as_str)
    }

    /// Resolves once the engines are unusable, with why.
    pub async fn failed(&self) -> String {
        loop {
            let woken = self.shared.failed.notified();
            if let Some(why) = self.failure() {
                return why.to_owned();
            }
            woken.await;
        }
    }

    /// Requests in flight over all engines.
    pub fn inflight(&self) -> u64 {
        self.shared.balancer.total_inflight()
    }

    /// Stops taking requests; the ones in flight go on.
    pub fn stop_accepting(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// Resolves once every message queued for the engines so far (ABORTs
    /// included) has been written to their sockets, or their connections are gone.
    pub async fn flush(&self) {
        self.shared.input_socket.flush().await;
    }

    /// Aborts the requests in flight whose client-facing id is one of
    /// `external_ids` (vLLM's `/abort_requests`): each engine gets an ABORT and
    /// each request finishes as `abort` with the tokens it has, as when an
    /// engine ends a request itself. Returns how many were in flight.
    pub fn abort_by_external_id(&self, external_ids: &[&str]) -> usize {
        let taken: Vec<(String, RequestSlot)> = {
            let mut requests = self.shared.requests.lock().unwrap();
            let matching: Vec<String> =
                requests.keys().filter(|id| external_ids.contains(&external_id(id))).cloned().collect();
            matching.into_iter().filter_map(|id| requests.remove(&id).map(|entry| (id, entry))).collect()
        };
        for (request_id, entry) in &taken {
            self.shared.balancer.engine(entry.slot).finished();
            entry.inbox.push_output(&[], Some(FinishReason::Abort), None);
            self.shared.send_abort(entry.slot, request_id.clone());
        }
        taken.len()
    }

    /// Aborts every request in flight: their handlers get `reason`, the engines an ABORT.
    pub fn abort_all(&self, reason: &str) {
        let drained: Vec<(String, RequestSlot)> = self.shared.requests.lock().unwrap().drain().collect();
        for (request_id, entry) in drained {
            self.shared.balancer.engine(entry.slot).finished();
            entry.inbox.fail(reason.to_string());
            self.shared.send_abort(entry.slot, request_id);
        }
    }
}

/// The client-facing id of an engine request id: the id less the `-` and 8
/// hex digits every request gets inside the engines (`server/src/http/generation/submit.rs`).
fn external_id(engine_request_id: &str) -> &str {
    match engine_request_id.rsplit_once('-') {
        Some((external, suffix)) if suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) => external,
        _ => engine_request_id,
    }
}

impl Shared {
    /// Milliseconds since `epoch`.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Notes that the engine in `slot` is alive now.
    fn heard_from(&self, slot: usize) {
        if let Some(heard) = self.last_heard_ms.get(slot) {
            heard.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// The first engine that has requests in flight and has sent nothing
    /// for `timeout`: its slot and how many requests wait on it.
    fn stalled_engine(&self, timeout: Duration) -> Option<(usize, u64)> {
        let now = self.now_ms();
        self.balancer.engines().iter().enumerate().find_map(|(slot, load)| {
            let silent = now.saturating_sub(self.last_heard_ms[slot].load(Ordering::Relaxed));
            let inflight = load.inflight();
            (inflight > 0 && u128::from(silent) >= timeout.as_millis()).then_some((slot, inflight))
        })
    }

    /// Queues `[type, payload]` for the engine on the ROUTER; a failed send fails its request.
    fn send(&self, command: InputCommand<'_>) {
        let sent = self.input_socket.send(&engine_identity(command.engine), &[&[command.kind], &command.payload]);
        if let Err(e) = sent {
            let reason = format!("cannot send to engine {}: {e}", command.engine);
            tracing::warn!("{reason}");
            if let Some(id) = command.request_id {
                self.fail_request(id, reason);
            }
        }
    }

    fn send_abort(&self, slot: usize, request_id: String) {
        let engine = self.start_index + slot as u32;
        let payload = encode_abort(&[request_id]);
        self.send(InputCommand { engine, kind: REQUEST_ABORT, payload, request_id: None });
    }

    /// Forgets `request_id` and sends ABORT for it, if it is still in flight.
    fn abort(&self, request_id: &str) {
        let removed = self.requests.lock().unwrap().remove(request_id);
        if let Some(entry) = removed {
            self.balancer.engine(entry.slot).finished();
            tracing::debug!(request_id, "aborting request");
            self.send_abort(entry.slot, request_id.to_string());
        }
    }

    fn fail_request(&self, request_id: &str, reason: String) {
        let removed = self.requests.lock().unwrap().remove(request_id);
        if let Some(entry) = removed {
            self.balancer.engine(entry.slot).finished();
            entry.inbox.fail(reason);
        }
    }

    /// The engines are unusable: fail everything in flight and everything to come.
    fn fail_all(&self, reason: String) {
        tracing::error!("{reason}");
        let reason = self.failure.get_or_init(|| reason).clone();
        self.failed.notify_waiters();
        let drained: Vec<RequestSlot> = self.requests.lock().unwrap().drain().map(|(_, s)| s).collect();
        for entry in drained {
            self.balancer.engine(entry.slot).finished();
            entry.inbox.fail(reason.clone());
        }
        for (_, call) in self.utility_calls.lock().unwrap().drain() {
            let _ = call.send(Err(UtilityError::EnginesFailed(reason.clone())));
        }
    }

    fn dispatch(&self, message: OutputsMessage<'_>) {
        if let OutputsMessage::Batch { engine_index, .. }
        | OutputsMessage::Utility { engine_index, .. }
        | OutputsMessage::Wave { engine_index, .. } = &message
        {
            if let Some(slot) = engine_index.checked_sub(self.start_index) {
                self.heard_from(slot as usize);
            }
        }
        match message {
            OutputsMessage::Batch { engine_index, outputs, timestamp, stats, finished_requests } => {
                if let Some(stats) = stats {
                    self.metrics.record_scheduler_stats(engine_index, &stats);
                    if let Some(load) = engine_index
                        .checked_sub(self.start_index)
                        .and_then(|slot| self.balancer.engines().get(slot as usize))
                        .filter(|_| !self.coordinator_counts.load(Ordering::Relaxed))
                    {
                        load.record_stats(stats);
                    }
                }
                self.dispatch_outputs(engine_index, timestamp, outputs, finished_requests);
            }
            OutputsMessage::Utility { engine_index, reply } => self.dispatch_utility(engine_index, reply),
            OutputsMessage::Wave { engine_index, .. } => {
                tracing::debug!(engine_index, "ignoring a wave message: waves are the coordinator's business");
            }
            OutputsMessage::EngineDead => {
                self.fail_all("engine core died (ENGINE_CORE_DEAD); requests in flight were failed".into());
            }
        }
    }

    fn dispatch_outputs(
        &self,
        engine_index: u32,
        timestamp: f64,
        outputs: Vec<EngineCoreOutput<'_>>,
        finished_requests: Vec<&str>,
    ) {
        let series = self.metrics.of(engine_index);
        let mut computed = 0;
        let mut overran = Vec::new();
        let mut requests = self.requests.lock().unwrap();
        for output in outputs {
            if let Some(error) = output.error {
                // Refused or failed in the engine: nothing it generated counts (as in vLLM).
                if let Some(entry) = requests.remove(output.request_id) {
                    self.balancer.engine(entry.slot).finished();
                    entry.inbox.reject(error);
                }
                continue;
            }
            let Some(entry) = requests.get_mut(output.request_id) else {
                tracing::debug!(request_id = %output.request_id, "dropping output of an unknown request or one no longer in flight");
                continue;
            };
            let (mut tokens, mut finish_reason, mut stop_reason) =
                (output.new_token_ids.as_slice(), output.finish_reason, output.stop_reason);
            let mut logprobs = output.new_logprobs.and_then(Logprobs::into_rows);
            if let Some(left) = &mut entry.tokens_left {
                if tokens.len() as u64 >= *left {
                    if tokens.len() as u64 > *left || finish_reason.is_none() {
                        // The engine sent more than `max_tokens` or did not end the request
                        // there: end it here, and stop it in the engine.
                        tracing::debug!(request_id = %output.request_id, "engine output reached max_tokens: finishing with length");
                        tokens = &tokens[..*left as usize];
                        if let Some(rows) = &mut logprobs {
                            rows.truncate(tokens.len());
                        }
                        (finish_reason, stop_reason) = (Some(FinishReason::Length), None);
                        overran.push((entry.slot, output.request_id.to_string()));
                    }
                    *left = 0;
                } else {
                    *left -= tokens.len() as u64;
                }
            }
            let mut times = entry.times.lock().unwrap();
            times.note_nans(output.num_nans_in_logits);
            computed += if output.pooling_output.is_some() {
                times.observe_pooled(series, timestamp, &output.events, output.prefill_stats.as_ref())
            } else {
                times.observe_output(series, timestamp, tokens.len(), &output.events, output.prefill_stats.as_ref())
            };
            drop(times);
            match output.pooling_output.and_then(Pooled::into_values) {
                Some(values) => entry.inbox.push_pooled(values),
                None => {
                    let prompt_logprobs = output.new_prompt_logprobs_tensors.and_then(Logprobs::into_rows);
                    entry.inbox.push_scored_output(tokens, logprobs, prompt_logprobs, finish_reason, stop_reason);
                }
            }
            if finish_reason.is_some() {
                if let Some(entry) = requests.remove(output.request_id) {
                    self.balancer.engine(entry.slot).finished();
                }
            }
        }
        // Finished in the engine without a final output: end them as aborted.
        for request_id in finished_requests {
            if let Some(entry) = requests.remove(request_id) {
                self.balancer.engine(entry.slot).finished();
                entry.inbox.push_output(&[], Some(FinishReason::Abort), None);
            }
        }
        drop(requests);
        self.metrics.record_iteration(engine_index, computed);
        for (slot, request_id) in overran {
            self.send_abort(slot, request_id);
        }
    }

    fn dispatch_utility(&self, engine_index: u32, reply: UtilityOutput) {
        let Some(call) = self.utility_calls.lock().unwrap().remove(&reply.call_id) else {
            tracing::debug!(engine_index, call_id = reply.call_id, "dropping a utility reply nobody waits for");
            return;
        };
        let _ = call.send(match reply.failure_message {
            Some(message) => Err(UtilityError::Failed(message)),
            None => Ok(reply.result.and_then(|result| result.value)),
        });
    }
}

/// `engine N` for a 2-byte engine identity, else the identity's bytes.
fn engine_name(identity: &[u8]) -> String {
    match identity {
        [lo, hi] => u16::from_le_bytes([*lo, *hi]).to_string(),
        other => format!("{other:02x?}"),
    }
}

/// Fails the client once an engine has requests in flight and sent nothing
/// for `timeout`; ends with the client (or after failing it).
async fn watch_for_stalls(shared: Weak<Shared>, timeout: Duration) {
    let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        if shared.failure.get().is_some() {
            return;
        }
        if let Some((slot, inflight)) = shared.stalled_engine(timeout) {
            return shared.fail_all(format!(
                "engine {} is hung: it sent nothing for {:.1}s with {inflight} request(s) in flight \
                 (VLLM_RS_ENGINE_STALL_TIMEOUT_S); requests in flight were failed",
                shared.start_index + slot as u32,
                timeout.as_secs_f64()
            ));
        }
    }
}

/// Reads one engine connection until it closes or breaks the protocol (the
/// engine reconnects if it is still alive; its death comes as ENGINE_CORE_DEAD).
/// A message that does not decode drops the connection, nothing else.
async fn read_engine_outputs(stream: AcceptedStream, pending: PendingPermit, limits: FrameLimits, shared: Arc<Shared>) {
    let mut peer = match handshake(stream, "PULL", "PUSH", limits).await {
        Ok(peer) => peer,
        Err(e) => return tracing::warn!("refused an engine output connection: {e}"),
    };
    drop(pending);
    tracing::debug!("engine output connection open");
    let mut handled = 0;
    loop {
        match peer.reader.next().await {
            Ok(Some(Incoming::Message(frame))) => {
                if let Err(e) = handle_message(&frame, peer.reader.aux_frames(), &shared) {
                    return tracing::warn!(
                        "dropping an engine output connection: it sent a message that does not decode: {e}"
                    );
                }
            }
            Ok(Some(Incoming::Ping(context))) => {
                if let Err(e) = peer.writer.write_all(&pong_frame(&context)).await {
                    return tracing::warn!("dropping an engine output connection: {e}");
                }
            }
            Ok(None) => return tracing::debug!("engine output connection closed"),
            Err(e) => return tracing::warn!("dropping an engine output connection: {e}"),
        }
        handled += 1;
        if handled == MESSAGES_PER_TURN {
            handled = 0;
            tokio::task::yield_now().await;
        }
    }
}

/// Decodes one outputs message (its first frame and aux frames) and dispatches it.
fn handle_message(frame: &[u8], aux: &[bytes::Bytes], shared: &Shared) -> Result<(), DecodeError> {
    shared.dispatch(decode_outputs(frame, aux)?);
    Ok(())
}

/// The outputs of one submitted request. Dropping it before the request
/// finished aborts the request in its engine.
pub struct RequestStream {
    request_id: String,
    engine: u32,
    inbox: Arc<Inbox>,
    times: SharedTimes,
    shared: Arc<Shared>,
    done: bool,
}

impl RequestStream {
    /// The engine-side request id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The engine that serves this request.
    pub fn engine(&self) -> u32 {
        self.engine
    }

    /// What its engine reported so far, for its metrics.
    pub fn times(&self) -> SharedTimes {
        self.times.clone()
    }

    /// The next engine output (`Take::One`) or everything that arrived since
    /// the previous call (`Take::All`), as one event (waits while nothing
    /// did); `None` after the last one.
    pub async fn recv(&mut self, take: Take) -> Option<RequestEvent> {
        if self.done {
            return None;
        }
        let event = std::future::poll_fn(|cx| self.inbox.poll_event(cx, take)).await;
        self.note(event)
    }

    fn note(&mut self, event: Option<RequestEvent>) -> Option<RequestEvent> {
        match &event {
            None
            | Some(RequestEvent::Failed(_) | RequestEvent::Rejected(_) | RequestEvent::Pooled(_))
            | Some(RequestEvent::Output { finish_reason: Some(_), .. }) => self.done = true,
            Some(RequestEvent::Output { .. }) => {}
        }
        event
    }

    /// Stops the request: sends ABORT to its engine unless it already finished.
    pub fn abort(&mut self) {
        if !self.done {
            self.done = true;
            self.shared.abort(&self.request_id);
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::external_id;

    #[test]
    fn the_external_id_is_the_engine_id_less_its_suffix() {
        assert_eq!(external_id("cmpl-abc-0123abcd"), "cmpl-abc");
        assert_eq!(external_id("cmpl-my-id-89abcdef"), "cmpl-my-id");
        // No suffix, or not one of 8 hex digits: the id as it is.
        assert_eq!(external_id("cmpl-abc"), "cmpl-abc");
        assert_eq!(external_id("plain"), "plain");
        assert_eq!(external_id("x-0123abcg"), "x-0123abcg");
    }
}
