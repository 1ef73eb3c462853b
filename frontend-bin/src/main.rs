//! The `vllm-rs` command line.
use clap::{Parser, Subcommand};

/// vllm-rs: the process and runtime layer of LLM serving.
#[derive(Parser)]
#[command(name = "vllm-rs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI API on an inherited socket, driving engine cores over ZeroMQ.
    Frontend,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Frontend => {
            eprintln!("vllm-rs frontend: not implemented yet");
            std::process::ExitCode::from(2)
        }
    }
}
