//! The engine side: vLLM's engine-core protocol over ZeroMQ.

pub mod balancer;
pub mod client;
pub mod codec;
pub mod coordination;
pub mod inbox;
pub mod input_socket;
pub mod logprob_rows;
pub mod msgpack;
pub mod protocol;
pub mod registration;
pub mod sockets;

pub use client::{EngineClient, RequestStream, SubmitError};
pub use inbox::{RequestEvent, Take};
/// ZMTP, spoken in the runtime (the `vllm-rs-zmtp` crate).
pub use vllm_rs_zmtp as zmtp;
