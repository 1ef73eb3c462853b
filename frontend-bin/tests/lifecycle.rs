//! The process: HTTP socket kinds it accepts, and graceful exit on signals.

mod common;

use common::mock_engine::{EngineSpec, MockEngine};
use common::{post_json, Frontend, HttpSocket, Options};
use serde_json::json;
use std::time::{Duration, Instant};
use vllm_rs_test_support::poll_until_async;

async fn serves_completions_on(http: HttpSocket) {
    let (fe, _engines) = Frontend::start_with_engines(Options { http, ..Default::default() }, |_| {}).await;
    let body = json!({"prompt": "unix", "max_tokens": 4}).to_string();
    if http == HttpSocket::Unix {
        let (status, text) = fe.unix_request("POST", "/v1/completions", Some(&body)).await.unwrap();
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("\"text\":\"unix\""), "{text}");
    } else {
        let (status, reply) = post_json(&fe.url("/v1/completions"), &serde_json::from_str(&body).unwrap()).await;
        assert_eq!(status, 200, "{reply}");
    }
}

#[tokio::test]
async fn serves_on_ipv6() {
    serves_completions_on(HttpSocket::Tcp6).await;
}

#[tokio::test]
async fn serves_on_a_unix_socket() {
    serves_completions_on(HttpSocket::Unix).await;
}

#[tokio::test]
async fn serves_on_a_bound_but_not_listening_socket() {
    serves_completions_on(HttpSocket::Tcp4BoundOnly).await;
}

#[tokio::test]
async fn sigterm_when_idle_exits_0() {
    let (mut fe, _engines) = Frontend::start_with_engines(Options::default(), |_| {}).await;
    fe.signal(libc::SIGTERM);
    let status = fe.wait_exit(Duration::from_secs(10)).expect("exit after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", fe.stderr());
}

#[tokio::test]
async fn sigint_before_engines_register_exits_0() {
    let mut fe = Frontend::spawn(Options::default());
    // Logged once the signal handlers are in place.
    assert!(fe.wait_for_log("waiting for engines", 1, Duration::from_secs(10)).await, "{}", fe.stderr());
    fe.signal(libc::SIGINT);
    let status = fe.wait_exit(Duration::from_secs(10)).expect("exit after SIGINT");
    assert_eq!(status.code(), Some(0), "{}", fe.stderr());
}

#[tokio::test]
async fn sigterm_lets_a_request_in_flight_finish() {
    // A drain far longer than the 25 steps need even on a loaded machine: the
    // test is that the request in flight finishes, not how fast (with the
    // default 4 s, a run of every test at once on 2 cores once aborted it).
    let options = Options { args: json!({"model_tag": "toy", "shutdown_timeout": 120}), ..Default::default() };
    let (mut fe, engines) = Frontend::start_with_engines(options, |s| s.step = Duration::from_millis(20)).await;
    let url = fe.url("/v1/completions");
    let request = tokio::spawn(async move { post_json(&url, &json!({"prompt": "abc", "max_tokens": 25})).await });
    assert!(
        engines[0].wait_for(Duration::from_secs(5), |e| !e.is_empty()).await,
        "the request never reached the engine"
    );
    fe.signal(libc::SIGTERM);
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"].as_str().unwrap().len(), 25);
    let status = fe.wait_exit(Duration::from_secs(60)).expect("exit after the drain");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sigterm_aborts_what_outlives_the_shutdown_timeout() {
    let options = Options { args: json!({"model_tag": "toy", "shutdown_timeout": 0.5}), ..Default::default() };
    let (mut fe, engines) = Frontend::start_with_engines(options, |_| {}).await;
    let url = fe.url("/v1/completions");
    let request = tokio::spawn(async move { post_json(&url, &json!({"prompt": "HANG", "max_tokens": 5})).await });
    assert!(engines[0].wait_for(Duration::from_secs(5), |e| !e.is_empty()).await);
    let started = Instant::now();
    fe.signal(libc::SIGTERM);
    let status = fe.wait_exit(Duration::from_secs(10)).expect("exit after the drain timeout");
    assert_eq!(status.code(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        engines[0]
            .wait_for(Duration::from_secs(5), |e| e
                .iter()
                .any(|e| matches!(e, common::mock_engine::EngineEvent::Aborted(_))))
            .await
    );
    // The client got an answer or a closed connection, never a hang.
    let _ = tokio::time::timeout(Duration::from_secs(5), request).await.expect("the client was not left hanging");
}

#[tokio::test]
async fn idle_keep_alive_connections_close_after_the_timeout() {
    use std::io::{Read, Write};
    let options = Options { args: json!({"model_tag": "toy", "http_timeout_keep_alive": 0.5}), ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    let address = fe.base_url.trim_start_matches("http://").to_string();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(address).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let n = conn.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let idle = Instant::now();
        // The server closes the idle connection: read returns 0 (EOF).
        let closed = matches!(conn.read(&mut buf), Ok(0));
        (closed, idle.elapsed())
    })
    .await
    .unwrap();
    assert!(outcome.0, "the idle connection was not closed");
    assert!(outcome.1 >= Duration::from_millis(300) && outcome.1 < Duration::from_secs(5), "{:?}", outcome.1);
}

/// The system call the thread that builds the tokenizer's tables
/// (`tokenizer-tables`, its name cut to 15 bytes) is blocked in, as
/// `/proc/PID/task/TID/syscall` gives it (its number, or `running`), or
/// None once the thread has ended.
fn tables_thread_syscall(fe: &Frontend) -> Option<String> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", fe.child.id())).unwrap();
    tasks.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        (comm.trim() == "tokenizer-table").then(|| {
            let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
            syscall.split_whitespace().next().unwrap_or_default().to_string()
        })
    })
}

#[tokio::test]
async fn tokenizer_tables_are_built_once_the_first_answer_is_ready() {
    let tokenizer = format!("{}/../tests/fixtures/tokenizers/byte-bpe", env!("CARGO_MANIFEST_DIR"));
    let fe = Frontend::spawn(Options {
        args: json!({"model_tag": "my-model", "tokenizer": tokenizer}),
        ..Default::default()
    });
    let _engine = MockEngine::start(EngineSpec::new(0, &fe.input_address, &fe.output_address));
    assert!(fe.wait_for_log("serving the OpenAI API", 1, Duration::from_secs(30)).await, "{}", fe.stderr());
    // Serving, and nothing answered yet (the frontend waits 5 s for a first
    // request): the build waits on its hold, in futex(2).
    let waiting = tables_thread_syscall(&fe);
    assert_eq!(waiting, Some(libc::SYS_futex.to_string()), "the tables' thread before any answer");
    let health = reqwest::get(fe.url("/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    let built = poll_until_async(Duration::from_secs(30), || async { tables_thread_syscall(&fe).is_none() }).await;
    assert!(built.is_some(), "the tables were not built after the first answer:\n{}", fe.stderr());
}
