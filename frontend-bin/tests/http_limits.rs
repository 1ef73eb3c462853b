//! Slow and oversized clients against the real binary over raw TCP: a body
//! that trickles gets 408, a head that trickles closes the connection, a head
//! over the limit gets 431, connections past the limit close the one idle the
//! longest; each bound set by its environment variable.

mod common;

use common::mock_engine::EngineEvent;
use common::{Frontend, Options};
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use vllm_rs_test_support::poll_until_async;

/// Generous: each bound under test is 1 s, and the old behaviour was no bound at all.
const READ_DEADLINE: Duration = Duration::from_secs(20);

async fn start(args: Value, env: &[(&str, &str)]) -> (Frontend, Vec<common::mock_engine::MockEngine>) {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Frontend::start_with_engines(Options { args, env, ..Default::default() }, |_| {}).await
}

fn connect(fe: &Frontend) -> TcpStream {
    let conn = TcpStream::connect(fe.base_url.trim_start_matches("http://")).unwrap();
    conn.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    conn
}

/// Everything the server sends until it closes the connection; a read that
/// times out fails the test (the server let the client hold the connection).
fn read_until_closed(mut conn: TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("the server kept the connection open past {READ_DEADLINE:?}: {e}"),
        }
    }
}

#[tokio::test]
async fn a_body_that_trickles_gets_408_in_the_openai_shape() {
    let (fe, engines) = start(json!({"model_tag": "toy"}), &[("VLLM_RS_HTTP_BODY_TIMEOUT_S", "1")]).await;
    let mut conn = connect(&fe);
    let response = tokio::task::spawn_blocking(move || {
        let head =
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
        conn.write_all(head.as_bytes()).unwrap();
        conn.write_all(b"{\"prompt\": ").unwrap();
        read_until_closed(conn)
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["error"]["code"], 408, "{body}");
    assert_eq!(body["error"]["type"], "RequestTimeoutError");
    assert!(body["error"]["message"].as_str().unwrap().contains("did not arrive"), "{body}");
    assert!(engines[0].added().is_empty());
}

#[tokio::test]
async fn a_body_that_arrives_in_time_is_served() {
    let (fe, _engines) = start(json!({"model_tag": "toy"}), &[("VLLM_RS_HTTP_BODY_TIMEOUT_S", "10")]).await;
    let (status, body) = common::post_json(&fe.url("/v1/completions"), &json!({"prompt": "ok", "max_tokens": 2})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_head_that_trickles_closes_the_connection_even_with_a_long_keep_alive() {
    let args = json!({"model_tag": "toy", "http_timeout_keep_alive": 100});
    let (fe, _engines) = start(args, &[("VLLM_RS_HTTP_HEADER_TIMEOUT_S", "1")]).await;
    let mut conn = connect(&fe);
    let response = tokio::task::spawn_blocking(move || {
        conn.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n").unwrap();
        read_until_closed(conn)
    })
    .await
    .unwrap();
    // hyper closes without a response (or with a bare 408): never a 2xx.
    let text = String::from_utf8_lossy(&response);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test]
async fn a_head_over_the_limit_gets_431_and_one_under_it_is_served() {
    let (fe, _engines) = start(json!({"model_tag": "toy"}), &[("VLLM_RS_HTTP_MAX_HEADER_BYTES", "16384")]).await;
    let request = |pad: usize| {
        format!("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: {}\r\n\r\n", "a".repeat(pad))
    };
    let (small, large) = (request(12_000), request(20_000));
    let (mut first, mut second) = (connect(&fe), connect(&fe));
    let (served, refused) = tokio::task::spawn_blocking(move || {
        first.write_all(small.as_bytes()).unwrap();
        second.write_all(large.as_bytes()).unwrap();
        (read_until_closed(first), read_until_closed(second))
    })
    .await
    .unwrap();
    assert!(served.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&served));
    assert!(refused.starts_with(b"HTTP/1.1 431"), "{}", String::from_utf8_lossy(&refused));
}

fn open_fds(fe: &Frontend) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", fe.child.id())).unwrap().count()
}

#[tokio::test]
async fn silent_connections_past_the_connection_limit_make_room_for_new_clients() {
    let env = [("VLLM_RS_HTTP_MAX_CONNECTIONS", "16"), ("VLLM_RS_HTTP_HEADER_TIMEOUT_S", "120")];
    let (fe, _engines) = start(json!({"model_tag": "toy", "http_timeout_keep_alive": 120}), &env).await;
    let address = fe.base_url.trim_start_matches("http://").to_string();
    let url = &fe.url("/health");
    let health = || async move { reqwest::get(url).await.map(|r| r.status().as_u16()).unwrap_or(0) };
    assert_eq!(health().await, 200);
    let baseline = open_fds(&fe);
    // 300 clients that connect and never send a request head (120 s allowed for it).
    let silent: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(&address).unwrap()).collect();
    // Accepted in order: once this is answered, every silent one was accepted.
    assert_eq!(health().await, 200, "a new client is served past 300 silent connections");
    // An evicted connection's task drops its socket after the accept loop
    // moves on, so the count settles a moment after the last accept.
    let settled = poll_until_async(READ_DEADLINE, || async { open_fds(&fe) <= baseline + 16 + 4 }).await;
    let extra = open_fds(&fe).saturating_sub(baseline);
    assert!(settled.is_some(), "{extra} more fds with 300 silent connections and a limit of 16");
    for _ in 0..50 {
        assert_eq!(health().await, 200);
    }
    // The ones closed to make room were told so: the server ended them.
    let ended = |conn: &TcpStream| {
        conn.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut conn = conn;
        match conn.read(&mut [0u8; 1]) {
            Ok(0) => true,
            Err(e) => e.kind() == ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    };
    assert!(silent.iter().filter(|conn| ended(conn)).count() >= 300 - 16);
    assert!(fe.stderr().lines().all(|line| !line.contains("refusing a connection")), "{}", fe.stderr());
}

#[tokio::test]
async fn at_the_limit_with_every_connection_busy_a_new_one_is_closed_and_served_later() {
    let env = [("VLLM_RS_HTTP_MAX_CONNECTIONS", "1")];
    let (fe, engines) = Frontend::start_with_engines(
        Options {
            args: json!({"model_tag": "toy"}),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        },
        |spec| spec.step = Duration::from_millis(200),
    )
    .await;
    // One request busy on the only connection: a slow completion.
    let url = fe.url("/v1/completions");
    let busy = tokio::spawn(async move { common::post_json(&url, &json!({"prompt": "ab", "max_tokens": 10})).await });
    let added = |events: &[EngineEvent]| events.iter().any(|e| matches!(e, EngineEvent::Added { .. }));
    assert!(engines[0].wait_for(READ_DEADLINE, added).await, "the request reached the engine");
    let refused = tokio::task::spawn_blocking({
        let conn = connect(&fe);
        move || read_until_closed(conn)
    })
    .await
    .unwrap();
    assert!(refused.is_empty(), "closed unanswered: {}", String::from_utf8_lossy(&refused));
    assert!(fe.wait_for_log("refusing a connection: all 1 connections are busy", 1, READ_DEADLINE).await);
    let (status, body) = busy.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = common::post_json(&fe.url("/v1/completions"), &json!({"prompt": "ok", "max_tokens": 1})).await;
    assert_eq!(status, 200, "served once the busy connection is idle again");
}
