//! `vllm-rs-guardian <control fd> <supervisor pid>`: the guardian loop as a
//! standalone program (the Rust tests start it; Python runs the same loop
//! from the extension module).
#[cfg(target_os = "linux")]
fn main() {
    vllm_rs_core::guardian::main_from_args(std::env::args_os().skip(1))
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("vllm-rs-guardian needs Linux");
    std::process::exit(2);
}
