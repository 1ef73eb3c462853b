//! The supervising side: starts this process's guardian on first use, sends it
//! spawn requests and collects the exit statuses it reports.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::error::SpawnError;
use crate::process::ChildProcess;
use crate::sys;
use crate::wire::{self, Reply, Request};

/// The fd number the guardian finds its control socket at.
const GUARDIAN_CTRL_FD: RawFd = 3;
/// How long a guardian may take to start and say it is ready.
const GUARDIAN_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to wait for the guardian's report once a child has exited.
const EXIT_REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// What to run to start a guardian; the control fd number and this
/// process's pid are appended as the last two arguments.
static GUARDIAN_COMMAND: Mutex<Vec<OsString>> = Mutex::new(Vec::new());
static GUARDIAN: Mutex<Option<Guardian>> = Mutex::new(None);

/// Sets the command that starts a guardian (see [`crate::guardian`]). The
/// Python package points it at the interpreter plus this extension; Rust
/// tests point it at the `vllm-rs-guardian` binary.
pub fn set_guardian_command(argv: Vec<OsString>) {
    *GUARDIAN_COMMAND.lock().unwrap() = argv;
}

/// What to start: resolved by [`spawn`] into a request for the guardian.
#[derive(Debug, Default, Clone)]
pub struct SpawnSpec {
    /// argv[0] is looked up in `PATH` (of `env` when given) unless it has a `/`.
    pub argv: Vec<OsString>,
    /// The whole environment; `None` inherits this process's.
    pub env: Option<Vec<(OsString, OsString)>>,
    /// Working directory; `None` keeps this process's.
    pub cwd: Option<OsString>,
    /// Fds the child inherits at the same numbers. Stdio (0, 1, 2) are
    /// passed as well when open here.
    pub pass_fds: Vec<RawFd>,
}

struct Guardian {
    owner: libc::pid_t,
    pid: libc::pid_t,
    sock: UnixStream,
    next_id: u64,
    /// Spawn id -> raw wait status, once reported; `None` while running.
    exits: HashMap<u64, Option<i32>>,
    /// Set once the guardian is gone: every unreported child counts as killed.
    dead: bool,
}

fn this_pid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

impl Guardian {
    fn start() -> io::Result<Guardian> {
        let command = GUARDIAN_COMMAND.lock().unwrap().clone();
        if command.is_empty() {
            return Err(io::Error::other("no guardian command configured (vllm_rs._core.set_guardian_command)"));
        }
        let (ours, theirs) = UnixStream::pair()?;
        let owner = this_pid();
        let (tx, rx) = mpsc::channel();
        // The guardian's parent-death signal fires when the *thread* that
        // forked it exits, so fork it from a thread that never exits.
        std::thread::Builder::new().name("vllm-rs-guardian".into()).spawn(move || {
            let their_fd = theirs.as_raw_fd();
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..])
                .arg(GUARDIAN_CTRL_FD.to_string())
                .arg(owner.to_string())
                .stdin(Stdio::null());
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    sys::cvt(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0))?;
                    if libc::getppid() != owner {
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    if their_fd == GUARDIAN_CTRL_FD {
                        sys::cvt(libc::fcntl(their_fd, libc::F_SETFD, 0))?;
                    } else {
                        sys::cvt(libc::dup2(their_fd, GUARDIAN_CTRL_FD))?;
                    }
                    // Nothing else of ours (or fds others leaked to us) goes along.
                    libc::syscall(libc::SYS_close_range, GUARDIAN_CTRL_FD as u32 + 1, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
                    Ok(())
                });
            }
            let started = cmd.spawn().map(|child| child.id() as libc::pid_t);
            drop(theirs);
            let _ = tx.send(started);
            loop {
                std::thread::park();
            }
        })?;
        let pid = rx.recv().map_err(|_| io::Error::other("guardian launcher thread died"))??;
        let mut guardian = Guardian { owner, pid, sock: ours, next_id: 1, exits: HashMap::new(), dead: false };
        match guardian.read_reply(Some(GUARDIAN_START_TIMEOUT))? {
            Some((Reply::Ready { .. }, _)) => Ok(guardian),
            Some((other, _)) => Err(io::Error::other(format!("guardian sent {other:?} before it was ready"))),
            None => {
                guardian.mark_dead();
                Err(io::Error::other("the guardian process exited during start-up"))
            }
        }
    }

    /// Reads one reply, recording exit reports. `Ok(None)`: the guardian is gone
    /// (or did not answer in time).
    fn read_reply(&mut self, timeout: Option<Duration>) -> io::Result<Option<(Reply, Vec<OwnedFd>)>> {
        if self.dead {
            return Ok(None);
        }
        if let sys::PollOutcome::TimedOut = sys::poll_readable(&[self.sock.as_raw_fd()], timeout, || Ok(()))? {
            return Ok(None);
        }
        let Some((body, fds)) = wire::recv(&self.sock).or_else(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => Ok(None),
            _ => Err(e),
        })?
        else {
            self.mark_dead();
            return Ok(None);
        };
        let reply = Reply::decode(&body)?;
        if let Reply::Exited { id, status } = reply {
            if let Some(slot) = self.exits.get_mut(&id) {
                *slot = Some(status);
            }
        }
        Ok(Some((reply, fds)))
    }

    fn mark_dead(&mut self) {
        self.dead = true;
        let mut status = 0;
        // SAFETY: reaping our own child, the guardian, if it has exited.
        unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
    }

    fn spawn(&mut self, request: Request, fds: &[RawFd]) -> Result<(u64, libc::pid_t, OwnedFd), SpawnError> {
        let Request::Spawn { id, .. } = request;
        self.exits.insert(id, None);
        let sent = wire::send(&self.sock, &request.encode(), fds);
        if let Err(err) = sent {
            self.exits.remove(&id);
            return Err(SpawnError::Guardian(err));
        }
        loop {
            match self.read_reply(None) {
                Ok(Some((Reply::Spawned { id: got, pid }, fds))) if got == id => {
                    let pidfd = fds.into_iter().next().ok_or_else(|| {
                        SpawnError::Guardian(io::Error::other("guardian sent no pid fd"))
                    })?;
                    return Ok((id, pid, pidfd));
                }
                Ok(Some((Reply::Failed { id: got, errno, stage, detail }, _))) if got == id => {
                    self.exits.remove(&id);
                    return Err(SpawnError::Failed { errno, stage, detail });
                }
                Ok(Some(_)) => continue,
                Ok(None) => {
                    self.exits.remove(&id);
                    return Err(SpawnError::Guardian(io::Error::other("the guardian process died")));
                }
                Err(err) => {
                    self.exits.remove(&id);
                    return Err(SpawnError::Guardian(err));
                }
            }
        }
    }
}

