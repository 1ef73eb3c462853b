//! Keeps a subscription to the coordinator's XPUB alive and publishes the
//! merged state to a watch channel.

use crate::address::{Connection, CoordinatorAddress};
use crate::published::{decode_published, Published};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use vllm_rs_zmtp::{encode_message, handshake, pong_frame, FrameLimits, Incoming, ZmtpError};

/// The message that subscribes an XSUB to every topic.
const SUBSCRIBE_ALL: &[u8] = b"\x01";

/// How the subscription behaves.
#[derive(Clone, Copy, Debug)]
pub struct SubscriberSettings {
    /// Wait between connection attempts (libzmq's default reconnect interval).
    pub reconnect_interval: Duration,
    /// Largest message accepted from the coordinator.
    pub max_message_bytes: u64,
}

impl Default for SubscriberSettings {
    fn default() -> Self {
        SubscriberSettings { reconnect_interval: Duration::from_millis(100), max_message_bytes: 16 << 20 }
    }
}

/// Subscribes to the coordinator at `address` until every receiver of
/// `state` is gone. Each message updates `state`: the wave fields always,
/// the counts when the message has them (a wave-only message keeps the last
/// counts). A connection that fails or ends is made again, as libzmq does;
/// a message that does not decode is logged and skipped.
pub async fn subscribe(address: CoordinatorAddress, settings: SubscriberSettings, state: watch::Sender<Published>) {
    let mut failures = 0u64;
    loop {
        let outcome = tokio::select! {
            outcome = connect_and_follow(&address, settings, &state) => outcome,
            _ = state.closed() => return,
        };
        match outcome {
            Ok(()) => tracing::warn!(%address, "the data-parallel coordinator closed its connection; reconnecting"),
            Err(e) if failures == 0 => tracing::warn!(%address, "data-parallel coordinator: {e}; retrying"),
            Err(e) => tracing::debug!(%address, "data-parallel coordinator: {e}; retrying"),
        }
        failures += 1;
        tokio::select! {
            _ = tokio::time::sleep(settings.reconnect_interval) => {}
            _ = state.closed() => return,
        }
    }
}

/// Why one connection ended.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Zmtp(#[from] ZmtpError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

async fn connect_and_follow(
    address: &CoordinatorAddress,
    settings: SubscriberSettings,
    state: &watch::Sender<Published>,
) -> Result<(), ConnectionError> {
    match address.connect().await.map_err(ConnectionError::Connect)? {
        Connection::Tcp(stream) => follow(stream, settings, state).await,
        Connection::Unix(stream) => follow(stream, settings, state).await,
    }
}

async fn follow<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    settings: SubscriberSettings,
    state: &watch::Sender<Published>,
) -> Result<(), ConnectionError> {
    let limits = FrameLimits { max_message_bytes: settings.max_message_bytes };
    let mut peer = handshake(stream, "XSUB", "XPUB", limits).await?;
    let mut subscription = Vec::new();
    encode_message(&[SUBSCRIBE_ALL], &mut subscription);
    peer.writer.write_all(&subscription).await?;
    tracing::info!("subscribed to the data-parallel coordinator");
    while let Some(incoming) = peer.reader.next().await? {
        match incoming {
            Incoming::Ping(context) => peer.writer.write_all(&pong_frame(&context)).await?,
            Incoming::Message(frame) => match decode_published(&frame) {
                Ok(message) => {
                    tracing::debug!(?message, "coordinator update");
                    state.send_modify(|current| merge(current, message));
                }
                Err(e) => tracing::warn!("{e}; skipped"),
            },
        }
    }
    Ok(())
}

/// Applies `message` to `current`: a wave-only message leaves the counts.
fn merge(current: &mut Published, message: Published) {
    current.current_wave = message.current_wave;
    current.engines_running = message.engines_running;
    if message.counts.is_some() {
        current.counts = message.counts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::published::EngineCounts;

    #[test]
    fn a_wave_only_message_keeps_the_last_counts() {
        let counts = vec![EngineCounts { waiting: 1, running: 2, kv_cache_usage: 0.0 }];
        let mut state = Published { counts: Some(counts.clone()), current_wave: 0, engines_running: true };
        merge(&mut state, Published { counts: None, current_wave: 1, engines_running: false });
        assert_eq!(state, Published { counts: Some(counts), current_wave: 1, engines_running: false });
    }
}
