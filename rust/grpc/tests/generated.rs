//! The checked-in generated code (`src/generated/`) is exactly what protox
//! and tonic-prost-build make from `proto/` with this crate's dependencies:
//! regenerated into a scratch directory and compared byte for byte. With
//! `VLLM_RS_REGENERATE_GRPC=1` the test writes the fresh files over
//! `src/generated/` instead (after a `.proto` or a tonic/prost change).

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};

/// The files the generator writes: the two packages' code and the encoded
/// `FileDescriptorSet` for gRPC reflection.
const GENERATED: [&str; 3] = ["smg.grpc.common.rs", "vllm.grpc.engine.rs", "vllm_engine_descriptors.bin"];

/// Compiles `proto/` into `out`: the server side only (the frontend serves,
/// it never calls), and the descriptors the reflection service registers.
fn generate(out: &Path) -> Result<(), Box<dyn Error>> {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let files = ["vllm_engine.proto", "common.proto"].map(|file| proto.join(file));
    let descriptors = protox::compile(files, [&proto])?;
    fs::write(out.join(GENERATED[2]), prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure().build_client(false).build_server(true).out_dir(out).compile_fds(descriptors)?;
    Ok(())
}

#[test]
fn checked_in_code_is_what_the_protos_generate() -> Result<(), Box<dyn Error>> {
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join("generated");
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vllm-rs-grpc-generated");
    // A leftover from an interrupted run would only be overwritten file by file.
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    generate(&scratch)?;
    let regenerate = std::env::var_os("VLLM_RS_REGENERATE_GRPC").is_some_and(|value| value == "1");
    let mut stale = Vec::new();
    for name in GENERATED {
        let fresh = fs::read(scratch.join(name))?;
        if regenerate {
            fs::write(checked_in.join(name), &fresh)?;
        } else if fs::read(checked_in.join(name)).ok().as_deref() != Some(fresh.as_slice()) {
            stale.push(name);
        }
    }
    // The generator writes nothing else the crate would miss.
    let mut written: Vec<String> = fs::read_dir(&scratch)?
        .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, std::io::Error>>()?;
    written.sort();
    let mut expected: Vec<String> = GENERATED.iter().map(|name| name.to_string()).collect();
    expected.sort();
    fs::remove_dir_all(&scratch)?;
    assert_eq!(written, expected, "the generator wrote other files than src/generated/ holds");
    assert!(
        stale.is_empty(),
        "src/generated/{stale:?} differ from what proto/ generates; run \
         `VLLM_RS_REGENERATE_GRPC=1 cargo test -p vllm-rs-grpc --test generated` and commit the result"
    );
    Ok(())
}
