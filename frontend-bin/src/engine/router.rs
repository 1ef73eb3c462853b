//! The frontend's input socket as a ZeroMQ ROUTER, spoken in the async
//! runtime (`zmtp.rs`): engines connect their DEALER, whose identity is their
//! 2-byte index; what they send (their registration) comes out of the
//! receiver `start` returns; `send` queues a message for one engine.
//!
//! Each connection has an outbox and a writer task: a message is appended to
//! the outbox under a lock and written by that task together with whatever
//! else was queued meanwhile, so a burst of requests costs one `write`, and no
//! thread stands between the HTTP handlers and the socket.

use super::zmtp::{encode_message, handshake, pong_frame, Incoming};
use crate::listener::{accept_forever, AcceptedStream, StreamListener};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};

/// A message an engine sent on its DEALER: its identity and the first frame.
pub type EngineMessage = (Vec<u8>, Bytes);

/// The engines connected to the input socket, by identity.
pub struct InputRouter {
    links: Mutex<HashMap<Vec<u8>, Arc<Link>>>,
    received: mpsc::UnboundedSender<EngineMessage>,
    next_link_id: AtomicU64,
}

/// One engine connection's outbox.
struct Link {
    id: u64,
    outbox: Mutex<Vec<u8>>,
    filled: Notify,
}

impl Link {
    fn queue(&self, append: impl FnOnce(&mut Vec<u8>)) {
        let was_empty = {
            let mut outbox = self.outbox.lock().unwrap();
            let was_empty = outbox.is_empty();
            append(&mut outbox);
            was_empty
        };
        if was_empty {
            self.filled.notify_one();
        }
    }
}

impl InputRouter {
    /// Accepts engine connections on `listener` from now on. Messages the
    /// engines send come out of the receiver (dropping it discards them).
    pub fn start(listener: StreamListener) -> (Arc<InputRouter>, mpsc::UnboundedReceiver<EngineMessage>) {
        let (received, receiver) = mpsc::unbounded_channel();
        let router = Arc::new(InputRouter { links: Mutex::new(HashMap::new()), received, next_link_id: AtomicU64::new(0) });
        let for_engines = router.clone();
        tokio::spawn(async move {
            accept_forever(listener, "an engine input connection", move |stream| serve_engine(stream, for_engines.clone()))
                .await
        });
        (router, receiver)
    }

    /// Queues `frames` as one message for the engine with `identity`; an
    /// engine that is not connected is an error (ZMQ_ROUTER_MANDATORY).
    pub fn send(&self, identity: &[u8], frames: &[&[u8]]) -> Result<(), String> {
        let link = self.links.lock().unwrap().get(identity).cloned();
        match link {
            Some(link) => {
                link.queue(|outbox| encode_message(frames, outbox));
                Ok(())
            }
            None => Err("the engine is not connected".into()),
        }
    }
}

/// Serves one DEALER connection: its writer task drains the outbox, this task
/// reads. A reconnecting engine's new connection takes over its identity.
async fn serve_engine(stream: AcceptedStream, router: Arc<InputRouter>) {
    let peer = match handshake(stream, "ROUTER", "DEALER").await {
        Ok(peer) => peer,
        Err(e) => return tracing::warn!("refused an engine input connection: {e}"),
    };
    let (mut reader, mut writer, identity) = (peer.reader, peer.writer, peer.identity);
    let link = Arc::new(Link {
        id: router.next_link_id.fetch_add(1, Ordering::Relaxed),
        outbox: Mutex::new(Vec::new()),
        filled: Notify::new(),
    });
    router.links.lock().unwrap().insert(identity.clone(), link.clone());
    tracing::debug!(identity = ?identity, "engine input connection open");
    let writing = tokio::spawn({
        let link = link.clone();
        async move {
            loop {
                link.filled.notified().await;
                // Woken by a handler, this task would run right after it (tokio's
                // LIFO slot): let the other handlers that are ready queue theirs first.
                tokio::task::yield_now().await;
                let pending = std::mem::take(&mut *link.outbox.lock().unwrap());
                if let Err(e) = writer.write_all(&pending).await {
                    return tracing::warn!("writing to an engine failed: {e}");
                }
            }
        }
    });
    loop {
        match reader.next().await {
            Ok(Some(Incoming::Message(frame))) => {
                if router.received.send((identity.clone(), frame)).is_err() {
                    tracing::debug!(identity = ?identity, "ignoring a message from an engine after start-up");
                }
            }
            Ok(Some(Incoming::Ping(context))) => link.queue(|outbox| outbox.extend_from_slice(&pong_frame(&context))),
            Ok(None) => break tracing::debug!(identity = ?identity, "engine input connection closed"),
            Err(e) => break tracing::warn!("dropping an engine input connection: {e}"),
        }
    }
    writing.abort();
    let mut links = router.links.lock().unwrap();
    if links.get(&identity).is_some_and(|current| current.id == link.id) {
        links.remove(&identity);
    }
}
