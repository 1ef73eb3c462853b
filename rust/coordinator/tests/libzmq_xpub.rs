//! The subscriber against a real libzmq XPUB socket, as vLLM's coordinator binds it.

use rmpv::Value;
use std::time::Duration;
use tokio::sync::watch;
use vllm_rs_coordinator::{subscribe, CoordinatorAddress, EngineCounts, Published, SubscriberSettings};

fn encode(value: Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

fn counts_message(counts: &[(u64, u64, f64)], wave: u64, running: bool) -> Vec<u8> {
    let counts = counts.iter().map(|&(w, r, kv)| Value::Array(vec![w.into(), r.into(), kv.into()])).collect();
    encode(Value::Array(vec![Value::Array(counts), wave.into(), running.into()]))
}

/// An XPUB bound at `endpoint` that reports subscriptions, like vLLM's `publish_front`.
fn xpub(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let socket = ctx.socket(zmq::XPUB).unwrap();
    socket.set_xpub_verbose(true).unwrap();
    socket.set_rcvtimeo(20_000).unwrap();
    socket.set_linger(0).unwrap();
    socket.bind(endpoint).unwrap();
    socket
}

/// Waits until `state` satisfies `done` (the test's own timeout bounds it).
async fn wait_for(state: &mut watch::Receiver<Published>, done: impl Fn(&Published) -> bool) -> Published {
    tokio::time::timeout(Duration::from_secs(20), state.wait_for(|s| done(s))).await.unwrap().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribes_follows_counts_and_waves_and_resubscribes_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("vllm-rs-coordinator-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let endpoint = format!("ipc://{}/publish", dir.display());
    let ctx = zmq::Context::new();
    let publisher = xpub(&ctx, &endpoint);

    let (tx, mut state) = watch::channel(Published::default());
    let address = CoordinatorAddress::parse(&endpoint).unwrap();
    let task = tokio::spawn(subscribe(address, SubscriberSettings::default(), tx));

    let publisher = tokio::task::spawn_blocking(move || {
        assert_eq!(publisher.recv_bytes(0).unwrap(), b"\x01", "the first message is the subscription to everything");
        publisher.send(counts_message(&[(1, 2, 0.5), (3, 4, 0.0)], 7, true), 0).unwrap();
        publisher
    })
    .await
    .unwrap();
    let got = wait_for(&mut state, |s| s.current_wave == 7).await;
    assert_eq!(
        got.counts.unwrap(),
        vec![
            EngineCounts { waiting: 1, running: 2, kv_cache_usage: 0.5 },
            EngineCounts { waiting: 3, running: 4, kv_cache_usage: 0.0 }
        ]
    );
    assert!(got.engines_running);

    // A wave-only message, then something that is not the coordinator's format (skipped).
    publisher.send(b"not msgpack".as_slice(), 0).unwrap();
    publisher.send(encode(Value::Array(vec![Value::Nil, 8.into(), false.into()])), 0).unwrap();
    let got = wait_for(&mut state, |s| s.current_wave == 8).await;
    assert!(!got.engines_running);
    assert_eq!(got.counts.unwrap()[1].running, 4, "a wave-only message keeps the counts");

    // The coordinator goes away and comes back: the subscriber reconnects and subscribes again.
    drop(publisher);
    let publisher = xpub(&ctx, &endpoint);
    let publisher = tokio::task::spawn_blocking(move || {
        assert_eq!(publisher.recv_bytes(0).unwrap(), b"\x01");
        publisher.send(counts_message(&[(0, 0, 0.0), (0, 9, 0.0)], 9, true), 0).unwrap();
        publisher
    })
    .await
    .unwrap();
    let got = wait_for(&mut state, |s| s.current_wave == 9).await;
    assert_eq!(got.counts.unwrap()[1].running, 9);

    // Every receiver gone: the subscription ends.
    drop(state);
    tokio::time::timeout(Duration::from_secs(20), task).await.unwrap().unwrap();
    drop(publisher);
    let _ = std::fs::remove_dir_all(&dir);
}
