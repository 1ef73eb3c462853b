//! The streaming client of `bench/model_load.py` (the load of
//! `bench/bench_models.py`): closed-loop clients, each on its own keep-alive
//! connection, each sending its queue of token-id prompts to an OpenAI
//! `/completions` route one after another, streamed, and noting when every
//! token arrives.
//!
//! Native, on one thread, because on a small machine the client shares the
//! CPUs with the server it measures: the Python client it replaces spent about
//! 5 ms of CPU per 16-token decode step (4% of a 2-core machine), which the
//! frontend-overhead row read as the frontend's.
//!
//! Reads a JSON spec on stdin: `{"port", "path", "model", "output_tokens",
//! "warmup": [ids], "queues": [[[ids], ...], ...]}` (one queue per client).
//! Every connection is opened and answers `GET /health` first, then one
//! 4-token request on `warmup` goes out (the server's first-step costs off the
//! clock). Then the clocks start and every client sends its first request at
//! once. Each request is greedy, with `ignore_eos` and `min_tokens` so that it
//! yields exactly `output_tokens`. Prints one JSON line, `{"timings":
//! [{"start", "first", "last", "tokens"}, ...]}`: seconds from the start of
//! the measurement, where a token arrives when the line of its chunk does (a
//! chunk with text, or one without a finish reason), and `tokens` is the usage
//! chunk's `completion_tokens`. Exits 1 naming the request on an error answer,
//! an error chunk, a stream that ends early or a token count other than
//! `output_tokens`.
//!
//! Build: `cargo build --release -p vllm-rs-bench-clients --bin model_load`.

use serde_json::{json, Value};
use std::io::Read;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the spec asks for.
struct Spec {
    port: u16,
    path: String,
    model: String,
    output_tokens: u64,
    warmup: Vec<u64>,
    queues: Vec<Vec<Vec<u64>>>,
}

fn read_spec() -> Result<Spec, String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).map_err(|e| format!("reading the spec: {e}"))?;
    let spec: Value = serde_json::from_str(&text).map_err(|e| format!("the spec is not JSON: {e}"))?;
    let field = |name: &str| spec.get(name).ok_or_else(|| format!("the spec has no {name:?}"));
    let ids = |value: &Value, what: &str| -> Result<Vec<u64>, String> {
        value
            .as_array()
            .and_then(|ids| ids.iter().map(Value::as_u64).collect())
            .ok_or_else(|| format!("{what} must be a list of token ids"))
    };
    let queues = field("queues")?
        .as_array()
        .ok_or("\"queues\" must be a list of lists of prompts")?
        .iter()
        .map(|queue| {
            let prompts = queue.as_array().ok_or("each queue must be a list of prompts")?;
            prompts.iter().map(|p| ids(p, "a prompt")).collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Spec {
        port: field("port")?.as_u64().and_then(|p| u16::try_from(p).ok()).ok_or("\"port\" must be a port number")?,
        path: field("path")?.as_str().ok_or("\"path\" must be a string")?.to_owned(),
        model: field("model")?.as_str().ok_or("\"model\" must be a string")?.to_owned(),
        output_tokens: field("output_tokens")?.as_u64().ok_or("\"output_tokens\" must be a count")?,
        warmup: ids(field("warmup")?, "\"warmup\"")?,
        queues,
    })
}

/// One request as its client saw it (seconds from the start of the measurement).
#[derive(Default)]
struct Timing {
    start: f64,
    first: Option<f64>,
    last: Option<f64>,
    /// Chunks that carried a token.
    chunks: u64,
    /// `completion_tokens` of the usage chunk, when one came.
    usage_tokens: Option<u64>,
}

impl Timing {
    /// The request's output tokens: the usage chunk's count, else the chunks that carried one.
    fn tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.chunks)
    }
}

/// How an answer's body is framed.
enum Framing {
    /// `Transfer-Encoding: chunked`: the state of the decoder.
    Chunked(ChunkState),
    /// `Content-Length`: bytes still to come.
    Length(usize),
}

