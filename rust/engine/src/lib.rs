//! The engine client: vLLM's engine-core protocol over ZeroMQ (the wire
//! types are the `vllm-rs-wire` crate's), and the listening sockets engines
//! and clients connect to.

pub mod balancer;
pub mod client;
pub mod coordination;
pub mod fds;
pub mod ids;
pub mod inbox;
pub mod input_socket;
pub mod listener;
pub mod registration;
pub mod sockets;

pub use client::{EngineClient, RequestStream, SubmitError};
pub use inbox::{RequestEvent, Take};
/// ZMTP, spoken in the runtime (the `vllm-rs-zmtp` crate).
pub use vllm_rs_zmtp as zmtp;
