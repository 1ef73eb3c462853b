//! Data parallelism with vLLM's coordinator: the subscription
//! (`vllm-rs-coordinator`) feeds the engine client, which balances on the
//! published counts of its own engines and stamps the published wave on
//! every request.

use super::EngineClient;
use tokio::sync::watch;
use vllm_rs_coordinator::{subscribe, CoordinatorAddress, Published, SubscriberSettings};

/// Subscribes to the coordinator at `address` for as long as the runtime
/// runs, applying every update to `engines`. Must be called inside the runtime.
pub fn follow_coordinator(address: CoordinatorAddress, engines: EngineClient) {
    tracing::info!(%address, "following the data-parallel coordinator");
    let (state, mut updates) = watch::channel(Published::default());
    tokio::spawn(subscribe(address, SubscriberSettings::default(), state));
    tokio::spawn(async move {
        while updates.changed().await.is_ok() {
            let update = updates.borrow_and_update().clone();
            engines.apply_coordinator_update(&update);
        }
    });
}