enum ChunkState {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data: bytes left.
    Data(usize),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last (empty) chunk: expecting the final CRLF.
    Trailer,
    Done,
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Framing {
    /// Moves what `raw` holds of the body into `body`; true once the body is complete.
    fn decode(&mut self, raw: &mut Vec<u8>, body: &mut Vec<u8>) -> Result<bool, String> {
        match self {
            Framing::Length(left) => {
                let take = (*left).min(raw.len());
                body.extend(raw.drain(..take));
                *left -= take;
                Ok(*left == 0)
            }
            Framing::Chunked(state) => {
                let mut at = 0;
                loop {
                    match state {
                        ChunkState::Size => {
                            let Some(end) = find(&raw[at..], b"\r\n") else { break };
                            let line = String::from_utf8_lossy(&raw[at..at + end]);
                            let hex = line.split(';').next().unwrap_or("").trim();
                            let size =
                                usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {line:?}"))?;
                            at += end + 2;
                            *state = if size == 0 { ChunkState::Trailer } else { ChunkState::Data(size) };
                        }
                        ChunkState::Data(left) => {
                            let take = (*left).min(raw.len() - at);
                            if take == 0 {
                                break;
                            }
                            body.extend_from_slice(&raw[at..at + take]);
                            at += take;
                            *left -= take;
                            if *left == 0 {
                                *state = ChunkState::DataEnd;
                            }
                        }
                        ChunkState::DataEnd | ChunkState::Trailer => {
                            if raw.len() - at < 2 {
                                break;
                            }
                            at += 2;
                            *state = match state {
                                ChunkState::Trailer => ChunkState::Done,
                                _ => ChunkState::Size,
                            };
                        }
                        ChunkState::Done => break,
                    }
                }
                raw.drain(..at);
                Ok(matches!(state, ChunkState::Done))
            }
        }
    }
}

/// An answer's status line and headers, parsed.
struct Head {
    status: String,
    framing: Framing,
    /// The server closes the connection after this answer.
    closes: bool,
}

fn parse_head(head: &[u8]) -> Head {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let status = text.split(' ').nth(1).unwrap_or("?").to_owned();
    let header = |name: &str| text.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
    let framing = if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        Framing::Chunked(ChunkState::Size)
    } else {
        Framing::Length(header("content-length:").and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    Head { status, framing, closes: header("connection:") == Some("close") }
}

/// Takes one SSE line of a streamed completion into `timing`; true on `[DONE]`.
fn take_line(line: &[u8], now: f64, timing: &mut Timing) -> Result<bool, String> {
    let Some(data) = line.strip_prefix(b"data:") else {
        return Ok(false); // blank separators, comments, event names
    };
    let data = String::from_utf8_lossy(data);
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(true);
    }
    let chunk: Value = serde_json::from_str(data).map_err(|e| format!("a chunk is not JSON ({e}): {data}"))?;
    if let Some(error) = chunk.get("error") {
        return Err(format!("the server failed the request mid-stream: {error}"));
    }
    if let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) {
        let has_text = choice.get("text").and_then(Value::as_str).is_some_and(|t| !t.is_empty());
        if has_text || choice.get("finish_reason").is_none_or(Value::is_null) {
            timing.chunks += 1;
            timing.first.get_or_insert(now);
            timing.last = Some(now);
        }
    }
    if let Some(tokens) = chunk.get("usage").and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64) {
        timing.usage_tokens = Some(tokens);
    }
    Ok(false)
}

/// One client's keep-alive connection.
struct Client {
    port: u16,
    connection: Option<TcpStream>,
}

impl Client {
    async fn connect(port: u16) -> Result<TcpStream, String> {
        let connection = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| format!("connecting: {e}"))?;
        connection.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(connection)
    }

    /// Sends `request` and reads its answer, handing every complete body line
    /// to `on_line` with the time its read ended; an answer other than 200
    /// is an error naming its status and body. A connection the server
    /// closed while idle is opened again once, before any byte of the answer
    /// came.
    async fn exchange(
        &mut self,
        request: &[u8],
        origin: Instant,
        mut on_line: impl FnMut(&[u8], f64) -> Result<(), String>,
    ) -> Result<(), String> {
        for attempt in 0..2 {
            let connection = match self.connection.as_mut() {
                Some(connection) => connection,
                None => self.connection.insert(Self::connect(self.port).await?),
            };
            let sent = connection.write_all(request).await;
            let mut raw = Vec::with_capacity(16 << 10);
            let mut block = vec![0u8; 16 << 10];
            let first_read = match sent {
                Ok(()) => connection.read(&mut block).await,
                Err(e) => Err(e),
            };
            let n = match first_read {
                Ok(n) if n > 0 => n,
                // A keep-alive connection the server closed while idle: open it again, once.
                _ if attempt == 0 => {
                    self.connection = None;
                    continue;
                }
                Ok(_) => return Err("the server closed the connection without answering".into()),
                Err(e) => return Err(format!("sending or reading: {e}")),
            };
            raw.extend_from_slice(&block[..n]);
            let mut now = origin.elapsed().as_secs_f64();
            let mut head: Option<Head> = None;
            let mut body = Vec::new();
            loop {
                if head.is_none() {
                    if let Some(end) = find(&raw, b"\r\n\r\n") {
                        head = Some(parse_head(&raw[..end]));
                        raw.drain(..end + 4);
                    }
                }
                if let Some(head) = head.as_mut() {
                    let complete = head.framing.decode(&mut raw, &mut body)?;
                    if head.status == "200" {
                        while let Some(end) = body.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = body.drain(..=end).collect();
                            on_line(line.trim_ascii_end(), now)?;
                        }
                    }
                    if complete {
                        if head.closes {
                            self.connection = None;
                        }
                        if head.status != "200" {
                            let text = String::from_utf8_lossy(&body);
                            return Err(format!("status {}: {}", head.status, &text[..text.len().min(300)]));
                        }
                        return on_line(body.trim_ascii_end(), now);
                    }
                }
                let connection = self.connection.as_mut().expect("open while an answer is read");
                let n = connection.read(&mut block).await.map_err(|e| format!("reading: {e}"))?;
                if n == 0 {
                    return Err("the connection closed before the answer ended".into());
                }
                now = origin.elapsed().as_secs_f64();
                raw.extend_from_slice(&block[..n]);
            }
        }
        unreachable!("the second attempt returns")
    }
}

