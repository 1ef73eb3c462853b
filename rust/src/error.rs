//! Errors of the process core, each naming what went wrong.

use std::ffi::OsString;
use std::io;

use crate::wire::FailStage;

/// Why a child could not be started. Whatever the cause, nothing is left running.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// argv was empty.
    #[error("cannot spawn: argv is empty")]
    EmptyArgv,
    /// An argument, environment entry or path holds a NUL byte (or an
    /// environment name holds `=`), which exec cannot carry.
    #[error("cannot spawn: {0}")]
    InvalidArgument(String),
    /// A fd to inherit is not open in this process.
    #[error("cannot pass fd {0} to the child: it is not an open file descriptor")]
    BadFd(i32),
    /// The working directory does not exist or is not a directory.
    #[error("cannot start the child in {0:?}: not a directory")]
    BadCwd(OsString),
    /// The child failed before running the program (`detail`: the fd, if any).
    #[error("{}", describe_failure(*.errno, *.stage, *.detail))]
    Failed { errno: i32, stage: FailStage, detail: i32 },
    /// The guardian could not be started or reached.
    #[error("vllm-rs guardian: {0}")]
    Guardian(#[source] io::Error),
}

fn describe_failure(errno: i32, stage: FailStage, detail: i32) -> String {
    let reason = io::Error::from_raw_os_error(errno);
    match stage {
        FailStage::Exec => format!("exec failed: {reason}"),
        FailStage::Chdir => format!("changing to the working directory failed: {reason}"),
        FailStage::Fd => format!("placing inherited fd {detail} failed: {reason}"),
        FailStage::Fork => format!("fork failed: {reason}"),
    }
}
