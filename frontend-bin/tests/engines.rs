//! Engine-side behaviour: data-parallel routing, aborts on disconnect, engine
//! death, malformed messages, utility calls, registration.

mod common;

use common::mock_engine::{EngineEvent, EngineSpec, MockEngine};
use common::{post_json, run_to_exit, run_to_exit_with_env, Frontend, Options, ZmqSockets};
use serde_json::{json, Value};
use std::time::Duration;

fn dp_options(count: u32, start: u32, dp: u32) -> Options {
    Options { engine_count: count, start_index: start, dp_size: dp, ..Default::default() }
}

#[tokio::test]
async fn two_engines_share_concurrent_requests() {
    let (fe, engines) = Frontend::start_with_engines(dp_options(2, 0, 2), |s| s.step = Duration::from_millis(10)).await;
    let url = fe.url("/v1/completions");
    let requests = (0..16).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { post_json(&url, &json!({"prompt": "abcdef", "max_tokens": 10})).await })
    });
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["text"], "abcdefabcd");
    }
    let counts: Vec<usize> = engines.iter().map(|e| e.added().len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 16);
    assert!(counts.iter().all(|&c| c >= 4), "unbalanced: {counts:?}");
}

#[tokio::test]
async fn data_parallel_rank_header_pins_the_engine() {
    let (fe, engines) = Frontend::start_with_engines(dp_options(2, 2, 4), |_| {}).await;
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client
            .post(fe.url("/v1/completions"))
            .header("X-data-parallel-rank", "3")
            .json(&json!({"prompt": "x", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(engines[0].added().len(), 0);
    assert_eq!(engines[1].added().len(), 3);
    assert!(engines[1].added().iter().all(|e| matches!(e, EngineEvent::Added { dp_rank: Some(3), .. })));
    let r = client
        .post(fe.url("/v1/completions"))
        .header("X-data-parallel-rank", "0")
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["param"], "x-data-parallel-rank");
}

#[tokio::test]
async fn client_disconnect_mid_stream_aborts_in_the_engine() {
    let (fe, engines) = Frontend::start_with_engines(Options::default(), |s| s.step = Duration::from_millis(20)).await;
    let mut r = reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .json(&json!({"prompt": "abc", "max_tokens": 1000, "stream": true}))
        .send()
        .await
        .unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(r);
    let id = match &engines[0].added()[0] {
        EngineEvent::Added { id, .. } => id.clone(),
        _ => unreachable!(),
    };
    assert!(
        engines[0].wait_for(Duration::from_secs(10), |events| events.contains(&EngineEvent::Aborted(vec![id.clone()]))).await,
        "no ABORT for {id}: {:?}",
        engines[0].events()
    );
    let load: Value = reqwest::get(fe.url("/load")).await.unwrap().json().await.unwrap();
    assert_eq!(load["server_load"], 0);
}

#[tokio::test]
async fn client_disconnect_while_waiting_aborts_too() {
    let (fe, engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let client = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let outcome = client.post(fe.url("/v1/completions")).json(&json!({"prompt": "HANG", "max_tokens": 5})).send().await;
    assert!(outcome.is_err(), "the hanging request should time out on the client");
    assert!(
        engines[0].wait_for(Duration::from_secs(10), |events| events.iter().any(|e| matches!(e, EngineEvent::Aborted(_)))).await,
        "no ABORT after the client gave up: {:?}",
        engines[0].events()
    );
}

#[tokio::test]
async fn engine_death_fails_requests_in_flight_and_health() {
    let (fe, engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let url = fe.url("/v1/completions");
    let hanging = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &json!({"prompt": "HANG", "max_tokens": 5})).await }
    });
    assert!(engines[0].wait_for(Duration::from_secs(5), |e| e.len() == 1).await);
    let (status, body) = post_json(&url, &json!({"prompt": "DIE", "max_tokens": 5})).await;
    assert_eq!(status, 500, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("ENGINE_CORE_DEAD"), "{body}");
    let (status, body) = hanging.await.unwrap();
    assert_eq!(status, 500, "{body}");
    let health = reqwest::get(fe.url("/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    assert_eq!(health.json::<Value>().await.unwrap()["error"]["code"], 503);
    let (status, _) = post_json(&url, &json!({"prompt": "x", "max_tokens": 1})).await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn malformed_engine_message_is_skipped() {
    let (fe, _engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let (status, body) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "GARBAGE", "max_tokens": 3})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "GAR");
    assert!(fe.stderr().contains("malformed"), "{}", fe.stderr());
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn utility_calls_reach_every_engine() {
    let (fe, engines) = Frontend::start_with_engines(dp_options(2, 0, 2), |_| {}).await;
    let client = reqwest::Client::new();
    let r = client.post(fe.url("/reset_prefix_cache")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client.post(fe.url("/sleep?level=2")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    for engine in &engines {
        let methods: Vec<(String, Value)> = engine
            .events()
            .into_iter()
            .filter_map(|e| match e {
                EngineEvent::Utility { method, args } => Some((method, serde_json::to_value(args.to_string()).unwrap())),
                _ => None,
            })
            .collect();
        assert_eq!(methods.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), vec!["reset_prefix_cache", "sleep"]);
        assert_eq!(methods[1].1, json!("[2]"));
    }
}

#[tokio::test]
async fn empty_registration_and_address_mode_work() {
    let options = Options { zmq: ZmqSockets::Addresses, ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |s| s.registration = None).await;
    let (status, body) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "hey", "max_tokens": 3})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "hey");
}

