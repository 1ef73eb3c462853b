//! A mock engine core speaking the protocol over real ZeroMQ sockets: it
//! registers, echoes prompt tokens back (one step per `step` interval, all
//! running requests batched in one message), and records what it received.
//!
//! Prompts steer it: `HANG...` never answers, `ERROR...` finishes with ERROR,
//! prompts holding `REJECT` or `PAUSED` finish with ERROR and vLLM's `RequestError`
//! (code `validation_error`, or `engine_paused` and retryable),
//! `DIE...` sends ENGINE_CORE_DEAD, `FLOOD...` ignores `max_tokens` (four
//! times as many tokens per step, never finished), a prompt holding `BURST` gets its whole
//! answer at once, each output (`tokens_per_step` tokens) in a message of its
//! own, back to back. Otherwise token i of the answer is prompt token i (cycled).

use rmpv::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Something the mock engine received.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// An ADD.
    Added {
        id: String,
        external_id: Option<String>,
        prompt: Vec<u32>,
        sampling: Value,
        dp_rank: Option<u64>,
        /// Slot 12, `current_wave`.
        wave: Option<u64>,
    },
    /// An ABORT.
    Aborted(Vec<String>),
    /// A UTILITY call.
    Utility { method: String, args: Value },
}

/// How a mock engine starts.
#[derive(Clone, Debug)]
pub struct EngineSpec {
    pub index: u32,
    pub input: String,
    pub output: String,
    /// `(max_model_len, num_gpu_blocks)`, or an empty registration payload.
    pub registration: Option<(u64, u64)>,
    pub step: Duration,
    pub tokens_per_step: usize,
    /// When set, both sockets send ZMTP PINGs announcing this TTL, five
    /// per TTL (ZMQ_HEARTBEAT_IVL/TTL/TIMEOUT), as a multi-node engine does.
    pub heartbeat_ttl: Option<Duration>,
}

impl EngineSpec {
    pub fn new(index: u32, input: &str, output: &str) -> Self {
        EngineSpec {
            index,
            input: input.into(),
            output: output.into(),
            registration: Some((1024, 100)),
            step: Duration::from_millis(2),
            tokens_per_step: 1,
            heartbeat_ttl: None,
        }
    }
}

