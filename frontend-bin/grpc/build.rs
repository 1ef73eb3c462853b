//! Generates the tonic server and client and the prost messages of vLLM's gRPC
//! service from `proto/`, with protox instead of a system `protoc`, and their
//! encoded descriptors for gRPC reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/vllm_engine.proto", "proto/common.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // The encoded descriptors, for the reflection service.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("vllm_engine_descriptors.bin"), prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