#[tokio::test]
async fn ipc_listeners_are_adopted() {
    let options = Options { zmq: ZmqSockets::IpcListeners, ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    let (status, _) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "hey", "max_tokens": 3})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn engines_may_connect_before_the_frontend_starts() {
    // The listeners exist (and accept in the kernel) before the process runs.
    let mut fe = Frontend::spawn(Options::default());
    let engine = MockEngine::start(EngineSpec::new(0, &fe.input_address, &fe.output_address));
    fe.wait_ready(Duration::from_secs(30)).await;
    let (status, _) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "a", "max_tokens": 1})).await;
    assert_eq!(status, 200);
    drop(engine);
}

#[tokio::test]
async fn registration_timeout_names_the_missing_engines() {
    let mut options = dp_options(3, 0, 3);
    options.args = json!({"model_tag": "toy", "engine_ready_timeout_secs": 1});
    let mut fe = Frontend::spawn(options);
    let _engine = MockEngine::start(EngineSpec::new(1, &fe.input_address, &fe.output_address));
    let status = fe.wait_exit(Duration::from_secs(20)).expect("the frontend should give up");
    assert_eq!(status.code(), Some(1));
    let log = fe.stderr();
    assert!(log.contains("missing engine(s): 0, 2"), "{log}");
}

#[tokio::test]
async fn engine_outside_the_range_is_fatal() {
    let mut fe = Frontend::spawn(dp_options(1, 0, 2));
    let _engine = MockEngine::start(EngineSpec::new(1, &fe.input_address, &fe.output_address));
    let status = fe.wait_exit(Duration::from_secs(20)).expect("the frontend should fail");
    assert_eq!(status.code(), Some(1));
    assert!(fe.stderr().contains("engine 1 registered"), "{}", fe.stderr());
}

#[test]
fn usage_errors_exit_2_naming_the_flag_or_key() {
    let base = |args_json: &str, extra: &[&str]| -> (Option<i32>, String) {
        let mut args = vec!["frontend", "--listen-fd", "0", "--input-address", "tcp://127.0.0.1:1", "--output-address", "tcp://127.0.0.1:2"];
        args.extend(["--engine-start-index", "0", "--engine-count", "1", "--data-parallel-size", "1"]);
        args.extend(extra);
        args.extend(["--args-json", args_json]);
        let (status, text) = run_to_exit(&args, Duration::from_secs(20));
        (status.code(), text)
    };
    let (code, text) = base(r#"{"served_model_name": "x"}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("model_tag"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy", "max_model_len": "long"}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("max_model_len"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy"}"#, &[]); // fd 0 is not a socket here
    assert_eq!(code, Some(2));
    assert!(text.contains("--listen-fd"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy"}"#, &["--grpc-listen-fd", "5"]);
    assert_eq!(code, Some(2));
    assert!(text.contains("--grpc-listen-fd") && text.contains("not supported"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy"}"#, &["--coordinator-address", "tcp://x:1"]);
    assert_eq!(code, Some(2));
    assert!(text.contains("--coordinator-address") && text.contains("not supported"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy", "api_key": 123456789}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("api_key") && !text.contains("123456789"), "{text}");
    for bad in ["0", "many"] {
        let args = ["frontend", "--listen-fd", "0", "--input-address", "tcp://127.0.0.1:1", "--output-address",
            "tcp://127.0.0.1:2", "--engine-start-index", "0", "--engine-count", "1", "--data-parallel-size", "1",
            "--args-json", r#"{"model_tag": "toy"}"#];
        let (status, text) = run_to_exit_with_env(&args, &[("TOKIO_WORKER_THREADS", bad)], Duration::from_secs(20));
        assert_eq!(status.code(), Some(2), "{text}");
        assert!(text.contains("TOKIO_WORKER_THREADS") && !text.contains("panicked"), "{text}");
    }
}

#[test]
fn help_and_version() {
    let (status, text) = run_to_exit(&["--version"], Duration::from_secs(10));
    assert!(status.success());
    assert!(text.contains(env!("CARGO_PKG_VERSION")));
    let (status, text) = run_to_exit(&["frontend", "--help"], Duration::from_secs(10));
    assert!(status.success());
    for flag in ["--listen-fd", "--input-listener-fd", "--output-listener-fd", "--engine-start-index", "--engine-count", "--data-parallel-size", "--grpc-listen-fd", "--coordinator-address", "--args-json"] {
        assert!(text.contains(flag), "{flag} missing from help");
    }
    let (status, _) = run_to_exit(&["frontend", "--listen-fd", "x"], Duration::from_secs(10));
    assert_eq!(status.code(), Some(2));
}
