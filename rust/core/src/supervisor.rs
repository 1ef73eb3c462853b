//! The supervising side: starts this process's guardian on first use, sends it
//! spawn requests and collects the exit statuses it reports.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::error::{GuardianError, RegisterError, SpawnError};
use crate::process::ChildProcess;
use crate::sys;
use crate::wire::{self, Reply, Request};

/// The fd number the guardian finds its control socket at.
const GUARDIAN_CTRL_FD: RawFd = 3;
/// How long a guardian may take to start and say it is ready.
const GUARDIAN_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to wait for the guardian's report once a child has exited.
const EXIT_REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the guardian may take to acknowledge a (cancelled) registration:
/// it answers at once, so only a starved machine comes near this.
const ACK_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// Spawn id -> outcome of a request sent but not yet claimed.
    outcomes: HashMap<u64, Result<(libc::pid_t, OwnedFd), SpawnError>>,
    /// Ids of registrations acknowledged but not yet claimed.
    acks: HashSet<u64>,
    /// Set once the guardian is gone: every unreported child counts as killed.
    dead: bool,
}

fn this_pid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

impl Guardian {
    fn start() -> Result<Guardian, GuardianError> {
        let command = GUARDIAN_COMMAND.lock().unwrap().clone();
        if command.is_empty() {
            return Err(GuardianError::NotConfigured);
        }
        let (ours, theirs) = UnixStream::pair().map_err(GuardianError::Start)?;
        let owner = this_pid();
        let (tx, rx) = mpsc::channel();
        // The guardian's parent-death signal fires when the *thread* that
        // forked it exits, so fork it from a thread that never exits.
        std::thread::Builder::new()
            .name("vllm-rs-guardian".into())
            .spawn(move || {
                let their_fd = theirs.as_raw_fd();
                let mut cmd = Command::new(&command[0]);
                cmd.args(&command[1..]).arg(GUARDIAN_CTRL_FD.to_string()).arg(owner.to_string()).stdin(Stdio::null());
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
                        libc::syscall(
                            libc::SYS_close_range,
                            GUARDIAN_CTRL_FD as u32 + 1,
                            u32::MAX,
                            libc::CLOSE_RANGE_CLOEXEC,
                        );
                        Ok(())
                    });
                }
                let started = cmd.spawn().map(|child| child.id() as libc::pid_t);
                drop(theirs);
                let _ = tx.send(started);
                loop {
                    std::thread::park();
                }
            })
            .map_err(GuardianError::Start)?;
        let pid = rx
            .recv()
            .map_err(|_| GuardianError::Start(io::Error::other("the guardian launcher thread died")))?
            .map_err(GuardianError::Start)?;
        let mut guardian = Guardian {
            owner,
            pid,
            sock: ours,
            next_id: 1,
            exits: HashMap::new(),
            outcomes: HashMap::new(),
            acks: HashSet::new(),
            dead: false,
        };
        match guardian.read_reply(Some(GUARDIAN_START_TIMEOUT))? {
            Some((Reply::Ready { .. }, _)) => Ok(guardian),
            Some((other, _)) => {
                Err(GuardianError::Io(io::Error::other(format!("guardian sent {other:?} before it was ready"))))
            }
            None if guardian.dead => Err(GuardianError::ExitedDuringStartup),
            None => Err(GuardianError::NoAnswer(GUARDIAN_START_TIMEOUT)),
        }
    }

    /// Reads one reply, recording exit reports. `Ok(None)`: the guardian is gone
    /// (or did not answer in time).
    fn read_reply(&mut self, timeout: Option<Duration>) -> io::Result<Option<(Reply, Vec<OwnedFd>)>> {
        if self.dead {
            return Ok(None);
        }
        // Without a timeout the blocking read itself waits.
        if timeout.is_some() {
            if let sys::PollOutcome::TimedOut = sys::poll_readable(&[self.sock.as_raw_fd()], timeout, || Ok(()))? {
                return Ok(None);
            }
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
        match reply {
            Reply::Exited { id, status } => {
                if let Some(slot) = self.exits.get_mut(&id) {
                    *slot = Some(status);
                }
            }
            Reply::Spawned { id, pid } => {
                let outcome = fds
                    .into_iter()
                    .next()
                    .map(|pidfd| (pid, pidfd))
                    .ok_or_else(|| SpawnError::Guardian(io::Error::other("guardian sent no pid fd").into()));
                self.outcomes.insert(id, outcome);
                return Ok(Some((reply, Vec::new())));
            }
            Reply::Failed { id, errno, stage, detail } => {
                self.exits.remove(&id);
                self.outcomes.insert(id, Err(SpawnError::Failed { path: None, errno, stage, detail }));
            }
            Reply::Acknowledged { id } => {
                self.acks.insert(id);
            }
            Reply::Ready { .. } => {}
        }
        Ok(Some((reply, fds)))
    }

    fn mark_dead(&mut self) {
        self.dead = true;
        let mut status = 0;
        // SAFETY: reaping our own child, the guardian, if it has exited.
        unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
    }

    /// Sends one spawn request; its outcome is claimed with [`Self::await_spawn`].
    fn send_spawn(&mut self, request: &Request, fds: &[RawFd]) -> Result<(), SpawnError> {
        let Request::Spawn { id, .. } = request else {
            unreachable!("send_spawn takes spawn requests");
        };
        self.exits.insert(*id, None);
        wire::send(&self.sock, &request.encode(), fds).map_err(|err| {
            self.exits.remove(id);
            SpawnError::Guardian(err.into())
        })
    }

    /// Waits for the outcome of spawn `id` (reading, and keeping, whatever
    /// else the guardian reports meanwhile).
    fn await_spawn(&mut self, id: u64) -> Result<(libc::pid_t, OwnedFd), SpawnError> {
        loop {
            if let Some(outcome) = self.outcomes.remove(&id) {
                return outcome;
            }
            match self.read_reply(None) {
                Ok(Some(_)) => continue,
                Ok(None) => {
                    self.exits.remove(&id);
                    return Err(SpawnError::Guardian(GuardianError::Died));
                }
                Err(err) => {
                    self.exits.remove(&id);
                    return Err(SpawnError::Guardian(err.into()));
                }
            }
        }
    }

    /// Sends a registration request and waits until the guardian has acted on it.
    fn request_acknowledged(&mut self, request: &Request, id: u64) -> Result<(), GuardianError> {
        wire::send(&self.sock, &request.encode(), &[])?;
        let deadline = std::time::Instant::now() + ACK_TIMEOUT;
        while !self.acks.remove(&id) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.read_reply(Some(left))?.is_none() {
                return Err(if self.dead { GuardianError::Died } else { GuardianError::NoAnswer(ACK_TIMEOUT) });
            }
        }
        Ok(())
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

/// True when `slot` holds no guardian this process can use: none yet, a dead
/// one, or (after a fork) the parent's.
fn is_stale(slot: &Option<Guardian>) -> bool {
    match slot {
        None => true,
        Some(g) => g.owner != this_pid() || g.dead,
    }
}

fn with_guardian<T, E: From<GuardianError>>(f: impl FnOnce(&mut Guardian) -> Result<T, E>) -> Result<T, E> {
    let mut slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    if is_stale(&slot) {
        *slot = Some(Guardian::start()?);
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
        path: Some(name.clone()),
        errno: if denied { libc::EACCES } else { libc::ENOENT },
        stage: wire::FailStage::Exec,
        detail: -1,
    })
}