pub struct MockEngine {
    pub events: Arc<Mutex<Vec<EngineEvent>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MockEngine {
    pub fn start(spec: EngineSpec) -> Self {
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (events.clone(), stop.clone());
        let thread = std::thread::spawn(move || run(spec, e, s));
        MockEngine { events, stop, thread: Some(thread) }
    }

    pub fn events(&self) -> Vec<EngineEvent> {
        self.events.lock().unwrap().clone()
    }

    pub fn added(&self) -> Vec<EngineEvent> {
        self.events().into_iter().filter(|e| matches!(e, EngineEvent::Added { .. })).collect()
    }

    pub fn aborted_ids(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                EngineEvent::Aborted(ids) => Some(ids),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Waits up to `timeout` for `check` to hold on the events.
    pub async fn wait_for(&self, timeout: Duration, check: impl Fn(&[EngineEvent]) -> bool) -> bool {
        let check = &check;
        vllm_rs_test_support::poll_until_async(timeout, || async move { check(&self.events.lock().unwrap()) })
            .await
            .is_some()
    }
}

impl Drop for MockEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Active {
    id: String,
    prompt: Vec<u32>,
    max_tokens: usize,
    generated: usize,
    stop_ids: Vec<u32>,
    eos: Option<u32>,
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Echo,
    Hang,
    Error,
    /// ERROR with a RequestError: its code and whether it is retryable.
    Rejected(&'static str, bool),
    Flood,
    Burst,
}

fn encode(v: &Value) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, v).unwrap();
    buf
}

fn map_get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn run(spec: EngineSpec, events: Arc<Mutex<Vec<EngineEvent>>>, stop: Arc<AtomicBool>) {
    let ctx = zmq::Context::new();
    let heartbeat = |socket: &zmq::Socket| {
        if let Some(ttl) = spec.heartbeat_ttl {
            let ttl_ms = ttl.as_millis() as i32;
            socket.set_heartbeat_ivl(ttl_ms / 5).unwrap();
            socket.set_heartbeat_ttl(ttl_ms).unwrap();
            socket.set_heartbeat_timeout(ttl_ms).unwrap();
        }
    };
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    heartbeat(&dealer);
    dealer.set_identity(&(spec.index as u16).to_le_bytes()).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.connect(&spec.input).unwrap();
    let push = ctx.socket(zmq::PUSH).unwrap();
    heartbeat(&push);
    push.set_linger(0).unwrap();
    push.connect(&spec.output).unwrap();
    let registration = match spec.registration {
        Some((len, blocks)) => encode(&Value::Map(vec![
            (Value::from("max_model_len"), Value::from(len)),
            (Value::from("num_gpu_blocks"), Value::from(blocks)),
            (Value::from("dp_stats_address"), Value::Nil),
        ])),
        None => Vec::new(),
    };
    dealer.send(registration, 0).unwrap();

    let mut active: Vec<Active> = Vec::new();
    let mut dead = false;
    let mut next_step = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let wait =
            if active.is_empty() { 20 } else { next_step.saturating_duration_since(Instant::now()).as_millis() as i64 };
        if dealer.poll(zmq::POLLIN, wait).unwrap_or(0) > 0 {
            while let Ok(frames) = dealer.recv_multipart(zmq::DONTWAIT) {
                if dead {
                    continue;
                }
                let kind = frames[0][0];
                let payload = rmpv::decode::read_value(&mut &frames[1][..]).unwrap();
                match kind {
                    0x00 => {
                        let slots = payload.as_array().unwrap();
                        let id = slots[0].as_str().unwrap().to_string();
                        let prompt: Vec<u32> =
                            slots[1].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
                        let sampling = slots[3].clone();
                        let max_tokens =
                            map_get(&sampling, "max_tokens").and_then(Value::as_u64).unwrap_or(16) as usize;
                        // As vLLM's engine: stop on `stop_token_ids` and, unless
                        // `ignore_eos`, on `_eos_token_id`; `_all_stop_token_ids`
                        // only guards `min_tokens` there.
                        let stop_ids = map_get(&sampling, "stop_token_ids")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_u64).map(|t| t as u32).collect())
                            .unwrap_or_default();
                        let ignore_eos = map_get(&sampling, "ignore_eos").and_then(Value::as_bool).unwrap_or(false);
                        let eos = map_get(&sampling, "_eos_token_id")
                            .and_then(Value::as_u64)
                            .map(|t| t as u32)
                            .filter(|_| !ignore_eos);
                        let text: String = prompt.iter().map(|&t| t as u8 as char).collect();
                        events.lock().unwrap().push(EngineEvent::Added {
                            id: id.clone(),
                            external_id: slots.get(16).and_then(Value::as_str).map(str::to_owned),
                            prompt: prompt.clone(),
                            sampling,
                            dp_rank: slots.get(8).and_then(Value::as_u64),
                            wave: slots.get(12).and_then(Value::as_u64),
                        });
                        if text.starts_with("DIE") {
                            push.send(&b"ENGINE_CORE_DEAD"[..], 0).unwrap();
                            dead = true;
                            continue;
                        }
                        let mode = if text.starts_with("HANG") {
                            Mode::Hang
                        } else if text.starts_with("ERROR") {
                            Mode::Error
                        } else if text.contains("REJECT") {
                            Mode::Rejected("validation_error", false)
                        } else if text.contains("PAUSED") {
                            Mode::Rejected("engine_paused", true)
                        } else if text.starts_with("FLOOD") {
                            Mode::Flood
                        } else if text.contains("BURST") {
                            Mode::Burst
                        } else {
                            Mode::Echo
                        };
                        active.push(Active { id, prompt, max_tokens, generated: 0, stop_ids, eos, mode });
                    }
                    0x01 => {
                        let ids: Vec<String> =
                            payload.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
                        active.retain(|a| !ids.contains(&a.id));
                        events.lock().unwrap().push(EngineEvent::Aborted(ids));
                    }
                    0x03 => {
                        let slots = payload.as_array().unwrap();
                        let call_id = slots[1].clone();
                        let method = slots[2].as_str().unwrap().to_string();
                        events
                            .lock()
                            .unwrap()
                            .push(EngineEvent::Utility { method: method.clone(), args: slots[3].clone() });
                        let reply = if method == "fail" {
                            Value::Array(vec![call_id, Value::from("it failed"), Value::Nil])
                        } else {
                            Value::Array(vec![
                                call_id,
                                Value::Nil,
                                Value::Array(vec![Value::Nil, Value::from(format!("ok:{method}"))]),
                            ])
                        };
                        let message = Value::Array(vec![
                            Value::from(spec.index),
                            Value::Array(vec![]),
                            Value::Nil,
                            Value::F64(now()),
                            reply,
                        ]);
                        push.send(encode(&message), 0).unwrap();
                    }
                    other => panic!("mock engine: unexpected request type {other}"),
                }
            }
        }
        if dead || active.is_empty() || Instant::now() < next_step {
            continue;
        }
        next_step = Instant::now() + spec.step;
        let mut outputs = Vec::new();
        for a in active.iter_mut().filter(|a| a.mode != Mode::Hang) {
            if a.mode == Mode::Error {
                outputs.push(Value::Array(vec![
                    a.id.as_str().into(),
                    Value::Array(vec![]),
                    Value::Nil,
                    Value::Nil,
                    Value::Nil,
                    Value::from(3),
                ]));
                a.generated = a.max_tokens;
                continue;
            }
            if let Mode::Rejected(code, retryable) = a.mode {
                // vLLM's 19-slot EngineCoreOutput: the RequestError is the last slot.
                let mut slots = vec![a.id.as_str().into(), Value::Array(vec![])];
                slots.extend([Value::Nil, Value::Nil, Value::Nil, Value::from(3)]);
                slots.extend(std::iter::repeat_n(Value::Nil, 12));
                slots.push(Value::Map(vec![
                    ("code".into(), code.into()),
                    ("message".into(), format!("{code} from the mock engine").into()),
                    ("retryable".into(), retryable.into()),
                ]));
                outputs.push(Value::Array(slots));
                a.generated = a.max_tokens;
                continue;
            }
            if a.mode == Mode::Flood {
                let tokens = (0..4 * a.max_tokens).map(|i| Value::from(a.prompt[i % a.prompt.len()])).collect();
                outputs.push(Value::Array(vec![a.id.as_str().into(), Value::Array(tokens)]));
                continue;
            }
            if a.mode == Mode::Burst {
                while a.generated < a.max_tokens {
                    let count = spec.tokens_per_step.min(a.max_tokens - a.generated);
                    let tokens =
                        (a.generated..a.generated + count).map(|i| Value::from(a.prompt[i % a.prompt.len()])).collect();
                    a.generated += count;
                    let finish = if a.generated == a.max_tokens { Value::from(1) } else { Value::Nil };
                    let output = Value::Array(vec![
                        a.id.as_str().into(),
                        Value::Array(tokens),
                        Value::Nil,
                        Value::Nil,
                        Value::Nil,
                        finish,
                    ]);
                    let message = Value::Array(vec![
                        Value::from(spec.index),
                        Value::Array(vec![output]),
                        Value::Nil,
                        Value::F64(now()),
                    ]);
                    push.send(encode(&message), 0).unwrap();
                }
                continue;
            }
            let mut tokens = Vec::new();
            let mut finish = Value::Nil;
            let mut stop_reason = Value::Nil;
            while tokens.len() < spec.tokens_per_step && a.generated < a.max_tokens {
                let token = a.prompt[a.generated % a.prompt.len()];
                a.generated += 1;
                tokens.push(Value::from(token));
                if a.eos == Some(token) || a.stop_ids.contains(&token) {
                    finish = Value::from(0);
                    // EOS finishes with a nil stop_reason, a stop token with itself.
                    if a.eos != Some(token) {
                        stop_reason = Value::from(token);
                    }
                    a.generated = a.max_tokens;
                    break;
                }
            }
            if finish.is_nil() && a.generated >= a.max_tokens {
                finish = Value::from(1);
            }
            outputs.push(Value::Array(vec![
                a.id.as_str().into(),
                Value::Array(tokens),
                Value::Nil,
                Value::Nil,
                Value::Nil,
                finish,
                stop_reason,
            ]));
        }
        active.retain(|a| a.generated < a.max_tokens);
        let stats = Value::Map(vec![
            (Value::from("num_running_reqs"), Value::from(active.len() as u64)),
            (Value::from("num_waiting_reqs"), Value::from(0)),
        ]);
        if !outputs.is_empty() {
            let message = Value::Array(vec![Value::from(spec.index), Value::Array(outputs), stats, Value::F64(now())]);
            push.send(encode(&message), 0).unwrap();
        }
    }
}
