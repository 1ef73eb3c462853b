//! How the process core's errors cross into Python: an OS failure becomes
//! the `OSError` subclass its errno selects (`FileNotFoundError`,
//! `PermissionError`, `ProcessLookupError`, `ChildProcessError`,
//! `TimeoutError`, ...) with `errno` set, and `filename` set when the error
//! is about a path; bad arguments become `ValueError`. A guardian that cannot
//! be started or reached is a `RuntimeError` (callers such as `serve` treat
//! it as a failed stack), whose `__cause__` is the `OSError` behind it, if any.

use std::ffi::OsStr;
use std::io;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::{PyErr, Python};

use vllm_rs_core::error::{GuardianError, ProcessError, RegisterError, SpawnError};
use vllm_rs_core::wire::FailStage;

/// Conversion of a process-core error into the Python exception it raises.
pub trait IntoPyErr {
    /// The exception to raise.
    fn into_pyerr(self) -> PyErr;
}

/// The C library's text for `errno`, without Rust's " (os error N)" suffix.
pub fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// `OSError(errno, message[, filename])`; Python's constructor picks the
/// subclass that matches `errno` itself.
pub fn os_error(errno: i32, message: String, filename: Option<&OsStr>) -> PyErr {
    match filename {
        Some(f) => PyOSError::new_err((errno, message, f.to_os_string())),
        None => PyOSError::new_err((errno, message)),
    }
}

/// The errno behind `err`, also for the few kinds std creates without one.
fn errno_of(err: &io::Error) -> Option<i32> {
    err.raw_os_error().or(match err.kind() {
        io::ErrorKind::TimedOut => Some(libc::ETIMEDOUT),
        io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof => Some(libc::EPIPE),
        io::ErrorKind::ConnectionReset => Some(libc::ECONNRESET),
        _ => None,
    })
}

/// `context: <reason>` as an `OSError` carrying `err`'s errno when it has one.
fn io_error(err: &io::Error, context: &str, filename: Option<&OsStr>) -> PyErr {
    match errno_of(err) {
        Some(errno) => os_error(errno, format!("{context}: {}", strerror(errno)), filename),
        None => PyOSError::new_err(format!("{context}: {err}")),
    }
}

impl IntoPyErr for io::Error {
    fn into_pyerr(self) -> PyErr {
        io_error(&self, "vllm_rs._core", None)
    }
}

impl IntoPyErr for ProcessError {
    fn into_pyerr(self) -> PyErr {
        io_error(&self.source, &format!("cannot {} process {}", self.action, self.pid), None)
    }
}

impl IntoPyErr for GuardianError {
    fn into_pyerr(self) -> PyErr {
        let cause = match &self {
            GuardianError::Start(err) => Some(io_error(err, "cannot start the guardian", None)),
            GuardianError::Io(err) => Some(io_error(err, "talking to the guardian", None)),
            GuardianError::NoAnswer(_) => Some(os_error(libc::ETIMEDOUT, strerror(libc::ETIMEDOUT), None)),
            GuardianError::NotConfigured | GuardianError::ExitedDuringStartup | GuardianError::Died => None,
        };
        let err = PyRuntimeError::new_err(self.to_string());
        Python::attach(|py| err.set_cause(py, cause));
        err
    }
}

impl IntoPyErr for RegisterError {
    fn into_pyerr(self) -> PyErr {
        match self {
            RegisterError::Path { path, source } => io_error(&source, "cannot remove on exit", Some(path.as_os_str())),
            RegisterError::Guardian(err) => err.into_pyerr(),
        }
    }
}

impl IntoPyErr for SpawnError {
    fn into_pyerr(self) -> PyErr {
        match self {
            err @ (SpawnError::EmptyArgv | SpawnError::InvalidArgument(_)) => PyValueError::new_err(err.to_string()),
            err @ SpawnError::BadFd(_) => os_error(libc::EBADF, err.to_string(), None),
            SpawnError::BadCwd { path, source } => {
                io_error(&source, "cannot start the child in this working directory", Some(&path))
            }
            SpawnError::Failed { path, errno, stage, detail } => {
                let reason = strerror(errno);
                let message = match stage {
                    // As `subprocess` does: the bare reason, the program as filename.
                    FailStage::Exec => reason,
                    FailStage::Chdir => format!("changing to the working directory failed: {reason}"),
                    FailStage::Fd => format!("placing inherited fd {detail} failed: {reason}"),
                    FailStage::Fork => format!("fork failed: {reason}"),
                };
                os_error(errno, message, path.as_deref())
            }
            SpawnError::Guardian(err) => err.into_pyerr(),
        }
    }
}