/// A spawn request ready to send: everything checked and encoded but the id.
struct Prepared {
    program: Vec<u8>,
    argv: Vec<Vec<u8>>,
    env: Vec<Vec<u8>>,
    cwd: Option<Vec<u8>>,
    targets: Vec<RawFd>,
}

/// Rejects what exec cannot carry: NUL bytes anywhere, `=` in an env name.
fn check_exec_strings(spec: &SpawnSpec) -> Result<(), SpawnError> {
    use std::os::unix::ffi::OsStrExt;
    let nul = |s: &OsString| s.as_bytes().contains(&0);
    if let Some(i) = spec.argv.iter().position(nul) {
        return Err(SpawnError::InvalidArgument(format!("argv[{i}] contains a NUL byte")));
    }
    for (key, value) in spec.env.iter().flatten() {
        if nul(key) || nul(value) {
            return Err(SpawnError::InvalidArgument(format!("environment variable {key:?} contains a NUL byte")));
        }
        if key.is_empty() || key.as_bytes().contains(&b'=') {
            return Err(SpawnError::InvalidArgument(format!("illegal environment variable name {key:?}")));
        }
    }
    if spec.cwd.as_ref().is_some_and(nul) {
        return Err(SpawnError::InvalidArgument("the working directory contains a NUL byte".into()));
    }
    Ok(())
}

