//! Errors of the process core, each naming what went wrong and on what (the
//! program, path, fd or process), and keeping the OS error behind it so that
//! the Python layer can raise the matching `OSError` subclass with `errno`
//! and `filename` set.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

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
    /// The working directory cannot be used (`source`: missing, not a directory, ...).
    #[error("cannot start the child in {path:?}: {source}")]
    BadCwd {
        /// The working directory asked for.
        path: OsString,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },
    /// The child failed before running the program.
    #[error("{}", describe_failure(*.errno, *.stage, *.detail, path.as_ref()))]
    Failed {
        /// What the failing step was about: the program for
        /// [`FailStage::Exec`], the working directory for [`FailStage::Chdir`].
        path: Option<OsString>,
        /// The OS error number.
        errno: i32,
        /// What the child was doing when it failed.
        stage: FailStage,
        /// The fd being placed when `stage` is [`FailStage::Fd`], else -1.
        detail: i32,
    },
    /// The guardian could not be started or reached.
    #[error(transparent)]
    Guardian(#[from] GuardianError),
}

fn describe_failure(errno: i32, stage: FailStage, detail: i32, path: Option<&OsString>) -> String {
    let reason = io::Error::from_raw_os_error(errno);
    let on = path.map(|p| format!(" {p:?}")).unwrap_or_default();
    match stage {
        FailStage::Exec => format!("exec of{on} failed: {reason}"),
        FailStage::Chdir => format!("changing to the working directory{on} failed: {reason}"),
        FailStage::Fd => format!("placing inherited fd {detail} failed: {reason}"),
        FailStage::Fork => format!("fork failed: {reason}"),
    }
}

/// This process's guardian could not be started, reached, or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum GuardianError {
    /// Nobody said how to start a guardian (`set_guardian_command`).
    #[error("vllm-rs guardian: no guardian command configured (vllm_rs._core.set_guardian_command)")]
    NotConfigured,
    /// Starting the guardian process failed.
    #[error("vllm-rs guardian: cannot start it: {0}")]
    Start(#[source] io::Error),
    /// The guardian exited before it said it was ready.
    #[error("vllm-rs guardian: the guardian process exited during start-up")]
    ExitedDuringStartup,
    /// The guardian is gone (its socket closed).
    #[error("vllm-rs guardian: the guardian process died")]
    Died,
    /// Reading from or writing to the guardian's socket failed.
    #[error("vllm-rs guardian: {0}")]
    Io(#[from] io::Error),
    /// The guardian did not answer in time.
    #[error("vllm-rs guardian: no answer within {0:?}")]
    NoAnswer(Duration),
}

/// A path could not be registered with (or unregistered from) the guardian.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The path itself is unusable: `lstat` or making it absolute failed.
    #[error("cannot remove {path:?} on exit: {source}")]
    Path {
        /// The path as given.
        path: PathBuf,
        /// Why it is unusable.
        #[source]
        source: io::Error,
    },
    /// The guardian could not be started or reached.
    #[error(transparent)]
    Guardian(#[from] GuardianError),
}

/// A call on a started child (or a process tree) failed; names the process.
#[derive(Debug, thiserror::Error)]
#[error("{action} process {pid}: {source}")]
pub struct ProcessError {
    /// The process the call was about.
    pub pid: libc::pid_t,
    /// What was being done, e.g. "signal".
    pub action: &'static str,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl ProcessError {
    /// Wraps `source` with the process and action it came from.
    pub fn new(pid: libc::pid_t, action: &'static str, source: io::Error) -> Self {
        ProcessError { pid, action, source }
    }
}
