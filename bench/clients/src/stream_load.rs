//! Streaming load for `bench/bench_frontend.py`: opens `--streams` keep-alive
//! connections to a frontend, then sends one streamed `/v1/completions` request
//! on each at once and reads every byte of every answer.
//!
//! The connections are warmed up with `GET /health` first, so that accepting
//! them is not part of the measurement. One thread, one read per readable socket into a 64 KiB buffer: the client
//! costs little CPU, so that on a small machine the numbers are about the
//! frontend. Prints one JSON line: `{"tokens": N, "events": E, "seconds": S,
//! "reads": R, "gap_p50_ms": G50, "gap_p99_ms": G99}`, where N is the sum of
//! the `completion_tokens` of the final usage chunks, E the number of SSE
//! events received (`data:` lines, `[DONE]` included), S runs from the first
//! byte sent to the last byte received, R counts the reads that brought
//! events, and G50/G99 are percentiles of the gaps between consecutive events
//! of a stream as they arrived (events that came in one read are 0 apart):
//! how smoothly the tokens reached the client. Exits non-zero on any non-200
//! answer or a stream that ends early.
//!
//! Build: `cargo build --release -p vllm-rs-bench-clients --bin stream_load`.

use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Options {
    port: u16,
    streams: usize,
    tokens: u32,
    prompt: String,
    /// `logprobs` to ask for with every token (none when not given).
    logprobs: Option<u32>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options { port: 0, streams: 64, tokens: 256, prompt: "Hello".into(), logprobs: None };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--port" => options.port = value.parse().map_err(|e| bad(&e))?,
            "--streams" => options.streams = value.parse().map_err(|e| bad(&e))?,
            "--tokens" => options.tokens = value.parse().map_err(|e| bad(&e))?,
            "--prompt" => options.prompt = value,
            "--logprobs" => options.logprobs = Some(value.parse().map_err(|e| bad(&e))?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if options.port == 0 {
        return Err("--port is required".into());
    }
    Ok(options)
}

/// Where the body of an answer whose head is complete in `received` ends:
/// `None` while more is to come. A chunked body ends with its last chunk.
fn answer_end(received: &[u8]) -> Option<usize> {
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&received[..head_end]).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        return received.ends_with(b"\r\n0\r\n\r\n").then_some(received.len());
    }
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (received.len() >= head_end + length).then_some(head_end + length)
}

/// One whole answer: its raw bytes (chunk framing included) and, for every
/// read that completed SSE events, when it came and how many it completed.
struct Answer {
    raw: Vec<u8>,
    arrivals: Vec<(Instant, u64)>,
}

/// Reads one whole answer (head and body).
async fn read_answer(connection: &mut TcpStream) -> Result<Answer, String> {
    let mut raw = Vec::with_capacity(64 << 10);
    let mut arrivals = Vec::new();
    let mut block = vec![0u8; 64 << 10];
    loop {
        let n = connection.read(&mut block).await.map_err(|e| format!("reading: {e}"))?;
        if n == 0 {
            return Err("the connection closed before the answer ended".into());
        }
        // An event marker may straddle two reads: look back over its length.
        let from = raw.len().saturating_sub(EVENT_MARKER.len() - 1);
        raw.extend_from_slice(&block[..n]);
        let events = count_events(&raw[from..]);
        if events > 0 {
            arrivals.push((Instant::now(), events));
        }
        if answer_end(&raw).is_some() {
            return Ok(Answer { raw, arrivals });
        }
    }
}

/// Sends `GET /health` and reads its answer: the connection is then accepted
/// and served by the frontend, as a keep-alive connection is.
async fn warm_up(connection: &mut TcpStream) -> Result<(), String> {
    connection
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| format!("sending the warm-up: {e}"))?;
    let answer = read_answer(connection).await?.raw;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("warm-up: {}", String::from_utf8_lossy(&answer)))
    }
}

/// What starts an SSE event in a body: a `data:` line (a JSON string never
/// holds a raw newline, so each one starts an event).
const EVENT_MARKER: &[u8] = b"\ndata: ";

/// The SSE events that start in `raw`.
fn count_events(raw: &[u8]) -> u64 {
    raw.windows(EVENT_MARKER.len()).filter(|w| *w == EVENT_MARKER).count() as u64
}

/// The gaps, in ms, between consecutive events of one stream as they arrived.
fn event_gaps(arrivals: &[(Instant, u64)], gaps: &mut Vec<f64>) {
    for (i, &(at, events)) in arrivals.iter().enumerate() {
        if i > 0 {
            gaps.push((at - arrivals[i - 1].0).as_secs_f64() * 1e3);
        }
        gaps.extend(std::iter::repeat_n(0.0, events as usize - 1));
    }
}

/// The `q` quantile (0..=1) of `values`, sorted in place; 0 when empty.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// The status code and the `completion_tokens` of the last usage chunk of a raw answer.
fn check_answer(raw: &[u8]) -> Result<u64, String> {
    let text = String::from_utf8_lossy(raw);
    let status = text.split(' ').nth(1).unwrap_or("?");
    if status != "200" {
        return Err(format!("status {status}: {}", &text[..text.len().min(300)]));
    }
    let key = "\"completion_tokens\":";
    let at = text.rfind(key).ok_or("no usage chunk in the answer")? + key.len();
    let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().map_err(|e| format!("completion_tokens: {e}"))
}

/// What a run measured (the JSON line `main` prints).
struct Measured {
    tokens: u64,
    events: u64,
    seconds: f64,
    reads: u64,
    gaps: Vec<f64>,
}

async fn run(options: Options) -> Result<Measured, String> {
    let mut body = serde_json::json!({
        "model": "toy",
        "prompt": options.prompt,
        "max_tokens": options.tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(logprobs) = options.logprobs {
        body["logprobs"] = logprobs.into();
    }
    let body = body.to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut connections = Vec::with_capacity(options.streams);
    for _ in 0..options.streams {
        let connection =
            TcpStream::connect(("127.0.0.1", options.port)).await.map_err(|e| format!("connecting: {e}"))?;
        connection.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        connections.push(connection);
    }
    for connection in &mut connections {
        warm_up(connection).await?;
    }
    let start = Instant::now();
    // Every request goes out before any answer is read, as from 64 independent clients.
    for connection in &mut connections {
        connection.write_all(request.as_bytes()).await.map_err(|e| format!("sending: {e}"))?;
    }
    let answers = futures_util::future::join_all(connections.iter_mut().map(read_answer)).await;
    let seconds = start.elapsed().as_secs_f64();
    let mut measured = Measured { tokens: 0, events: 0, seconds, reads: 0, gaps: Vec::new() };
    for answer in answers {
        let answer = answer?;
        measured.tokens += check_answer(&answer.raw)?;
        // Each event was counted once, by the read that completed it.
        measured.events += answer.arrivals.iter().map(|&(_, events)| events).sum::<u64>();
        measured.reads += answer.arrivals.len() as u64;
        event_gaps(&answer.arrivals, &mut measured.gaps);
    }
    Ok(measured)
}

fn main() {
    let outcome = parse_options().and_then(|options| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(run(options))
    });
    match outcome {
        Ok(mut m) => {
            let (p50, p99) = (quantile(&mut m.gaps, 0.5), quantile(&mut m.gaps, 0.99));
            let line = serde_json::json!({"tokens": m.tokens, "events": m.events, "seconds": m.seconds,
                "reads": m.reads, "gap_p50_ms": p50, "gap_p99_ms": p99});
            println!("{line}")
        }
        Err(e) => {
            eprintln!("stream_load: {e}");
            std::process::exit(1);
        }
    }
}