fn prepare(spec: &SpawnSpec) -> Result<Prepared, SpawnError> {
    use std::os::unix::ffi::OsStrExt;
    check_exec_strings(spec)?;
    let program = resolve_program(spec)?;
    for &fd in &spec.pass_fds {
        if !sys::fd_is_open(fd) {
            return Err(SpawnError::BadFd(fd));
        }
    }
    if let Some(cwd) = &spec.cwd {
        let not_dir = || io::Error::from_raw_os_error(libc::ENOTDIR);
        match std::fs::metadata(cwd) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(SpawnError::BadCwd { path: cwd.clone(), source: not_dir() }),
            Err(source) => return Err(SpawnError::BadCwd { path: cwd.clone(), source }),
        }
    }
    let mut targets: Vec<RawFd> = (0..3).filter(|fd| !spec.pass_fds.contains(fd) && sys::fd_is_open(*fd)).collect();
    targets.extend(spec.pass_fds.iter().copied());
    let pair = |k: &OsString, v: &OsString| [k.as_bytes(), b"=", v.as_bytes()].concat();
    let env = match &spec.env {
        Some(env) => env.iter().map(|(k, v)| pair(k, v)).collect(),
        None => std::env::vars_os().map(|(k, v)| pair(&k, &v)).collect(),
    };
    Ok(Prepared {
        program: program.as_bytes().to_vec(),
        argv: spec.argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        env,
        cwd: spec.cwd.as_ref().map(|c| c.as_bytes().to_vec()),
        targets,
    })
}

/// Requests in flight at once in [`spawn_many`]: enough to keep the guardian
/// busy, few enough that replies never fill the socket buffer.
const SPAWN_WINDOW: usize = 32;

/// Starts a child through this process's guardian. The child inherits exactly
/// `pass_fds` (plus open stdio), dies when this process dies, and takes its
/// descendants with it. Exec failures come back as errors, with nothing left
/// running.
pub fn spawn(spec: &SpawnSpec) -> Result<ChildProcess, SpawnError> {
    spawn_many(std::slice::from_ref(spec)).pop().expect("one outcome per spec")
}

/// Starts several children, pipelining the requests to the guardian so that
/// it starts one child while the next request is on its way. One outcome per
/// spec, in order; a failed spec does not stop the others.
pub fn spawn_many(specs: &[SpawnSpec]) -> Vec<Result<ChildProcess, SpawnError>> {
    let mut outcomes: Vec<Option<Result<ChildProcess, SpawnError>>> = specs.iter().map(|_| None).collect();
    let mut ready: Vec<(usize, Prepared)> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        match prepare(spec) {
            Ok(prepared) => ready.push((index, prepared)),
            Err(err) => outcomes[index] = Some(Err(err)),
        }
    }
    let started = with_guardian(|g| {
        let mut in_flight: std::collections::VecDeque<(usize, u64)> = std::collections::VecDeque::new();
        let mut done: Vec<(usize, Result<ChildProcess, SpawnError>)> = Vec::new();
        let claim = |g: &mut Guardian, (index, id): (usize, u64), done: &mut Vec<_>| {
            let outcome = g.await_spawn(id).map(|(pid, pidfd)| ChildProcess::new(id, pid, pidfd));
            done.push((index, outcome));
        };
        for (index, prepared) in ready.drain(..) {
            if in_flight.len() == SPAWN_WINDOW {
                let next = in_flight.pop_front().unwrap();
                claim(g, next, &mut done);
            }
            let id = g.take_id();
            let request = Request::Spawn {
                id,
                program: prepared.program,
                argv: prepared.argv,
                env: prepared.env,
                cwd: prepared.cwd,
                fd_targets: prepared.targets.clone(),
            };
            match g.send_spawn(&request, &prepared.targets) {
                Ok(()) => in_flight.push_back((index, id)),
                Err(err) => done.push((index, Err(err))),
            }
        }
        while let Some(next) = in_flight.pop_front() {
            claim(g, next, &mut done);
        }
        Ok(done)
    });
    match started {
        Ok(done) => {
            for (index, outcome) in done {
                outcomes[index] = Some(outcome);
            }
        }
        Err(err) => {
            for slot in outcomes.iter_mut().filter(|o| o.is_none()) {
                *slot = Some(Err(SpawnError::Guardian(replicate(&err))));
            }
        }
    }
    outcomes
        .into_iter()
        .zip(specs)
        .map(|(outcome, spec)| outcome.expect("every spec has an outcome").map_err(|err| name_failure(err, spec)))
        .collect()
}