fn with_guardian<T>(f: impl FnOnce(&mut Guardian) -> Result<T, SpawnError>) -> Result<T, SpawnError> {
    let mut slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    let stale = match slot.as_ref() {
        None => true,
        // After a fork the inherited guardian belongs to the parent.
        Some(g) => g.owner != this_pid() || g.dead,
    };
    if stale {
        *slot = Some(Guardian::start().map_err(SpawnError::Guardian)?);
    }
    f(slot.as_mut().unwrap())
}

/// Resolves argv[0] the way `subprocess` does: as given when it holds a `/`,
/// else the first executable match on the `PATH` of the child's environment.
fn resolve_program(spec: &SpawnSpec) -> Result<OsString, SpawnError> {
    use std::os::unix::ffi::OsStrExt;
    let name = spec.argv.first().ok_or(SpawnError::EmptyArgv)?;
    if name.as_bytes().contains(&b'/') {
        return Ok(name.clone());
    }
    let path = match &spec.env {
        Some(env) => env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()),
        None => std::env::var_os("PATH"),
    }
    .unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    let mut denied = false;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        let Ok(c) = std::ffi::CString::new(candidate.as_os_str().as_bytes()) else { continue };
        // SAFETY: access(2) on a NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 && candidate.is_file() {
            return Ok(candidate.into_os_string());
        }
        denied |= candidate.is_file();
    }
    Err(SpawnError::Failed {
        errno: if denied { libc::EACCES } else { libc::ENOENT },
        stage: wire::FailStage::Exec,
        detail: -1,
    })
}

/// Starts a child through this process's guardian. The child inherits exactly
/// `pass_fds` (plus open stdio), dies when this process dies, and takes its
/// descendants with it. Exec failures come back as errors, with nothing left
/// running.
pub fn spawn(spec: &SpawnSpec) -> Result<ChildProcess, SpawnError> {
    use std::os::unix::ffi::OsStrExt;
    let program = resolve_program(spec)?;
    for &fd in &spec.pass_fds {
        if !sys::fd_is_open(fd) {
            return Err(SpawnError::BadFd(fd));
        }
    }
    if let Some(cwd) = &spec.cwd {
        if !std::path::Path::new(cwd).is_dir() {
            return Err(SpawnError::BadCwd(cwd.clone()));
        }
    }
    let mut targets: Vec<RawFd> = (0..3).filter(|fd| !spec.pass_fds.contains(fd) && sys::fd_is_open(*fd)).collect();
    targets.extend(spec.pass_fds.iter().copied());
    let env: Vec<Vec<u8>> = match &spec.env {
        Some(env) => env.iter().map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()).collect(),
        None => std::env::vars_os().map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()).collect(),
    };
    let cwd = spec.cwd.as_ref().map(|c| c.as_bytes().to_vec());
    let argv: Vec<Vec<u8>> = spec.argv.iter().map(|a| a.as_bytes().to_vec()).collect();
    let (id, pid, pidfd) = with_guardian(|g| {
        let id = g.next_id;
        g.next_id += 1;
        let request = Request::Spawn {
            id,
            program: program.as_bytes().to_vec(),
            argv,
            env,
            cwd,
            fd_targets: targets.clone(),
        };
        g.spawn(request, &targets)
    })?;
    Ok(ChildProcess::new(id, pid, pidfd))
}

/// Raw wait status of spawn `id`, which has exited (its pid fd is readable).
/// Waits briefly for the guardian's report; a guardian that has died counts
/// its unreported children as SIGKILLed, which is what its death did to them.
pub(crate) fn collect_exit(id: u64) -> io::Result<i32> {
    let mut slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(g) = slot.as_mut().filter(|g| g.owner == this_pid()) else {
        return Ok(libc::SIGKILL);
    };
    let deadline = std::time::Instant::now() + EXIT_REPORT_TIMEOUT;
    loop {
        match g.exits.get(&id) {
            Some(Some(status)) => {
                let status = *status;
                g.exits.remove(&id);
                return Ok(status);
            }
            None => return Ok(libc::SIGKILL),
            Some(None) => {}
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if g.read_reply(Some(left))?.is_none() {
            if g.dead {
                g.exits.remove(&id);
                return Ok(libc::SIGKILL);
            }
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the guardian did not report an exited child"));
        }
    }
}

/// Drops the bookkeeping of spawn `id` (its handle is gone).
pub(crate) fn forget(id: u64) {
    let mut slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = slot.as_mut() {
        g.exits.remove(&id);
    }
}

/// Pid of this process's guardian, if one is running.
pub fn guardian_pid() -> Option<libc::pid_t> {
    let slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    slot.as_ref().filter(|g| g.owner == this_pid() && !g.dead).map(|g| g.pid)
}
