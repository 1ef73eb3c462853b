//! Thin, safe wrappers over the Linux system calls the core needs.
//!
//! Each wrapper returns `io::Result` and retries on `EINTR` where a retry is
//! always right. Nothing here allocates, so the few that run between `fork`
//! and `exec` stay async-signal-safe.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Converts a `-1` return into the current `errno`.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens a pid fd for `pid`: a handle that names exactly that process, even
/// after its pid is reused.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the kernel returns a new fd we then own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = fd as RawFd;
    set_cloexec(fd)?;
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `signal` through a pid fd. A process that has already exited is
/// not an error: the signal simply has nobody to reach.
pub fn pidfd_send_signal(pidfd: RawFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall with a null siginfo.
    let ret =
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd, signal, std::ptr::null::<libc::siginfo_t>(), 0) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(err);
    }
    Ok(())
}

/// Marks `fd` close-on-exec.
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd; no memory involved.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) })?;
    Ok(())
}

/// True when `fd` is an open descriptor of this process.
pub fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor table.
    fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1
}

/// Duplicates `fd` to the lowest free number at or above `min`, close-on-exec.
pub fn dup_at_least(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd we own.
    let new = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Creates a close-on-exec pipe, returning (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both are fresh descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Result of [`poll_readable`].
pub enum PollOutcome {
    /// Indices (into the given slice) of the fds that are readable or hung up.
    Ready(Vec<usize>),
    /// The timeout passed with nothing ready.
    TimedOut,
}

/// Waits until at least one of `fds` is readable (or hung up / invalid), or
/// `timeout` passes (`None`: wait forever). `on_interrupt` runs whenever a
/// signal interrupts the wait; an error from it ends the wait with that error
/// (this is how Python's `KeyboardInterrupt` gets through).
pub fn poll_readable(
    fds: &[RawFd],
    timeout: Option<Duration>,
    mut on_interrupt: impl FnMut() -> io::Result<()>,
) -> io::Result<PollOutcome> {
    let mut pollfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let wait_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a short timeout still waits rather than spins.
                let ms = left.as_micros().div_ceil(1000);
                ms.min(i32::MAX as u128) as libc::c_int
            }
        };
        // SAFETY: `pollfds` is a valid array of `len` pollfd structs.
        let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                on_interrupt()?;
                continue;
            }
            return Err(err);
        }
        if n > 0 {
            let ready = pollfds.iter().enumerate().filter(|(_, p)| p.revents != 0).map(|(i, _)| i).collect();
            return Ok(PollOutcome::Ready(ready));
        }
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Ok(PollOutcome::TimedOut);
            }
        }
    }
}

/// How often [`poll_readable_checking`] calls its `check`.
pub const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// [`poll_readable`] for a wait that a signal must be able to end:
/// `check` runs on every interruption and at least every
/// [`SIGNAL_CHECK_INTERVAL`], and an error from it ends the wait. A signal
/// interrupts only a poll already under way on the thread that takes it.
/// One handled just before the poll began, or taken by another thread
/// (Python notes it for the main thread in both cases), would otherwise
/// leave the wait blocked until the timeout, or forever without one.
pub fn poll_readable_checking(
    fds: &[RawFd],
    timeout: Option<Duration>,
    mut check: impl FnMut() -> io::Result<()>,
) -> io::Result<PollOutcome> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let slice = deadline
            .map_or(SIGNAL_CHECK_INTERVAL, |d| d.saturating_duration_since(Instant::now()).min(SIGNAL_CHECK_INTERVAL));
        if let PollOutcome::Ready(ready) = poll_readable(fds, Some(slice), &mut check)? {
            return Ok(PollOutcome::Ready(ready));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(PollOutcome::TimedOut);
        }
        check()?;
    }
}

/// True when `fd` is readable right now (used on pid fds: readable = exited).
pub fn is_readable_now(fd: &impl AsRawFd) -> io::Result<bool> {
    match poll_readable(&[fd.as_raw_fd()], Some(Duration::ZERO), || Ok(()))? {
        PollOutcome::Ready(_) => Ok(true),
        PollOutcome::TimedOut => Ok(false),
    }
}

/// Reads the pids listed in `/proc/<pid>/task/*/children`: the live and
/// zombie children of every thread of `pid`. A vanished process has none.
pub fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path().join("children");
        if let Ok(text) = std::fs::read_to_string(path) {
            out.extend(text.split_ascii_whitespace().filter_map(|s| s.parse::<libc::pid_t>().ok()));
        }
    }
    out
}

/// Decoded `waitpid` status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl ExitStatus {
    /// Decodes a raw `waitpid` status word.
    pub fn from_raw(status: libc::c_int) -> Self {
        if libc::WIFSIGNALED(status) {
            ExitStatus::Signal(libc::WTERMSIG(status))
        } else {
            ExitStatus::Code(libc::WEXITSTATUS(status))
        }
    }

    /// `multiprocessing`'s exit code: the code, or minus the signal number.
    pub fn exitcode(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => -s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe (read end, write end): not readable until written to.
    fn quiet_pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
        // SAFETY: both descriptors were just created and are owned here alone.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn a_checking_wait_looks_at_its_signals_while_nothing_happens() {
        let (read, _write) = quiet_pipe();
        let mut checks = 0;
        let outcome = poll_readable_checking(&[read.as_raw_fd()], Some(SIGNAL_CHECK_INTERVAL * 4), || {
            checks += 1;
            Ok(())
        })
        .unwrap();
        assert!(matches!(outcome, PollOutcome::TimedOut));
        assert!(checks >= 3, "checked {checks} times in 4 intervals");
    }

    #[test]
    fn an_error_from_the_check_ends_a_wait_without_a_timeout() {
        let (read, _write) = quiet_pipe();
        let started = Instant::now();
        let err = poll_readable_checking(&[read.as_raw_fd()], None, || Err(io::ErrorKind::Interrupted.into()))
            .err()
            .expect("the check's error ends the wait");
        assert_eq!(err.kind(), io::ErrorKind::Interrupted);
        assert!(started.elapsed() < Duration::from_secs(30), "ended by the check, not by chance");
    }

    #[test]
    fn a_checking_wait_returns_what_is_ready() {
        let (read, write) = quiet_pipe();
        // SAFETY: writes one byte from a valid buffer to an open descriptor.
        assert_eq!(unsafe { libc::write(write.as_raw_fd(), b"x".as_ptr().cast(), 1) }, 1);
        let outcome = poll_readable_checking(&[read.as_raw_fd()], None, || Ok(())).unwrap();
        assert!(matches!(outcome, PollOutcome::Ready(ready) if ready == vec![0]));
    }
}
