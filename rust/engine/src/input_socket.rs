//! The frontend's input socket as a ZeroMQ ROUTER, spoken in the async
//! runtime (`zmtp.rs`): engines connect their DEALER, whose identity is their
//! 2-byte index; what they send (their registration) comes out of the
//! receiver `start` returns; `send` queues a message for one engine.
//!
//! Each connection has an outbox and a writer task: a message is appended to
//! the outbox under a lock and written by that task together with whatever
//! else was queued meanwhile, so a burst of requests costs one `write`, and no
//! thread stands between the HTTP handlers and the socket.

use super::zmtp::{encode_message, handshake, pong_frame, FrameLimits, Incoming};
use crate::listener::{accept_engine_connections, AcceptedStream, PendingPermit, StreamListener};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch, Notify};

/// A PING is answered only while the connection's outbox holds less than
/// this: a peer that sends PINGs and never reads cannot grow it without bound.
const MAX_OUTBOX_FOR_PONG: usize = 64 << 10;

/// A message an engine sent on its DEALER: its identity and the first frame.
pub type EngineMessage = (Vec<u8>, Bytes);

/// An engine whose registered connection ended, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostEngine {
    /// The engine's identity (its 2-byte index).
    pub identity: Vec<u8>,
    /// How the connection ended: closed, or dropped and why (a silence past
    /// the heartbeat TTL of the engine's PINGs, a protocol error).
    pub how: String,
}

/// Why a message could not be queued for an engine.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// No live connection holds the engine's identity (ZMQ_ROUTER_MANDATORY).
    #[error("the engine is not connected")]
    NotConnected,
}

/// The engines connected to the input socket, by identity. An identity
/// belongs to the first live connection that claimed it.
pub struct EngineInputSocket {
    links: Mutex<HashMap<Vec<u8>, Arc<Link>>>,
    received: mpsc::UnboundedSender<EngineMessage>,
    next_link_id: AtomicU64,
    limits: FrameLimits,
    /// The first engine whose registered connection ended.
    lost: watch::Sender<Option<LostEngine>>,
}

/// One engine connection's outbox.
struct Link {
    id: u64,
    outbox: Mutex<Outbox>,
    filled: Notify,
    /// How many messages the writer has handed to the socket; closed when the
    /// writer ends (the connection is gone).
    written: watch::Receiver<u64>,
}

/// Bytes waiting for the writer, and how many messages were ever queued.
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    queued: u64,
}

impl Link {
    fn queue(&self, append: impl FnOnce(&mut Vec<u8>)) {
        let was_empty = {
            let mut outbox = self.outbox.lock().unwrap();
            let was_empty = outbox.bytes.is_empty();
            append(&mut outbox.bytes);
            outbox.queued += 1;
            was_empty
        };
        if was_empty {
            self.filled.notify_one();
        }
    }

    /// Queues a PONG unless the outbox is already backed up; false if dropped.
    fn queue_pong(&self, context: &[u8]) -> bool {
        if self.outbox.lock().unwrap().bytes.len() >= MAX_OUTBOX_FOR_PONG {
            return false;
        }
        self.queue(|outbox| outbox.extend_from_slice(&pong_frame(context)));
        true
    }
}

impl EngineInputSocket {
    /// Accepts engine connections on `listener` from now on, reading messages
    /// of at most `limits`. Messages the engines send come out of the
    /// receiver (dropping it discards them).
    pub fn start(
        listener: StreamListener,
        limits: FrameLimits,
    ) -> (Arc<EngineInputSocket>, mpsc::UnboundedReceiver<EngineMessage>) {
        let (received, receiver) = mpsc::unbounded_channel();
        let input_socket = Arc::new(EngineInputSocket {
            links: Mutex::new(HashMap::new()),
            received,
            next_link_id: AtomicU64::new(0),
            limits,
            lost: watch::Sender::new(None),
        });
        let for_engines = input_socket.clone();
        tokio::spawn(async move {
            accept_engine_connections(listener, "an engine input connection", move |stream, pending| {
                serve_engine(stream, pending, for_engines.clone())
            })
            .await
        });
        (input_socket, receiver)
    }

    /// Queues `frames` as one message for the engine with `identity`.
    pub fn send(&self, identity: &[u8], frames: &[&[u8]]) -> Result<(), SendError> {
        let link = self.links.lock().unwrap().get(identity).cloned().ok_or(SendError::NotConnected)?;
        link.queue(|outbox| encode_message(frames, outbox));
        Ok(())
    }

