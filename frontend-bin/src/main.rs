//! The `vllm-rs` command line.

use clap::Parser;
use std::process::ExitCode;
use vllm_rs_config::error::ExitError;
use vllm_rs_frontend::cli::{Cli, Command};

/// mimalloc instead of glibc's malloc: a request allocates and frees many small
/// buffers across threads, which glibc served with costly consolidation.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Logs go to stderr; the level comes from `VLLM_LOGGING_LEVEL` (vLLM's variable), default INFO.
fn init_logging() {
    let level = std::env::var("VLLM_LOGGING_LEVEL")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(false)
        .init();
}

/// Returns the memory freed so far to the system now rather than after
/// mimalloc's purge delay: loading a tokenizer's tables frees tens of MiB that
/// would otherwise stay resident until later allocations happen to purge them
/// (with SmolLM2's tokenizer the idle frontend held 86 MiB without this, 64 MiB
/// with it; docs/frontend-performance.md, "Where the memory goes").
/// The code that built them ran once: its pages are let go too.
fn return_freed_memory() {
    // SAFETY: `mi_collect` only walks mimalloc's own structures; any thread may call it.
    unsafe { libmimalloc_sys::mi_collect(true) }
    vllm_rs_frontend::startup_code::release();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    vllm_rs_chat::hf::on_tables_built(return_freed_memory);
    let name = match &cli.command {
        Command::Frontend(_) => "frontend",
        Command::Serve(_) => "serve",
    };
    let outcome = match cli.command {
        Command::Frontend(args) => vllm_rs_frontend::app::run(args),
        Command::Serve(args) => Err(vllm_rs_frontend::launcher::exec_serve(args.args)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            match &error {
                ExitError::Usage(message) => eprintln!("vllm-rs {name}: error: {message}"),
                ExitError::Fatal(_) => tracing::error!("vllm-rs {name} failed: {error}"),
            }
            error.exit_code()
        }
    }
}
