//! A TCP relay that delays, for `bench/bench_multinode.py` on kernels without
//! `sch_netem`: every byte it forwards is released a fixed delay after it
//! arrived, in each direction, as a link with that one-way latency would.
//!
//! Usage: `delay_relay --delay-us N --relay FD:HOST:PORT [--relay ...]`. Each
//! `FD` is an inherited listening TCP socket (made by the caller, possibly in
//! another network namespace); every connection accepted on it is forwarded
//! to `HOST:PORT`, connected from the relay's own namespace.
//!
//! Per connection and direction, one thread reads and stamps each chunk with
//! its arrival time, and another writes it once `N` microseconds have passed
//! since then, together with every later chunk already due: the order is
//! kept and reading never waits for writing, so a stream is pipelined (one
//! delay per byte, never a round trip per chunk). Plain threads sleeping
//! with a timer slack of 1 ns, because tokio's timer rounds every sleep up
//! to a whole millisecond, twice the delay measured. `--delay-us 0` forwards
//! at once: the relay's own cost.
//!
//! Build: `cargo build --release -p vllm-rs-bench-clients --bin delay_relay`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes read at a time.
const READ_CHUNK: usize = 64 << 10;

/// One listening socket and where its connections go.
struct Relay {
    listener: TcpListener,
    upstream: String,
}

struct Options {
    delay: Duration,
    relays: Vec<Relay>,
}

fn parse_options() -> Result<Options, String> {
    let mut delay = None;
    let mut relays = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--delay-us" => {
                delay = Some(Duration::from_micros(value.parse().map_err(|e| format!("--delay-us {value}: {e}"))?))
            }
            "--relay" => {
                let (fd, upstream) =
                    value.split_once(':').ok_or_else(|| format!("--relay {value}: expected FD:HOST:PORT"))?;
                let fd: i32 = fd.parse().map_err(|e| format!("--relay {value}: bad FD: {e}"))?;
                // SAFETY: the caller hands this fd over (an inherited listening socket); nothing else owns it here.
                if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                    return Err(format!("--relay {value}: fd {fd} is not open"));
                }
                let listener = unsafe { TcpListener::from_raw_fd(fd) };
                relays.push(Relay { listener, upstream: upstream.to_string() });
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let delay = delay.ok_or("--delay-us is required")?;
    if relays.is_empty() {
        return Err("at least one --relay FD:HOST:PORT is required".into());
    }
    Ok(Options { delay, relays })
}

/// Reads `from` until it ends, stamping each chunk with its arrival.
fn read_chunks(mut from: TcpStream, chunks: mpsc::Sender<(Instant, Vec<u8>)>) {
    let mut buffer = vec![0u8; READ_CHUNK];
    while let Ok(n @ 1..) = from.read(&mut buffer) {
        if chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// Writes each chunk to `to` once `delay` has passed since it arrived; when
/// the reader ends, passes the end of stream on (or tears both sides down
/// when `to` fails).
fn write_chunks(mut to: TcpStream, from: TcpStream, chunks: mpsc::Receiver<(Instant, Vec<u8>)>, delay: Duration) {
    let mut batch = Vec::with_capacity(READ_CHUNK);
    // A chunk taken from the channel that was not due yet.
    let mut next = None;
    while let Some((arrived, chunk)) = next.take().or_else(|| chunks.recv().ok()) {
        let wait = (arrived + delay).saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        batch.clear();
        batch.extend_from_slice(&chunk);
        // Later chunks already due go out in the same write.
        let now = Instant::now();
        while let Ok((arrived, chunk)) = chunks.try_recv() {
            if arrived + delay > now {
                next = Some((arrived, chunk));
                break;
            }
            batch.extend_from_slice(&chunk);
        }
        if to.write_all(&batch).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Relays one direction, `from` to `to`, on two threads of its own.
fn pipe(from: TcpStream, to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (sender, receiver) = mpsc::channel();
    let reader = from.try_clone()?;
    std::thread::spawn(move || read_chunks(reader, sender));
    std::thread::spawn(move || write_chunks(to, from, receiver, delay));
    Ok(())
}

fn relay_connection(client: TcpStream, upstream: &str, delay: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    pipe(client.try_clone()?, server.try_clone()?, delay)?;
    pipe(server, client, delay)
}

fn main() {
    let options = parse_options().unwrap_or_else(|e| {
        eprintln!("delay_relay: {e}");
        std::process::exit(2);
    });
    // Threads inherit it: sleeps end within microseconds of their deadline.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let delay = options.delay;
    let accepting: Vec<_> = options
        .relays
        .into_iter()
        .map(|relay| {
            std::thread::spawn(move || {
                for client in relay.listener.incoming() {
                    let outcome = client.and_then(|client| relay_connection(client, &relay.upstream, delay));
                    if let Err(e) = outcome {
                        eprintln!("delay_relay: a connection to {} was not relayed: {e}", relay.upstream);
                    }
                }
            })
        })
        .collect();
    for thread in accepting {
        let _ = thread.join();
    }
}
