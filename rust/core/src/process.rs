//! Handles on started children: pid, pid fd, exit status, signals.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::ProcessError;
use crate::supervisor;
use crate::sys::{self, ExitStatus, PollOutcome};

/// A child started through the guardian. Its pid fd names exactly this
/// process, so signals never reach a process that reused its pid; it becomes
/// readable the moment the child exits. The guardian reaps the child, so no
/// zombie is ever left with the caller.
#[derive(Debug)]
pub struct ChildProcess {
    id: u64,
    pid: libc::pid_t,
    pidfd: OwnedFd,
    status: OnceLock<ExitStatus>,
}

impl ChildProcess {
    pub(crate) fn new(id: u64, pid: libc::pid_t, pidfd: OwnedFd) -> Self {
        ChildProcess { id, pid, pidfd, status: OnceLock::new() }
    }

    /// The child's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The pid fd: readable once the child has exited.
    pub fn pidfd(&self) -> RawFd {
        self.pidfd.as_raw_fd()
    }

    /// The exit status if the child has exited, without blocking.
    pub fn try_status(&self) -> Result<Option<ExitStatus>, ProcessError> {
        if let Some(s) = self.status.get() {
            return Ok(Some(*s));
        }
        if !sys::is_readable_now(&self.pidfd).map_err(|e| self.error("poll", e))? {
            return Ok(None);
        }
        self.collect().map(Some)
    }

    /// Waits up to `timeout` (`None`: forever) for the child to exit.
    /// `on_interrupt` runs when a signal interrupts the wait and at least
    /// every `sys::SIGNAL_CHECK_INTERVAL` (see `sys::poll_readable_checking`);
    /// its error ends the wait.
    pub fn wait(
        &self,
        timeout: Option<Duration>,
        on_interrupt: impl FnMut() -> io::Result<()>,
    ) -> Result<Option<ExitStatus>, ProcessError> {
        if let Some(s) = self.status.get() {
            return Ok(Some(*s));
        }
        match sys::poll_readable_checking(&[self.pidfd()], timeout, on_interrupt)
            .map_err(|e| self.error("wait for", e))?
        {
            PollOutcome::TimedOut => Ok(None),
            PollOutcome::Ready(_) => self.collect().map(Some),
        }
    }

    fn collect(&self) -> Result<ExitStatus, ProcessError> {
        let raw = supervisor::collect_exit(self.id).map_err(|e| self.error("collect the exit status of", e))?;
        Ok(*self.status.get_or_init(|| ExitStatus::from_raw(raw)))
    }

    /// Sends `signal` through the pid fd; a no-op once the child has exited.
    pub fn signal(&self, signal: libc::c_int) -> Result<(), ProcessError> {
        if self.status.get().is_some() {
            return Ok(());
        }
        sys::pidfd_send_signal(self.pidfd(), signal).map_err(|e| self.error("signal", e))
    }

    fn error(&self, action: &'static str, source: io::Error) -> ProcessError {
        ProcessError::new(self.pid, action, source)
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        supervisor::forget(self.id);
    }
}
