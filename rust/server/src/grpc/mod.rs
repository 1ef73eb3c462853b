//! vLLM's gRPC generate API (`vllm.grpc.engine.VllmEngine`, from the
//! `vllm-rs-grpc` crate) served on `--grpc-listen-fd`, next to the HTTP server
//! and over the same engines (docs/frontend.md, "gRPC").

pub mod generation;
pub mod logprobs;
pub mod request;
pub mod server;
pub mod service;
