//! vllm-rs process core: spawning with an exact set of inherited fds, pid-fd
//! handles, children that die with their parent (descendants included), and
//! a kill-tree that leaves no survivor. Linux only: elsewhere the crate is
//! empty, and the Python module's functions raise `NotImplementedError`.
//!
//! No Python here: the PyO3 module `vllm_rs._core` (`rust/python/`, crate
//! `vllm-rs-python`) is a thin layer over these modules.

#[cfg(target_os = "linux")]
pub mod error;
#[cfg(target_os = "linux")]
pub mod guardian;
#[cfg(target_os = "linux")]
pub mod killtree;
#[cfg(target_os = "linux")]
pub mod process;
#[cfg(target_os = "linux")]
pub mod removal;
#[cfg(target_os = "linux")]
pub mod supervisor;
#[cfg(target_os = "linux")]
pub mod sys;
#[cfg(target_os = "linux")]
pub mod wire;

#[cfg(target_os = "linux")]
pub use {
    error::{GuardianError, ProcessError, RegisterError, SpawnError},
    killtree::kill_process_tree,
    process::ChildProcess,
    supervisor::{spawn, SpawnSpec},
    sys::ExitStatus,
};
