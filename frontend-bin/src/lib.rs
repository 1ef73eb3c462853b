//! `vllm-rs frontend`: an OpenAI-compatible HTTP server in front of engine-core
//! processes that speak vLLM's ZeroMQ/MessagePack protocol
//! (`docs/frontend.md`, `docs/engine-protocol.md`); `vllm-rs serve` starts the
//! whole stack (`launcher`).

pub mod app;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod fds;
pub mod generate;
pub mod generation_config;
pub mod grpc;
pub mod http;
pub mod ids;
pub mod launcher;
pub mod listener;
pub mod logprobs;
pub mod metrics;
pub mod model_files;
pub mod serve_args;
pub mod stats_log;
pub mod stop;
pub mod tls;
pub mod tokenizer;
