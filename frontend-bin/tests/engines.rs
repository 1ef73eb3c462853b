//! Engine-side behaviour: data-parallel routing, aborts on disconnect, engine
//! death, malformed messages, utility calls, registration, and the engine
//! sockets as a trust boundary (peer user, identity ownership, limits,
//! stalls, untrusted outputs).

mod common;

use common::mock_engine::{EngineEvent, EngineSpec, MockEngine};
use common::{exit_of, post_json, run_to_exit, Frontend, Options, ZmqSockets};
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
    let mut r = long_stream(&fe).await;
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(r);
    let id = match &engines[0].added()[0] {
        EngineEvent::Added { id, .. } => id.clone(),
        _ => unreachable!(),
    };
    assert!(
        engines[0]
            .wait_for(Duration::from_secs(10), |events| events.contains(&EngineEvent::Aborted(vec![id.clone()])))
            .await,
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
        engines[0]
            .wait_for(Duration::from_secs(10), |events| events.iter().any(|e| matches!(e, EngineEvent::Aborted(_))))
            .await,
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
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("ENGINE_CORE_DEAD"), "{body}");
    let (status, body) = hanging.await.unwrap();
    assert_eq!(status, 503, "{body}");
    let health = reqwest::get(fe.url("/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    assert_eq!(health.json::<Value>().await.unwrap()["error"]["code"], 503);
    let (status, _) = post_json(&url, &json!({"prompt": "x", "max_tokens": 1})).await;
    assert_eq!(status, 503);
}

/// A PUSH peer on the frontend's output socket, beside the engines.
fn output_pusher(context: &zmq::Context, address: &str) -> zmq::Socket {
    let push = context.socket(zmq::PUSH).unwrap();
    push.set_linger(0).unwrap();
    push.connect(address).unwrap();
    push
}

/// Posts JSON with a client deadline, so that a request the frontend lost fails the test instead of hanging it.
async fn post_json_within(url: &str, body: &Value, timeout: Duration) -> (u16, Value) {
    let client = reqwest::Client::builder().timeout(timeout).build().unwrap();
    let r = client.post(url).json(body).send().await.unwrap_or_else(|e| panic!("no answer within {timeout:?}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn undecodable_messages_drop_only_their_connection() {
    let (fe, _engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let context = zmq::Context::new();
    let push = output_pusher(&context, &fe.output_address);
    // An empty EngineCoreOutputs [0, []] (3 bytes), then a reserved msgpack byte.
    push.send(&[0x92u8, 0x00, 0x90][..], 0).unwrap();
    assert!(fe.wait_for_log("does not decode", 1, Duration::from_secs(10)).await, "{}", fe.stderr());
    push.send(&[0xc1u8][..], 0).unwrap(); // reaches the frontend over the PUSH's new connection
    assert!(fe.wait_for_log("does not decode", 2, Duration::from_secs(10)).await, "{}", fe.stderr());
    drop(push);
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
    let (status, body) = post_json_within(
        &fe.url("/v1/completions"),
        &json!({"prompt": "abc", "max_tokens": 3}),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "abc");
}

#[tokio::test]
async fn outputs_beyond_max_tokens_are_cut_and_the_request_finishes_with_length() {
    let (fe, engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let (status, body) = post_json_within(
        &fe.url("/v1/completions"),
        &json!({"prompt": "FLOOD", "max_tokens": 7}),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "FLOODFL");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 7);
    let id = match &engines[0].added()[0] {
        EngineEvent::Added { id, .. } => id.clone(),
        _ => unreachable!(),
    };
    assert!(
        engines[0]
            .wait_for(Duration::from_secs(10), |events| events.contains(&EngineEvent::Aborted(vec![id.clone()])))
            .await,
        "the engine was not told to stop the request: {:?}",
        engines[0].events()
    );
    // Outputs for requests nobody sent are dropped, not fatal.
    let context = zmq::Context::new();
    let push = output_pusher(&context, &fe.output_address);
    let forged = rmpv::Value::Array(vec![
        0.into(),
        rmpv::Value::Array(vec![rmpv::Value::Array(vec![
            "nobody-sent-this".into(),
            rmpv::Value::Array(vec![1.into()]),
        ])]),
    ]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &forged).unwrap();
    push.send(bytes, 0).unwrap();
    drop(push);
    let (status, body) = post_json_within(
        &fe.url("/v1/completions"),
        &json!({"prompt": "ok", "max_tokens": 2}),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!((status, body["choices"][0]["text"].clone()), (200, json!("ok")), "{body}");
}

#[tokio::test]
async fn an_engine_message_over_the_limit_drops_its_connection_before_it_is_read() {
    let options = Options { args: json!({"model_tag": "toy", "max_engine_message_bytes": 4096}), ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    let context = zmq::Context::new();
    let push = output_pusher(&context, &fe.output_address);
    push.send(vec![0x90u8; 10_000], 0).unwrap();
    assert!(fe.wait_for_log("over the limit", 1, Duration::from_secs(10)).await, "{}", fe.stderr());
    drop(push);
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
    let (status, _) = post_json_within(
        &fe.url("/v1/completions"),
        &json!({"prompt": "abc", "max_tokens": 3}),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_second_connection_with_an_engines_identity_is_refused_and_its_close_drops_nothing() {
    let (fe, _engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let context = zmq::Context::new();
    let impostor = context.socket(zmq::DEALER).unwrap();
    impostor.set_linger(0).unwrap();
    impostor.set_identity(&0u16.to_le_bytes()).unwrap();
    impostor.connect(&fe.input_address).unwrap();
    assert!(fe.wait_for_log("already holds its identity", 1, Duration::from_secs(10)).await, "{}", fe.stderr());
    let url = fe.url("/v1/completions");
    let (status, body) =
        post_json_within(&url, &json!({"prompt": "abc", "max_tokens": 3}), Duration::from_secs(10)).await;
    assert_eq!((status, body["choices"][0]["text"].clone()), (200, json!("abc")), "{body}");
    drop(impostor);
    drop(context);
    let (status, body) =
        post_json_within(&url, &json!({"prompt": "def", "max_tokens": 3}), Duration::from_secs(10)).await;
    assert_eq!((status, body["choices"][0]["text"].clone()), (200, json!("def")), "{body}");
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_engine_whose_own_connection_ends_fails_its_requests_and_health() {
    let (fe, mut engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    let url = fe.url("/v1/completions");
    let hanging = tokio::spawn({
        let url = url.clone();
        async move { post_json_within(&url, &json!({"prompt": "HANG", "max_tokens": 5}), Duration::from_secs(30)).await }
    });
    assert!(engines[0].wait_for(Duration::from_secs(10), |e| e.len() == 1).await);
    drop(engines.pop()); // closes the engine's sockets
    let (status, body) = hanging.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("engine 0 is gone: its connection closed"), "{body}");
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 503);
}

/// Runs a mock engine in a process of its own (see `mock_engine_process`).
struct EngineProcess(std::process::Child);

impl EngineProcess {
    fn start(index: u32, fe: &Frontend, step: Duration) -> Self {
        Self::start_with_heartbeat(index, fe, step, None)
    }

    /// An engine process whose sockets send ZMTP PINGs announcing `ttl`.
    fn start_with_heartbeat(index: u32, fe: &Frontend, step: Duration, ttl: Option<Duration>) -> Self {
        let ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis());
        let spec = format!("{index}|{}|{}|{}|{ttl_ms}", fe.input_address, fe.output_address, step.as_millis());
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["mock_engine_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ENGINE_SPEC_ENV, spec)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        EngineProcess(child)
    }

    fn signal(&self, signal: libc::c_int) {
        unsafe { libc::kill(self.0.id() as i32, signal) };
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ENGINE_SPEC_ENV: &str = "VLLM_RS_TEST_ENGINE_SPEC";

/// Not a test: the body of an `EngineProcess`, which runs until its stdin closes.
#[test]
#[ignore = "helper run by other tests as an engine process"]
fn mock_engine_process() {
    let spec = std::env::var(ENGINE_SPEC_ENV).expect("run by EngineProcess");
    let [index, input, output, step_ms, ttl_ms]: [&str; 5] = spec.split('|').collect::<Vec<_>>().try_into().unwrap();
    let mut engine = EngineSpec::new(index.parse().unwrap(), input, output);
    engine.step = Duration::from_millis(step_ms.parse().unwrap());
    engine.heartbeat_ttl = Some(Duration::from_millis(ttl_ms.parse().unwrap())).filter(|ttl| !ttl.is_zero());
    let _engine = MockEngine::start(engine);
    let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1]);
}

#[tokio::test]
async fn a_stopped_engine_is_marked_hung_after_the_stall_timeout() {
    let options = Options { args: json!({"model_tag": "toy", "engine_stall_timeout_s": 1}), ..Default::default() };
    let mut fe = Frontend::spawn(options);
    let engine = EngineProcess::start(0, &fe, Duration::from_millis(20));
    fe.wait_ready(Duration::from_secs(30)).await;
    let mut stream = long_stream(&fe).await;
    assert_eq!(stream.status(), 200);
    // A busy engine that keeps sending is not hung, however long the request runs.
    let busy_since = std::time::Instant::now();
    let mut body = String::new();
    while busy_since.elapsed() < Duration::from_millis(1500) {
        body.push_str(&String::from_utf8_lossy(&stream.chunk().await.unwrap().expect("the stream ended early")));
    }
    assert!(!body.contains("error"), "{body}");
    engine.signal(libc::SIGSTOP);
    let payloads = drain_sse(&mut stream, Duration::from_secs(30)).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"), "{payloads:?}");
    let error: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("engine 0 is hung"), "{error}");
    let health = reqwest::get(fe.url("/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    engine.signal(libc::SIGCONT);
}

/// A streamed completion of up to 1000 tokens from `fe` (long enough to
/// outlast what each test does to its engine).
async fn long_stream(fe: &Frontend) -> reqwest::Response {
    reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .json(&json!({"prompt": "abc", "max_tokens": 1000, "stream": true}))
        .send()
        .await
        .unwrap()
}

/// Reads `stream` to its end (at most `within`); every payload of its SSE body.
async fn drain_sse(stream: &mut reqwest::Response, within: Duration) -> Vec<String> {
    let mut body = String::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Some(chunk) =
        tokio::time::timeout_at(deadline, stream.chunk()).await.expect("the stream did not end in time").unwrap()
    {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    common::sse_payloads(&body)
}

#[tokio::test]
async fn an_engine_silent_past_its_heartbeat_ttl_is_lost_with_its_requests_and_health() {
    // The stall bound is far away: only the engine's heartbeat TTL (1 s) can end this.
    let options = Options { args: json!({"model_tag": "toy", "engine_stall_timeout_s": 600}), ..Default::default() };
    let mut fe = Frontend::spawn(options);
    let engine = EngineProcess::start_with_heartbeat(0, &fe, Duration::from_millis(20), Some(Duration::from_secs(1)));
    fe.wait_ready(Duration::from_secs(30)).await;
    let mut stream = long_stream(&fe).await;
    assert_eq!(stream.status(), 200);
    // Several TTLs of a live engine (outputs and PINGs flowing) lose nothing.
    let live_since = std::time::Instant::now();
    while live_since.elapsed() < Duration::from_secs(3) {
        let chunk = stream.chunk().await.unwrap().expect("the stream ended early");
        assert!(!String::from_utf8_lossy(&chunk).contains("error"), "{chunk:?}");
    }
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
    assert!(fe.wait_for_log("announces a heartbeat TTL of 1s", 1, Duration::from_secs(30)).await, "{}", fe.stderr());
    // Stopped, the engine sends nothing but keeps its connections open (no FIN, no RST).
    engine.signal(libc::SIGSTOP);
    let payloads = drain_sse(&mut stream, Duration::from_secs(60)).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"), "{payloads:?}");
    let error: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("engine 0 is gone: its connection was dropped"), "{error}");
    assert!(message.contains("heartbeat TTL"), "{error}");
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 503);
    engine.signal(libc::SIGCONT);
}

#[tokio::test]
async fn peers_of_another_user_are_refused_on_abstract_engine_sockets() {
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("skipped: needs root to run a client as another user");
    }
    let Some(setpriv) = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        return eprintln!("skipped: setpriv is not installed");
    };
    let options = Options { zmq: ZmqSockets::AbstractAddresses, ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    // The user 65534 cannot reach this test binary where cargo put it: run a world-readable copy.
    let dir = common::temp_dir("foreign");
    let copy = dir.join("client");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for address in [&fe.input_address, &fe.output_address] {
        let name = address.strip_prefix("ipc://@").unwrap();
        let run = |as_nobody: bool| {
            let mut command = std::process::Command::new(if as_nobody { setpriv } else { copy.to_str().unwrap() });
            if as_nobody {
                command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&copy);
            }
            let output = command
                .args(["connect_and_read_greeting", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                .env(CONNECT_ENV, name)
                .output()
                .unwrap();
            String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
        };
        let ours = run(false);
        assert!(ours.contains("greeting bytes: 64"), "{ours}");
        let foreign = run(true);
        assert!(foreign.contains("greeting bytes: 0"), "the other user's connection was served: {foreign}");
    }
    assert!(fe.wait_for_log("runs as uid 65534", 2, Duration::from_secs(10)).await, "{}", fe.stderr());
    let (status, _) = post_json_within(
        &fe.url("/v1/completions"),
        &json!({"prompt": "abc", "max_tokens": 3}),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status, 200);
}

const CONNECT_ENV: &str = "VLLM_RS_TEST_CONNECT_ABSTRACT";

/// Not a test: connects to the abstract socket in `CONNECT_ENV` and prints how
/// many greeting bytes the frontend sent before it closed (64: served).
#[test]
#[ignore = "helper run by peers_of_another_user_are_refused_on_abstract_engine_sockets"]
fn connect_and_read_greeting() {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let name = std::env::var(CONNECT_ENV).expect("run by the test");
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut greeting = Vec::new();
    let _ = stream.by_ref().take(64).read_to_end(&mut greeting);
    println!("greeting bytes: {}", greeting.len());
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
                EngineEvent::Utility { method, args } => {
                    Some((method, serde_json::to_value(args.to_string()).unwrap()))
                }
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
    let base = |args_json: &str, extra: &[&str]| exit_of(args_json, extra, &[]);
    let (code, text) = base(r#"{"served_model_name": "x"}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("model_tag"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy", "max_model_len": "long"}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("max_model_len"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy"}"#, &[]); // fd 0 is not a socket here
    assert_eq!(code, Some(2));
    assert!(text.contains("--listen-fd"), "{text}");
    let (code, text) = base(r#"{"model_tag": "toy"}"#, &["--grpc-listen-fd", "0"]);
    assert_eq!(code, Some(2));
    assert!(text.contains("--listen-fd and --grpc-listen-fd are the same descriptor"), "{text}");
    for bad in ["tcp://x", "udp://x:1", "ipc://"] {
        let (code, text) = base(r#"{"model_tag": "toy"}"#, &["--coordinator-address", bad]);
        assert_eq!(code, Some(2));
        assert!(text.contains("--coordinator-address") && text.contains("tcp://HOST:PORT"), "{text}");
    }
    let (code, text) = base(r#"{"model_tag": "toy", "api_key": 123456789}"#, &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("api_key") && !text.contains("123456789"), "{text}");
    for bad in ["0", "many"] {
        let (code, text) = exit_of(r#"{"model_tag": "toy"}"#, &[], &[("TOKIO_WORKER_THREADS", bad)]);
        assert_eq!(code, Some(2), "{text}");
        assert!(text.contains("TOKIO_WORKER_THREADS") && !text.contains("panicked"), "{text}");
    }
}

#[test]
fn bad_engine_limits_exit_2_naming_the_key_or_variable() {
    let run = |args_json: &str, env: &[(&str, &str)]| exit_of(args_json, &[], env);
    for (args_json, env, named) in [
        (r#"{"model_tag": "toy", "engine_stall_timeout_s": 0}"#, &[][..], "engine_stall_timeout_s"),
        (r#"{"model_tag": "toy", "engine_stall_timeout_s": "soon"}"#, &[][..], "engine_stall_timeout_s"),
        (r#"{"model_tag": "toy", "max_engine_message_bytes": 0}"#, &[][..], "max_engine_message_bytes"),
        (r#"{"model_tag": "toy"}"#, &[("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "0")][..], "VLLM_RS_ENGINE_STALL_TIMEOUT_S"),
        (r#"{"model_tag": "toy"}"#, &[("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "inf")][..], "VLLM_RS_ENGINE_STALL_TIMEOUT_S"),
        (
            r#"{"model_tag": "toy"}"#,
            &[("VLLM_RS_MAX_ENGINE_MESSAGE_BYTES", "1.5")][..],
            "VLLM_RS_MAX_ENGINE_MESSAGE_BYTES",
        ),
        (
            r#"{"model_tag": "toy"}"#,
            &[("VLLM_RS_MAX_ENGINE_MESSAGE_BYTES", "lots")][..],
            "VLLM_RS_MAX_ENGINE_MESSAGE_BYTES",
        ),
    ] {
        let (code, text) = run(args_json, env);
        assert_eq!(code, Some(2), "{args_json} {env:?}: {text}");
        assert!(text.contains(named) && !text.contains("panicked"), "{text}");
    }
}

#[test]
fn help_and_version() {
    let (status, text) = run_to_exit(&["--version"], Duration::from_secs(10));
    assert!(status.success());
    assert!(text.contains(env!("CARGO_PKG_VERSION")));
    let (status, text) = run_to_exit(&["frontend", "--help"], Duration::from_secs(10));
    assert!(status.success());
    for flag in [
        "--listen-fd",
        "--input-listener-fd",
        "--output-listener-fd",
        "--engine-start-index",
        "--engine-count",
        "--data-parallel-size",
        "--grpc-listen-fd",
        "--coordinator-address",
        "--args-json",
    ] {
        assert!(text.contains(flag), "{flag} missing from help");
    }
    let (status, _) = run_to_exit(&["frontend", "--listen-fd", "x"], Duration::from_secs(10));
    assert_eq!(status.code(), Some(2));
}
