//! Links the `vllm-rs` executable at a fixed address (`-no-pie`) on Linux.
//!
//! A position-independent executable is relocated by the loader at every
//! start: about 41,000 relative relocations, each a write into the relocated
//! read-only data, which copies about 180 pages of it (page faults) before
//! `main` runs. Linked at a fixed address the linker resolves them all, the
//! data stays shared with the page cache, and a start takes half the page
//! faults (190 instead of 380 for `vllm-rs --version`) and about 0.7 ms less
//! CPU (docs/frontend-performance.md, "Start-up"). What is given up is the
//! randomized load address of the executable itself; libraries, heap and
//! stacks are still randomized. The crates stay position-independent code
//! (the Python extension links the same objects); only this binary's link
//! changes.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-link-arg-bin=vllm-rs=-no-pie");
    }
}
