//! Start-up: wait until every engine of this frontend has registered on the
//! input socket, bounded by `engine_ready_timeout_secs`.

use super::input_socket::EngineMessage;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use vllm_rs_wire::codec::decode_registration;
use vllm_rs_wire::protocol::Registration;

/// Waits for messages from `received` until engines `start .. start+count-1`
/// have each sent one registration. An identity outside that range, a
/// duplicate, a bad payload or running out of `timeout` is an error (the last
/// names the missing engines). Returns the registrations in engine order.
pub async fn wait_for_engines(
    received: &mut mpsc::UnboundedReceiver<EngineMessage>,
    start: u32,
    count: u32,
    timeout: Duration,
) -> Result<Vec<Registration>> {
    let deadline = Instant::now() + timeout;
    let mut registered: BTreeMap<u32, Registration> = BTreeMap::new();
    while registered.len() < count as usize {
        let Ok(message) = tokio::time::timeout_at(deadline, received.recv()).await else {
            let missing: Vec<String> =
                (start..start + count).filter(|i| !registered.contains_key(i)).map(|i| i.to_string()).collect();
            bail!(
                "timed out after {:.1}s waiting for engines to register; missing engine(s): {}",
                timeout.as_secs_f64(),
                missing.join(", ")
            );
        };
        let Some((identity, payload)) = message else {
            bail!("the input socket stopped while waiting for engines to register");
        };
        let (index, registration) = parse_registration(&identity, &payload, start, count)?;
        if registered.insert(index, registration).is_some() {
            bail!("engine {index} registered twice");
        }
        tracing::info!(engine = index, "engine registered ({}/{count})", registered.len());
    }
    Ok(registered.into_values().collect())
}

/// Reads one registration: the sender's identity and the payload.
fn parse_registration(identity: &[u8], payload: &[u8], start: u32, count: u32) -> Result<(u32, Registration)> {
    let [lo, hi] = identity else {
        bail!("registration from a peer whose identity {identity:02x?} is not a 2-byte engine index");
    };
    let index = u16::from_le_bytes([*lo, *hi]) as u32;
    if !(start..start + count).contains(&index) {
        bail!("engine {index} registered, but this frontend serves engines {start}..={}", start + count - 1);
    }
    let registration =
        decode_registration(payload).map_err(|e| anyhow::anyhow!("engine {index} sent a bad registration: {e}"))?;
    Ok((index, registration))
}