/// Fills in what a failure reported by the guardian was about.
fn name_failure(err: SpawnError, spec: &SpawnSpec) -> SpawnError {
    match err {
        SpawnError::Failed { path: None, errno, stage, detail } => {
            let path = match stage {
                wire::FailStage::Exec => spec.argv.first().cloned(),
                wire::FailStage::Chdir => spec.cwd.clone(),
                wire::FailStage::Fd | wire::FailStage::Fork => None,
            };
            SpawnError::Failed { path, errno, stage, detail }
        }
        other => other,
    }
}

/// The same guardian failure again, for each spawn it stopped.
fn replicate(err: &GuardianError) -> GuardianError {
    let io_again = |e: &io::Error| match e.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(e.kind(), e.to_string()),
    };
    match err {
        GuardianError::NotConfigured => GuardianError::NotConfigured,
        GuardianError::Start(e) => GuardianError::Start(io_again(e)),
        GuardianError::ExitedDuringStartup => GuardianError::ExitedDuringStartup,
        GuardianError::Died => GuardianError::Died,
        GuardianError::Io(e) => GuardianError::Io(io_again(e)),
        GuardianError::NoAnswer(after) => GuardianError::NoAnswer(*after),
    }
}

/// `path` made absolute (not resolved: symlinks on the way stay as they are).
fn absolute(path: &Path) -> Result<PathBuf, RegisterError> {
    std::path::absolute(path).map_err(|source| RegisterError::Path { path: path.to_path_buf(), source })
}

/// Has the guardian remove `path` once this process is gone, however it ends
/// (SIGKILL included), provided the path still names the same file or
/// directory then; see [`crate::removal`] for what happens to a directory.
/// Returns once the guardian has acknowledged the registration, so a SIGKILL
/// right after this returns still removes the path.
pub fn remove_on_exit(path: &Path) -> Result<(), RegisterError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::symlink_metadata(path).map_err(|source| RegisterError::Path { path: path.to_path_buf(), source })?;
    let path = absolute(path)?;
    with_guardian(|g| {
        let id = g.take_id();
        let path = path.as_os_str().as_bytes().to_vec();
        let file_type = meta.mode() & libc::S_IFMT;
        let request = Request::RemoveOnExit { id, path, dev: meta.dev(), ino: meta.ino(), file_type };
        Ok(g.request_acknowledged(&request, id)?)
    })
}

/// Undoes [`remove_on_exit`] for `path` (for a caller that removes the path
/// itself on a clean exit). A no-op when this process has no guardian (then
/// nothing is registered); returns once the guardian has acknowledged.
pub fn cancel_remove_on_exit(path: &Path) -> Result<(), RegisterError> {
    use std::os::unix::ffi::OsStrExt;
    let path = absolute(path)?;
    let mut slot = GUARDIAN.lock().unwrap_or_else(|p| p.into_inner());
    if is_stale(&slot) {
        return Ok(());
    }
    let g = slot.as_mut().unwrap();
    let id = g.take_id();
    let request = Request::CancelRemoveOnExit { id, path: path.as_os_str().as_bytes().to_vec() };
    Ok(g.request_acknowledged(&request, id)?)
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
