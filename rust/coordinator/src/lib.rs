//! The frontend's side of vLLM's data-parallel coordinator (`DPCoordinator`).
//!
//! With data parallelism, the coordinator gathers each engine's scheduler
//! counts and the request wave, and publishes them on an XPUB socket. A
//! frontend connects an XSUB to it (the `--coordinator-address`), subscribes
//! to everything (the one-byte message `\x01`), and receives msgpack
//! `[counts, current_wave, engines_running]` messages: `counts` is nil (a
//! wave change only) or one `[waiting, running, kv_cache_usage]` per engine
//! of the whole deployment. The frontend balances on the counts of its own
//! engines and stamps `current_wave` on every request it sends. Frontends
//! send nothing else in vLLM 0.33: engines alone start waves.
//!
//! [`CoordinatorAddress`] parses and connects, [`decode_published`] decodes
//! one message, and [`subscribe`] keeps a subscription alive (reconnecting
//! as libzmq would) and hands every decoded message to a watch channel.

mod address;
mod published;
mod subscriber;

pub use address::{AddressError, CoordinatorAddress};
pub use published::{decode_published, EngineCounts, Published, PublishedDecodeError};
pub use subscriber::{subscribe, SubscriberSettings};
