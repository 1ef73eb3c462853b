//! `--coordinator-address`: the frontend subscribes to a data-parallel
//! coordinator (a real libzmq XPUB, as vLLM's `DPCoordinator` binds it),
//! balances on the counts it publishes and stamps its wave on requests.

mod common;

use common::mock_engine::EngineEvent;
use common::{post_json, temp_dir, Frontend, Options};
use rmpv::Value;
use serde_json::json;
use std::time::Duration;
use vllm_rs_test_support::wait_until_async;

fn encode(value: Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

/// `[counts, wave, running]` with `[waiting, running, kv_cache_usage]` per engine.
fn published(counts: &[(u64, u64)], wave: u64, running: bool) -> Vec<u8> {
    let counts = counts.iter().map(|&(w, r)| Value::Array(vec![w.into(), r.into(), 0.0.into()])).collect();
    encode(Value::Array(vec![Value::Array(counts), wave.into(), running.into()]))
}

fn waves(events: &[EngineEvent]) -> Vec<Option<u64>> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Added { wave, .. } => Some(*wave),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn counts_steer_routing_and_the_wave_reaches_the_engines() {
    let dir = temp_dir("coordinator");
    let endpoint = format!("ipc://{}/publish", dir.display());
    let ctx = zmq::Context::new();
    let publisher = ctx.socket(zmq::XPUB).unwrap();
    publisher.set_xpub_verbose(true).unwrap();
    publisher.set_rcvtimeo(30_000).unwrap();
    publisher.bind(&endpoint).unwrap();

    // Engines 2 and 3 of a deployment of 4: the published counts list all four.
    let options = Options {
        engine_count: 2,
        start_index: 2,
        dp_size: 4,
        extra_args: vec!["--coordinator-address".into(), endpoint.clone()],
        ..Default::default()
    };
    let (fe, engines) = Frontend::start_with_engines(options, |_| {}).await;
    let publisher = tokio::task::spawn_blocking(move || {
        assert_eq!(publisher.recv_bytes(0).unwrap(), b"\x01", "the frontend subscribes to everything");
        publisher
    })
    .await
    .unwrap();

    // Engine 2 is loaded (in the coordinator's view), engine 3 idle; wave 5.
    publisher.send(published(&[(0, 0), (0, 0), (40, 10), (0, 0)], 5, true), 0).unwrap();
    let url = fe.url("/v1/completions");
    // The update reaches the frontend asynchronously: send until a request carries wave 5.
    let (url, engines) = (&url, &engines);
    wait_until_async("a request carrying the published wave", Duration::from_secs(10), || async move {
        let (status, body) = post_json(url, &json!({"prompt": "ab", "max_tokens": 1})).await;
        assert_eq!(status, 200, "{body}");
        engines.iter().any(|e| waves(&e.events()).contains(&Some(5)))
    })
    .await;
    let before: Vec<usize> = engines.iter().map(|e| e.added().len()).collect();
    for _ in 0..6 {
        let (status, body) = post_json(url, &json!({"prompt": "ab", "max_tokens": 1})).await;
        assert_eq!(status, 200, "{body}");
    }
    let after: Vec<usize> = engines.iter().map(|e| e.added().len()).collect();
    assert_eq!(after[0], before[0], "engine 2 is loaded in the coordinator's counts: it gets nothing");
    assert_eq!(after[1], before[1] + 6);
    assert!(waves(&engines[1].events()).ends_with(&[Some(5); 6]));

    // A wave-only message moves the wave and keeps the counts; now engine 3 is the loaded one.
    publisher.send(encode(Value::Array(vec![Value::Nil, 6.into(), false.into()])), 0).unwrap();
    publisher.send(published(&[(0, 0), (0, 0), (0, 0), (40, 10)], 6, false), 0).unwrap();
    wait_until_async("requests following the new counts and wave", Duration::from_secs(10), || async move {
        let (status, _) = post_json(url, &json!({"prompt": "ab", "max_tokens": 1})).await;
        assert_eq!(status, 200);
        waves(&engines[0].events()).last() == Some(&Some(6))
    })
    .await;
    drop(fe);
}