    /// Resolves once everything queued so far has been written to the engine
    /// sockets (or their connections are gone).
    pub async fn flush(&self) {
        let pending: Vec<_> = {
            let links = self.links.lock().unwrap();
            links.values().map(|link| (link.outbox.lock().unwrap().queued, link.written.clone())).collect()
        };
        for (queued, mut written) in pending {
            // An error means the writer ended: nothing more will be written.
            let _ = written.wait_for(|&done| done >= queued).await;
        }
    }

    /// Watches for an engine whose own connection (the one it registered
    /// on) ended, closed or dropped: the value turns to that engine, once.
    pub fn lost_engine(&self) -> watch::Receiver<Option<LostEngine>> {
        self.lost.subscribe()
    }

    /// Gives `identity` to `link` unless a live connection already holds it.
    fn claim(&self, identity: &[u8], link: &Arc<Link>) -> bool {
        let mut links = self.links.lock().unwrap();
        if links.contains_key(identity) {
            return false;
        }
        links.insert(identity.to_vec(), link.clone());
        true
    }

    /// Frees `identity` if `link` holds it.
    fn release(&self, identity: &[u8], link: &Link) {
        let mut links = self.links.lock().unwrap();
        if links.get(identity).is_some_and(|current| current.id == link.id) {
            links.remove(identity);
        }
    }
}

