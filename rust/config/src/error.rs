//! How the binary fails: a usage error (exit 2, names the flag or key) or a
//! runtime failure (exit 1).

use std::process::ExitCode;

/// A failure that ends the process, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum ExitError {
    /// Bad command line or `--args-json`: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// Anything that goes wrong after the arguments were accepted: exit code 1.
    #[error("{0:#}")]
    Fatal(#[from] anyhow::Error),
}

impl ExitError {
    /// A usage error with this message.
    pub fn usage(message: impl Into<String>) -> Self {
        ExitError::Usage(message.into())
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            ExitError::Usage(_) => ExitCode::from(2),
            ExitError::Fatal(_) => ExitCode::from(1),
        }
    }
}
