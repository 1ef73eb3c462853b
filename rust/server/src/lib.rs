//! The frontend's servers over the engines: the OpenAI-compatible HTTP API
//! (`http`, its routes, validation and answers), vLLM's gRPC generate API
//! (`grpc`, on `--grpc-listen-fd`) and TLS for the HTTP listener (`tls`).

pub mod grpc;
pub mod http;
pub mod tls;
