//! vLLM's gRPC engine service (`vllm.grpc.engine.VllmEngine`), generated from
//! the `.proto` files in `proto/` (same package, messages and field numbers as
//! vLLM's published definition, so vLLM's gRPC clients talk to it unchanged).
//!
//! This crate holds only the wire types and the generated server; the
//! servicer that drives engines lives in the frontend (`vllm_rs_frontend::grpc`).
//!
//! The generated code is checked in (`src/generated/`) instead of made by a
//! build script: compiling protox and tonic-prost-build for every fresh build
//! cost about 6% of the release build's CPU time (docs/development.md, Build
//! settings). `tests/generated.rs` regenerates it from `proto/` and fails when
//! it differs; `VLLM_RS_REGENERATE_GRPC=1 cargo test -p vllm-rs-grpc --test generated`
//! rewrites it after a `.proto` changes.

// The generated code names other packages by their full path from the crate
// root, so the modules nest like the proto packages.
#[allow(missing_docs, clippy::all)]
mod smg {
    pub mod grpc {
        pub mod common {
            include!("generated/smg.grpc.common.rs");
        }
    }
}

#[allow(missing_docs, clippy::all)]
mod vllm {
    pub mod grpc {
        pub mod engine {
            include!("generated/vllm.grpc.engine.rs");
        }
    }
}

/// Messages shared between the gateway's engine services (`smg.grpc.common`).
pub use smg::grpc::common;
/// The `vllm.grpc.engine` package: the `VllmEngine` service and its messages.
pub use vllm::grpc::engine;

/// The encoded `FileDescriptorSet` of the `.proto` files (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/vllm_engine_descriptors.bin");

/// The service's full name, `vllm.grpc.engine.VllmEngine`.
pub const SERVICE_NAME: &str = "vllm.grpc.engine.VllmEngine";
