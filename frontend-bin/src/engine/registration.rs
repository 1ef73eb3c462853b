//! Start-up: wait until every engine of this frontend has registered on the
//! input socket, bounded by `engine_ready_timeout_secs`.

use super::codec::decode_registration;
use super::protocol::Registration;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the wait looks at its cancel flag.
const CANCEL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Waits on `router` until engines `start .. start+count-1` have each sent one
/// registration. An identity outside that range, a duplicate, a bad payload or
/// running out of `timeout` is an error (the last names the missing engines).
/// Returns the registrations in engine order. Stops early when `cancel` is set.
pub fn wait_for_engines(
    router: &zmq::Socket,
    start: u32,
    count: u32,
    timeout: Duration,
    cancel: &AtomicBool,
) -> Result<Vec<Registration>> {
    let deadline = Instant::now() + timeout;
    let mut registered: BTreeMap<u32, Registration> = BTreeMap::new();
    while registered.len() < count as usize {
        if cancel.load(Ordering::Relaxed) {
            bail!("cancelled while waiting for engines to register");
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> =
                (start..start + count).filter(|i| !registered.contains_key(i)).map(|i| i.to_string()).collect();
            bail!(
                "timed out after {:.1}s waiting for engines to register; missing engine(s): {}",
                timeout.as_secs_f64(),
                missing.join(", ")
            );
        }
        let wait = (deadline - now).min(CANCEL_CHECK_INTERVAL);
        if router.poll(zmq::POLLIN, wait.as_millis() as i64).context("polling the input socket")? == 0 {
            continue;
        }
        let frames = router.recv_multipart(0).context("receiving on the input socket")?;
        let (index, registration) = parse_registration(&frames, start, count)?;
        if registered.insert(index, registration).is_some() {
            bail!("engine {index} registered twice");
        }
        tracing::info!(engine = index, "engine registered ({}/{count})", registered.len());
    }
    Ok(registered.into_values().collect())
}

/// Reads one registration message `[identity, payload...]` from the ROUTER.
fn parse_registration(frames: &[Vec<u8>], start: u32, count: u32) -> Result<(u32, Registration)> {
    let identity = frames.first().map(Vec::as_slice).unwrap_or_default();
    let [lo, hi] = identity else {
        bail!("registration from a peer whose identity {identity:02x?} is not a 2-byte engine index");
    };
    let index = u16::from_le_bytes([*lo, *hi]) as u32;
    if !(start..start + count).contains(&index) {
        bail!("engine {index} registered, but this frontend serves engines {start}..={}", start + count - 1);
    }
    let payload = if frames.len() > 1 { frames[frames.len() - 1].as_slice() } else { &[] };
    let registration =
        decode_registration(payload).map_err(|e| anyhow::anyhow!("engine {index} sent a bad registration: {e}"))?;
    Ok((index, registration))
}
