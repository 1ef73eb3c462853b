//! `vllm-rs frontend`: an OpenAI-compatible HTTP server in front of engine-core
//! processes that speak vLLM's ZeroMQ/MessagePack protocol
//! (`docs/frontend.md`, `docs/engine-protocol.md`); `vllm-rs serve` starts the
//! whole stack (`launcher`). The binary only assembles the workspace's crates
//! (docs/architecture.md draws them): the command line, startup and shutdown.

pub mod app;
pub mod cli;
pub mod launcher;
pub mod startup_code;
pub mod stats_log;
