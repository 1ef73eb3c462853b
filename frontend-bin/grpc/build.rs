//! Generates the tonic server and client and the prost messages of vLLM's gRPC
//! service from `proto/`, with protox instead of a system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/vllm_engine.proto", "proto/common.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