fn completion_request(spec: &Spec, prompt: &[u64], max_tokens: u64) -> Vec<u8> {
    // Greedy, and exactly `max_tokens`: `ignore_eos` (vLLM and llama.cpp) and
    // `min_tokens` (vLLM) keep the model going past an end-of-sequence.
    let body = json!({
        "model": spec.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "min_tokens": max_tokens,
        "ignore_eos": true,
    })
    .to_string();
    format!(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        spec.path,
        body.len()
    )
    .into_bytes()
}

/// Streams one completion on `client`; checks it yielded `expected` tokens.
async fn stream_one(client: &mut Client, request: &[u8], origin: Instant, expected: u64) -> Result<Timing, String> {
    let mut timing = Timing { start: origin.elapsed().as_secs_f64(), ..Timing::default() };
    let mut done = false;
    client
        .exchange(request, origin, |line, now| {
            done |= take_line(line, now, &mut timing)?;
            Ok(())
        })
        .await?;
    let tokens = timing.tokens();
    if !done || tokens != expected || timing.first.is_none() {
        return Err(format!(
            "asked for {expected} tokens, got {tokens} in {} chunks{}",
            timing.chunks,
            if done { "" } else { " and no [DONE]" }
        ));
    }
    Ok(timing)
}

async fn run(spec: Spec) -> Result<Vec<Timing>, String> {
    let mut clients = Vec::with_capacity(spec.queues.len());
    for _ in &spec.queues {
        let mut client = Client { port: spec.port, connection: Some(Client::connect(spec.port).await?) };
        let health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        client.exchange(health, Instant::now(), |_, _| Ok(())).await.map_err(|e| format!("GET /health: {e}"))?;
        clients.push(client);
    }
    if let Some(first) = clients.first_mut() {
        let warmup = completion_request(&spec, &spec.warmup, 4);
        stream_one(first, &warmup, Instant::now(), 4).await.map_err(|e| format!("the warm-up request: {e}"))?;
    }
    let origin = Instant::now();
    let runs = clients.iter_mut().zip(&spec.queues).enumerate().map(|(index, (client, queue))| {
        let spec = &spec;
        async move {
            let mut timings = Vec::with_capacity(queue.len());
            for (n, prompt) in queue.iter().enumerate() {
                let request = completion_request(spec, prompt, spec.output_tokens);
                let timing = stream_one(client, &request, origin, spec.output_tokens)
                    .await
                    .map_err(|e| format!("client {index}, request {n}: {e}"))?;
                timings.push(timing);
            }
            Ok::<_, String>(timings)
        }
    });
    let mut all = Vec::new();
    for timings in futures_util::future::join_all(runs).await {
        all.extend(timings?);
    }
    Ok(all)
}

fn main() {
    let outcome = read_spec().and_then(|spec| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(run(spec))
    });
    match outcome {
        Ok(timings) => {
            let timings: Vec<Value> = timings
                .iter()
                .map(|t| json!({"start": t.start, "first": t.first, "last": t.last, "tokens": t.tokens()}))
                .collect();
            println!("{}", json!({ "timings": timings }));
        }
        Err(e) => {
            eprintln!("model_load: {e}");
            std::process::exit(1);
        }
    }
}
