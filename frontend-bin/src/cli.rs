//! The command line, exactly as `RustFrontendProcessManager` calls it.

use clap::{ArgGroup, Args, Parser, Subcommand};
use std::os::fd::RawFd;

/// vllm-rs: the process and runtime layer of LLM serving.
#[derive(Debug, Parser)]
#[command(name = "vllm-rs", version, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `vllm-rs`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the OpenAI API on an inherited socket, driving engine cores over ZeroMQ.
    Frontend(FrontendArgs),
    /// Serve a model: the whole stack (engines plus this frontend), as `python -m vllm_rs serve`.
    #[command(disable_help_flag = true)]
    Serve(ServeArgs),
}

/// Arguments of `vllm-rs serve`: passed unchanged to `python -m vllm_rs serve`
/// (which parses them, `--help` included).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// `[MODEL] [OPTIONS]`, as `python -m vllm_rs serve` takes them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<std::ffi::OsString>,
}

/// Arguments of `vllm-rs frontend`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("input").required(true).args(["input_listener_fd", "input_address"])))]
#[command(group(ArgGroup::new("output").required(true).args(["output_listener_fd", "output_address"])))]
pub struct FrontendArgs {
    /// Inherited HTTP socket (TCP v4/v6 or Unix; listening or only bound).
    #[arg(long, value_name = "FD")]
    pub listen_fd: RawFd,
    /// Inherited listener for the engines' input socket (ROUTER), adopted: never re-bound.
    #[arg(long, value_name = "FD")]
    pub input_listener_fd: Option<RawFd>,
    /// Inherited listener for the engines' output socket (PULL), adopted: never re-bound.
    #[arg(long, value_name = "FD")]
    pub output_listener_fd: Option<RawFd>,
    /// Bind the input socket to this ZeroMQ address instead (engines started elsewhere).
    #[arg(long, value_name = "ADDR")]
    pub input_address: Option<String>,
    /// Bind the output socket to this ZeroMQ address instead (engines started elsewhere).
    #[arg(long, value_name = "ADDR")]
    pub output_address: Option<String>,
    /// Index of the first engine this frontend serves.
    #[arg(long, value_name = "S")]
    pub engine_start_index: u32,
    /// Number of engines this frontend serves (indices S .. S+C-1).
    #[arg(long, value_name = "C")]
    pub engine_count: u32,
    /// Total data-parallel size of the deployment.
    #[arg(long, value_name = "D")]
    pub data_parallel_size: u32,
    /// Inherited TCP socket on which to serve vLLM's gRPC generate API (`vllm.grpc.engine.VllmEngine`).
    #[arg(long, value_name = "FD")]
    pub grpc_listen_fd: Option<RawFd>,
    /// The data-parallel coordinator's publish address (tcp://HOST:PORT, ipc://PATH, ipc://@NAME):
    /// subscribe to its engine counts and request wave.
    #[arg(long, value_name = "ADDR")]
    pub coordinator_address: Option<String>,
    /// Server arguments as a JSON object (see docs/frontend.md).
    #[arg(long, value_name = "JSON")]
    pub args_json: String,
}
