//! Times the hot paths of the engine-core codec: encoding ADD payloads and
//! decoding output batches, as the reference engine sends them (2 slots per
//! output) and as vLLM 0.33 does (all 19 slots, scheduler stats).
//!
//! `cargo run --release -p vllm-rs-wire --example wire_bench [ROUNDS]`
//! prints the best time per item over ROUNDS rounds (default 7). It uses only
//! `encode_add` and `decode_outputs`, so the same file times other versions
//! of the codec; on a shared machine only ratios measured in one run mean
//! anything (docs/frontend-performance.md, "The engine-core codec").

use rmpv::Value;
use std::hint::black_box;
use std::time::Instant;
use vllm_rs_wire::codec::{decode_outputs, encode_add};
use vllm_rs_wire::protocol::{EngineRequest, OutputsMessage, SamplingParams};

const REQUESTS: usize = 20_000;
const BATCHES: usize = 2_000;
const OUTPUTS_PER_BATCH: usize = 64;

fn request(i: usize) -> EngineRequest {
    EngineRequest {
        request_id: format!("cmpl-{i:016x}-0000abcd"),
        prompt_token_ids: (0..128).map(|t| (t * 37 + i as u32) % 50_000).collect(),
        sampling: SamplingParams {
            temperature: Some(0.7),
            top_p: Some(0.95),
            max_tokens: Some(256),
            stop_token_ids: vec![],
            all_stop_token_ids: vec![2],
            eos_token_id: Some(2),
            ..Default::default()
        },
        arrival_time: 1_767_225_600.0 + i as f64,
        data_parallel_rank: None,
        client_index: 0,
        external_request_id: format!("cmpl-{i:016x}"),
        pooling: None,
    }
}

fn encode(value: &Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, value).unwrap();
    bytes
}

/// One batch: `OUTPUTS_PER_BATCH` outputs of one token each; `full` writes
/// vLLM's 19 slots and scheduler stats, else the reference engine's 2 slots.
fn batch(full: bool) -> Vec<u8> {
    let outputs = (0..OUTPUTS_PER_BATCH)
        .map(|i| {
            let mut slots = vec![Value::from(format!("cmpl-{i:016x}-0000abcd")), Value::Array(vec![Value::from(1234)])];
            if full {
                slots.extend(std::iter::repeat_n(Value::Nil, 11));
                slots.push(Value::from(0));
                slots.extend(std::iter::repeat_n(Value::Nil, 5));
            }
            Value::Array(slots)
        })
        .collect();
    let key = |k: &str| Value::from(k);
    let stats = Value::Map(vec![
        (key("num_running_reqs"), Value::from(64)),
        (key("num_waiting_reqs"), Value::from(3)),
        (key("num_skipped_waiting_reqs"), Value::from(0)),
        (key("step_counter"), Value::from(77)),
        (key("current_wave"), Value::from(0)),
        (key("kv_cache_usage"), Value::F64(0.25)),
        (
            key("prefix_cache_stats"),
            Value::Map(vec![
                (key("reset"), Value::from(false)),
                (key("requests"), Value::from(2)),
                (key("queries"), Value::from(256)),
                (key("hits"), Value::from(128)),
                (key("hits_by_source"), Value::Map(vec![])),
            ]),
        ),
        (key("kv_cache_eviction_events"), Value::Array(vec![])),
        (key("waiting_lora_adapters"), Value::Map(vec![])),
        (key("running_lora_adapters"), Value::Map(vec![])),
    ]);
    let mut message = vec![Value::from(0), Value::Array(outputs)];
    if full {
        message.extend([stats, Value::F64(12345.678), Value::Nil, Value::Nil, Value::Nil, Value::Nil, Value::Nil]);
    } else {
        message.extend([Value::Nil, Value::F64(12345.678)]);
    }
    encode(&Value::Array(message))
}

/// Best of `rounds` timings of `run`, in nanoseconds per item of `items`.
fn best(rounds: usize, items: usize, mut run: impl FnMut()) -> f64 {
    (0..rounds)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64() * 1e9 / items as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let rounds = std::env::args().nth(1).map_or(7, |r| r.parse().expect("ROUNDS is a number"));
    let requests: Vec<EngineRequest> = (0..REQUESTS).map(request).collect();
    let encode_ns = best(rounds, REQUESTS, || {
        for r in &requests {
            black_box(encode_add(black_box(r), 0));
        }
    });
    let mut decode_ns = Vec::new();
    for full in [false, true] {
        let frame = batch(full);
        decode_ns.push(best(rounds, BATCHES * OUTPUTS_PER_BATCH, || {
            for _ in 0..BATCHES {
                let Ok(OutputsMessage::Batch { outputs, .. }) = decode_outputs(black_box(&frame), &[]) else {
                    panic!("the batch does not decode")
                };
                black_box(outputs);
            }
        }));
    }
    println!(
        "encode_add {encode_ns:.1} ns/request | decode {:.1} ns/output (2 slots) | decode {:.1} ns/output (19 slots + stats)",
        decode_ns[0], decode_ns[1]
    );
}