/// Serves one DEALER connection: its writer task drains the outbox, this task
/// reads. The connection stays pending (`pending`) until its first message.
/// A connection whose identity is held by another live one is refused; when
/// the holder ends after it sent something (its registration), that engine
/// is lost: when it closes, breaks the protocol, or is silent past the
/// heartbeat TTL its PINGs announce (a host whose link was cut).
async fn serve_engine(stream: AcceptedStream, pending: PendingPermit, input_socket: Arc<EngineInputSocket>) {
    let peer = match handshake(stream, "ROUTER", "DEALER", input_socket.limits).await {
        Ok(peer) => peer,
        Err(e) => return tracing::warn!("refused an engine input connection: {e}"),
    };
    let (mut reader, mut writer, identity) = (peer.reader, peer.writer, peer.identity);
    let (written_tx, written) = watch::channel(0);
    let link = Arc::new(Link {
        id: input_socket.next_link_id.fetch_add(1, Ordering::Relaxed),
        outbox: Mutex::new(Outbox::default()),
        filled: Notify::new(),
        written,
    });
    if !input_socket.claim(&identity, &link) {
        return tracing::warn!(
            identity = ?identity,
            "refused an engine input connection: a live connection already holds its identity"
        );
    }
    tracing::debug!(identity = ?identity, "engine input connection open");
    let writing = tokio::spawn({
        let link = link.clone();
        async move {
            loop {
                link.filled.notified().await;
                // Woken by a handler, this task would run right after it (tokio's
                // LIFO slot): let the other handlers that are ready queue theirs first.
                tokio::task::yield_now().await;
                let (bytes, queued) = {
                    let mut outbox = link.outbox.lock().unwrap();
                    (std::mem::take(&mut outbox.bytes), outbox.queued)
                };
                if let Err(e) = writer.write_all(&bytes).await {
                    return tracing::warn!("writing to an engine failed: {e}");
                }
                written_tx.send_replace(queued);
            }
        }
    });
    let (mut pending, mut registered) = (Some(pending), false);
    // The heartbeat TTL last logged: logged when it first comes and when it changes.
    let mut announced_ttl = None;
    let how = loop {
        match reader.next().await {
            Ok(Some(Incoming::Message(frame))) => {
                registered = true;
                pending.take();
                if input_socket.received.send((identity.clone(), frame)).is_err() {
                    tracing::debug!(identity = ?identity, "ignoring a message from an engine after start-up");
                }
            }
            Ok(Some(Incoming::Ping(context))) => {
                if reader.peer_ttl() != announced_ttl {
                    announced_ttl = reader.peer_ttl();
                    match announced_ttl {
                        Some(ttl) => tracing::info!(
                            identity = ?identity,
                            "an engine announces a heartbeat TTL of {ttl:?}: silent for longer, it is lost"
                        ),
                        None => tracing::info!(identity = ?identity, "an engine no longer announces a heartbeat TTL"),
                    }
                }
                if !link.queue_pong(&context) {
                    tracing::debug!(identity = ?identity, "not answering a PING: the engine is not reading");
                }
            }
            Ok(None) => {
                tracing::debug!(identity = ?identity, "engine input connection closed");
                break "its connection closed".to_string();
            }
            Err(e) => {
                tracing::warn!(identity = ?identity, "dropping an engine input connection: {e}");
                break format!("its connection was dropped: {e}");
            }
        }
    };
    writing.abort();
    input_socket.release(&identity, &link);
    if registered {
        input_socket.lost.send_if_modified(|lost| {
            let first = lost.is_none();
            if first {
                *lost = Some(LostEngine { identity, how });
            }
            first
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt;
    use tokio::io::AsyncReadExt;

    /// A command frame (short form) holding `body`.
    fn command(body: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x04, body.len() as u8];
        frame.extend_from_slice(body);
        frame
    }

    /// Connects to `name` as a DEALER with identity `[0, 0]` and finishes the
    /// handshake (reading the router's greeting and READY).
    async fn dealer(name: &str) -> tokio::net::UnixStream {
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
        stream.set_nonblocking(true).unwrap();
        let mut stream = tokio::net::UnixStream::from_std(stream).unwrap();
        let mut greeting = [0u8; 64];
        greeting[0] = 0xFF;
        greeting[9] = 0x7F;
        greeting[10] = 3;
        greeting[12..16].copy_from_slice(b"NULL");
        stream.write_all(&greeting).await.unwrap();
        let mut ready = b"\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER".to_vec();
        ready.extend_from_slice(b"\x08Identity\x00\x00\x00\x02\x00\x00");
        stream.write_all(&command(&ready)).await.unwrap();
        let mut theirs = [0u8; 64 + 2 + 28];
        stream.read_exact(&mut theirs).await.unwrap();
        stream
    }

    #[tokio::test]
    async fn pings_from_a_peer_that_never_reads_do_not_grow_its_outbox() {
        let name = format!("vllm-rs-router-pong-{}-{}", std::process::id(), crate::ids::random_hex(6));
        let listener = StreamListener::bind_endpoint(&format!("ipc://@{name}")).unwrap();
        let (input_socket, mut received) = EngineInputSocket::start(listener, FrameLimits::default());
        let mut peer = dealer(&name).await;
        // 100k PINGs (about 1 MiB of PONGs) and never a read; then a message,
        // which comes out once every PING before it was handled.
        let ping = command(b"\x04PING\x00\x00ctx");
        let pings: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 100_000).collect();
        let writing = tokio::spawn(async move {
            peer.write_all(&pings).await.unwrap();
            peer.write_all(&[0x00, 2, b'h', b'i']).await.unwrap();
            peer
        });
        assert_eq!(received.recv().await, Some((vec![0, 0], Bytes::from_static(b"hi"))));
        let queued = input_socket.links.lock().unwrap()[&vec![0u8, 0]].outbox.lock().unwrap().bytes.len();
        assert!(queued <= MAX_OUTBOX_FOR_PONG + 64, "{queued} bytes of PONGs queued");
        drop(writing.await.unwrap());
    }

    #[tokio::test]
    async fn flush_resolves_once_queued_messages_are_on_the_socket() {
        let name = format!("vllm-rs-router-flush-{}-{}", std::process::id(), crate::ids::random_hex(6));
        let listener = StreamListener::bind_endpoint(&format!("ipc://@{name}")).unwrap();
        let (input_socket, mut received) = EngineInputSocket::start(listener, FrameLimits::default());
        let mut peer = dealer(&name).await;
        peer.write_all(&[0x00, 3, b'r', b'e', b'g']).await.unwrap();
        assert_eq!(received.recv().await, Some((vec![0, 0], Bytes::from_static(b"reg"))));
        input_socket.flush().await; // nothing queued: resolves at once
        for _ in 0..100 {
            input_socket.send(&[0, 0], &[b"abort"]).unwrap();
        }
        input_socket.flush().await;
        // Every message is in the socket's buffer: readable without waiting.
        let expected: Vec<u8> = [0x00, 5].iter().chain(b"abort").copied().cycle().take(7 * 100).collect();
        let mut got = vec![0u8; expected.len()];
        let mut filled = 0;
        while filled < got.len() {
            match peer.try_read(&mut got[filled..]) {
                Ok(0) => panic!("the router closed the connection"),
                Ok(n) => filled += n,
                Err(e) => panic!("after flush, {filled} of {} bytes were readable: {e}", got.len()),
            }
        }
        assert_eq!(got, expected);
        // With the peer gone, a flush still returns (written, or the connection ended).
        input_socket.send(&[0, 0], &[b"late"]).unwrap();
        drop(peer);
        tokio::time::timeout(std::time::Duration::from_secs(30), input_socket.flush()).await.expect("flush returned");
    }
}
