//! `kill_process_tree`: SIGKILL a process and every descendant, leaving no
//! survivor even in trees that fork while they are being killed.
//!
//! Design: freeze, then kill. Each process found is first sent SIGSTOP
//! through a pid fd, and only then are its children read. The kernel refuses
//! to complete a fork while a signal is pending for the forking process, so a
//! stopped process cannot add children behind our back; walking again until
//! a pass finds nobody new therefore reaches every descendant. Only then does
//! everyone get SIGKILL, and we wait (bounded) until all have exited.
//!
//! Descendants that detached (double fork plus `setsid`) are re-parented to
//! the nearest subreaper. Every child started by this crate is a subreaper,
//! so for those trees the detached daemons are still below the root and the
//! walk finds them; the guardian catches whatever is left once a child exits.
//! Pid fds make every signal reach exactly the process that was found.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::ProcessError;
use crate::sys::{self, PollOutcome};

/// How long to wait for killed processes to actually exit.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Kills `root` and all its descendants with SIGKILL and waits (at most a
/// few seconds) until they have exited. Returns quietly if `root` is gone.
/// Returns the number of processes signalled. An error names the process
/// that could not be reached or killed.
pub fn kill_process_tree(root: libc::pid_t) -> Result<usize, ProcessError> {
    let root_fd = match sys::pidfd_open(root) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(0),
        Err(e) => return Err(ProcessError::new(root, "open", e)),
    };
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let freeze = |pid: libc::pid_t, fd: &OwnedFd| {
        if pid != me {
            let _ = sys::pidfd_send_signal(fd.as_raw_fd(), libc::SIGSTOP);
        }
    };
    freeze(root, &root_fd);
    let mut found: Vec<(libc::pid_t, OwnedFd)> = vec![(root, root_fd)];
    let mut seen: HashSet<libc::pid_t> = HashSet::from([root]);
    loop {
        let mut added = false;
        let mut i = 0;
        while i < found.len() {
            for child in sys::children_of(found[i].0) {
                if !seen.insert(child) {
                    continue;
                }
                if let Ok(fd) = sys::pidfd_open(child) {
                    freeze(child, &fd);
                    found.push((child, fd));
                    added = true;
                }
            }
            i += 1;
        }
        if !added {
            break;
        }
    }
    for (pid, fd) in &found {
        sys::pidfd_send_signal(fd.as_raw_fd(), libc::SIGKILL).map_err(|e| ProcessError::new(*pid, "kill", e))?;
    }
    wait_all_exited(found.iter().map(|(_, fd)| fd), EXIT_WAIT).map_err(|e| ProcessError::new(root, "wait for", e))?;
    Ok(found.len())
}

/// Waits until every pid fd is readable (its process exited) or `limit` passes.
fn wait_all_exited<'a>(fds: impl Iterator<Item = &'a OwnedFd>, limit: Duration) -> io::Result<()> {
    let mut pending: Vec<i32> = fds.map(|fd| fd.as_raw_fd()).collect();
    let deadline = Instant::now() + limit;
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match sys::poll_readable(&pending, Some(left), || Ok(()))? {
            PollOutcome::TimedOut => break,
            PollOutcome::Ready(ready) => {
                let ready: HashSet<usize> = ready.into_iter().collect();
                pending =
                    pending.into_iter().enumerate().filter(|(i, _)| !ready.contains(i)).map(|(_, fd)| fd).collect();
            }
        }
    }
    Ok(())
}
