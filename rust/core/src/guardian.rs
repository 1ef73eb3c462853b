//! The guardian: the one process that owns every child a supervisor starts.
//!
//! Why a separate process: a child must die with the process that started it
//! even when that process is SIGKILLed, and so must the child's own
//! descendants, including ones that double-forked and called `setsid`. A
//! parent-death signal alone only reaches direct children, and orphans are
//! otherwise adopted by init, out of reach. So each supervising process gets
//! one small guardian that
//!
//! * is a child subreaper (`PR_SET_CHILD_SUBREAPER`): any orphaned
//!   descendant of the children it starts is re-parented to it, never to init;
//! * has a parent-death signal (SIGTERM) tied to a thread of the supervisor
//!   that lives as long as the supervisor, and also watches its control
//!   socket: either one firing means the supervisor is gone;
//! * forks and execs every child itself (each child is a subreaper too, so a
//!   child's detached daemons stay in that child's subtree while it lives, and
//!   gets SIGKILL as its own parent-death signal);
//! * reaps every child and reports its wait status, so the supervisor never
//!   holds a zombie;
//! * SIGKILLs any process re-parented to it that is not a live child it
//!   started (those are leftovers of a child that has exited), and when the
//!   supervisor goes, SIGKILLs everything below it until nothing is left,
//!   then removes the paths registered with `remove_on_exit` (see
//!   [`crate::removal`]).
//!
//! Whatever the supervisor sent is handled before the guardian acts on its
//! death or on a SIGTERM: every request still queued on the control socket is
//! read first, so a registration the supervisor made just before it was
//! killed still counts.
//!
//! cgroups would also do, but are not writable in most containers; process
//! groups are escaped by `setsid`. The subreaper works everywhere on Linux.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::removal::RemovalList;
use crate::sys::{self, cvt};
use crate::wire::{self, FailStage, Reply, Request};

/// Signals the guardian takes through its signalfd instead of handlers.
const HANDLED: [libc::c_int; 2] = [libc::SIGCHLD, libc::SIGTERM];
/// Signals the guardian keeps blocked: a Ctrl-C or hang-up aimed at the
/// terminal's process group must not take it down before its children.
const SHIELDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Runs the guardian on the control socket `ctrl_fd` for the supervisor
/// `supervisor_pid`. Never returns: the process exits once the supervisor is
/// gone and every descendant has been killed and reaped.
pub fn run(ctrl_fd: RawFd, supervisor_pid: libc::pid_t) -> ! {
    let mut removals = RemovalList::default();
    match Guardian::new(ctrl_fd, supervisor_pid) {
        Ok(mut g) => {
            if let Err(err) = g.serve() {
                eprintln!("vllm-rs guardian: {err}; killing every child");
            }
            // However serving ended, what the supervisor sent still counts.
            g.drain_requests();
            removals = std::mem::take(&mut g.removals);
        }
        Err(err) => eprintln!("vllm-rs guardian: {err}; killing every child"),
    }
    kill_everything();
    for kept in removals.remove_all() {
        eprintln!("vllm-rs guardian: {kept}");
    }
    // SAFETY: _exit never returns and skips the host interpreter's teardown.
    unsafe { libc::_exit(0) }
}

struct Guardian {
    ctrl: UnixStream,
    signals: OwnedFd,
    me: libc::pid_t,
    /// Live children started on request: pid -> spawn id.
    children: HashMap<libc::pid_t, u64>,
    /// Paths to remove once the supervisor is gone.
    removals: RemovalList,
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise the set in place.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

impl Guardian {
    fn new(ctrl_fd: RawFd, supervisor_pid: libc::pid_t) -> io::Result<Self> {
        // SAFETY: prctl/getpid/sigprocmask/signalfd on this process only.
        unsafe {
            cvt(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))?;
            let blocked = sigset(&[&HANDLED[..], &SHIELDED[..]].concat());
            cvt(libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()))?;
            let handled = sigset(&HANDLED);
            let sfd = cvt(libc::signalfd(-1, &handled, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK))?;
            sys::set_cloexec(ctrl_fd)?;
            let g = Guardian {
                ctrl: UnixStream::from_raw_fd(ctrl_fd),
                signals: OwnedFd::from_raw_fd(sfd),
                me: libc::getpid(),
                children: HashMap::new(),
                removals: RemovalList::default(),
            };
            // The parent-death signal was armed before exec; if the
            // supervisor died before that, we were re-parented already.
            if libc::getppid() != supervisor_pid {
                return Err(io::Error::other("the supervising process exited during start-up"));
            }
            Ok(g)
        }
    }

    fn serve(&mut self) -> io::Result<()> {
        wire::send(&self.ctrl, &Reply::Ready { pid: self.me }.encode(), &[])?;
        let watched = [self.ctrl.as_raw_fd(), self.signals.as_raw_fd()];
        loop {
            let ready = match sys::poll_readable(&watched, None, || Ok(()))? {
                sys::PollOutcome::Ready(ready) => ready,
                sys::PollOutcome::TimedOut => continue,
            };
            // A request before a signal: what the supervisor sent before it
            // died must take effect before we act on its death.
            if ready.contains(&0) {
                match wire::recv(&self.ctrl)? {
                    None => return Ok(()), // the supervisor closed its end: it is gone
                    Some((body, fds)) => match Request::decode(&body) {
                        Ok(req) => self.handle(req, fds)?,
                        Err(err) => eprintln!("vllm-rs guardian: ignoring a bad request: {err}"),
                    },
                }
            }
            if ready.contains(&1) && self.drain_signals()? {
                return Ok(()); // SIGTERM: the supervisor died, or someone asked us to stop.
            }
        }
    }

    /// Handles every request still queued on the control socket, without
    /// waiting for more: registrations take effect, spawns are dropped (the
    /// guardian is about to kill everything it started). Runs once serving
    /// has ended, so failures only end the draining.
    fn drain_requests(&mut self) {
        let ctrl = [self.ctrl.as_raw_fd()];
        while let Ok(sys::PollOutcome::Ready(_)) = sys::poll_readable(&ctrl, Some(Duration::ZERO), || Ok(())) {
            let Ok(Some((body, fds))) = wire::recv(&self.ctrl) else {
                return; // closed, or cut off mid-message by the supervisor's death
            };
            match Request::decode(&body) {
                Ok(Request::Spawn { .. }) => {}
                // The acknowledgement has nobody to reach if the supervisor is dead.
                Ok(req) => {
                    let _ = self.handle(req, fds);
                }
                Err(err) => eprintln!("vllm-rs guardian: ignoring a bad request: {err}"),
            }
        }
    }

    /// Reads pending signals; reaps children on SIGCHLD. True on SIGTERM.
    fn drain_signals(&mut self) -> io::Result<bool> {
        let mut terminate = false;
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        loop {
            // SAFETY: reading whole siginfo records into a struct of that size.
            let n = unsafe { libc::read(self.signals.as_raw_fd(), &mut info as *mut _ as *mut libc::c_void, size) };
            if n == size as isize {
                terminate |= info.ssi_signo == libc::SIGTERM as u32;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                _ if n >= 0 => break,
                io::ErrorKind::WouldBlock => break,
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        }
        if !terminate {
            self.reap()?;
        }
        Ok(terminate)
    }

    /// Reaps every exited child, reports the ones we started, then kills
    /// whatever else has been re-parented to us (leftovers of exited children).
    fn reap(&mut self) -> io::Result<()> {
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out-pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if let Some(id) = self.children.remove(&pid) {
                wire::send(&self.ctrl, &Reply::Exited { id, status }.encode(), &[])?;
            }
        }
        for pid in sys::children_of(self.me) {
            if !self.children.contains_key(&pid) {
                // SAFETY: `pid` is our own unreaped child, so it cannot have been reused.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        Ok(())
    }

    fn handle(&mut self, req: Request, fds: Vec<OwnedFd>) -> io::Result<()> {
        let as_path = |bytes: Vec<u8>| PathBuf::from(std::ffi::OsString::from_vec(bytes));
        let (id, program, argv, env, cwd, fd_targets) = match req {
            Request::Spawn { id, program, argv, env, cwd, fd_targets } => (id, program, argv, env, cwd, fd_targets),
            Request::RemoveOnExit { id, path, dev, ino, file_type } => {
                self.removals.register(as_path(path), dev, ino, file_type);
                return wire::send(&self.ctrl, &Reply::Acknowledged { id }.encode(), &[]);
            }
            Request::CancelRemoveOnExit { id, path } => {
                self.removals.cancel(&as_path(path));
                return wire::send(&self.ctrl, &Reply::Acknowledged { id }.encode(), &[]);
            }
        };
        let reply = match spawn_child(&program, &argv, &env, cwd.as_deref(), &fd_targets, &fds) {
            Ok((pid, pidfd)) => {
                self.children.insert(pid, id);
                wire::send(&self.ctrl, &Reply::Spawned { id, pid }.encode(), &[pidfd.as_raw_fd()])?;
                return Ok(());
            }
            Err((errno, stage, detail)) => Reply::Failed { id, errno, stage, detail },
        };
        wire::send(&self.ctrl, &reply.encode(), &[])
    }
}

type SpawnFailure = (i32, FailStage, i32);

fn cstring(bytes: &[u8]) -> Result<CString, SpawnFailure> {
    CString::new(bytes.to_vec()).map_err(|_| (libc::EINVAL, FailStage::Exec, -1))
}

fn os_failure(err: io::Error, stage: FailStage, detail: i32) -> SpawnFailure {
    (err.raw_os_error().unwrap_or(libc::EIO), stage, detail)
}

/// Forks and execs one child. Everything the child needs is prepared before
/// `fork`, so the child runs only async-signal-safe system calls.
fn spawn_child(
    program: &[u8],
    argv: &[Vec<u8>],
    env: &[Vec<u8>],
    cwd: Option<&[u8]>,
    targets: &[RawFd],
    fds: &[OwnedFd],
) -> Result<(libc::pid_t, OwnedFd), SpawnFailure> {
    if targets.len() != fds.len() {
        return Err((libc::EBADF, FailStage::Fd, -1));
    }
    let program = cstring(program)?;
    let argv: Vec<CString> = argv.iter().map(|a| cstring(a)).collect::<Result<_, _>>()?;
    let env: Vec<CString> = env.iter().map(|e| cstring(e)).collect::<Result<_, _>>()?;
    let cwd = cwd.map(cstring).transpose()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());

    // Move every fd the child must place, and the error pipe, above all
    // targets so that no dup2 onto a target can clobber one not yet placed.
    let high = targets.iter().copied().chain(fds.iter().map(|f| f.as_raw_fd())).max().unwrap_or(2).max(2) + 1;
    let staged: Vec<OwnedFd> = fds
        .iter()
        .map(|f| sys::dup_at_least(f.as_raw_fd(), high))
        .collect::<io::Result<_>>()
        .map_err(|e| os_failure(e, FailStage::Fd, -1))?;
    let (err_r, low_err_w) = sys::pipe().map_err(|e| os_failure(e, FailStage::Fork, -1))?;
    let err_w = sys::dup_at_least(low_err_w.as_raw_fd(), high).map_err(|e| os_failure(e, FailStage::Fork, -1))?;
    drop(low_err_w);
    let staged_raw: Vec<RawFd> = staged.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };

    let plan = ExecPlan {
        program: &program,
        argv: &argv_ptrs,
        env: &env_ptrs,
        cwd: cwd.as_ref(),
        targets,
        staged: &staged_raw,
        err_w: err_w.as_raw_fd(),
        guardian: me,
    };
    let pid = clone_vfork(&plan).map_err(|e| os_failure(e, FailStage::Fork, -1))?;
    drop(err_w);
    drop(staged);

    let mut report = [0u8; 9];
    let mut got = 0;
    let mut reader = std::fs::File::from(err_r);
    while got < report.len() {
        match reader.read(&mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(os_failure(e, FailStage::Exec, -1)),
        }
    }
    if got == 0 {
        // The pipe closed on exec: the child is running. Open its pid fd now,
        // before our loop can reap it, so the fd names exactly this process.
        return match sys::pidfd_open(pid) {
            Ok(pidfd) => Ok((pid, pidfd)),
            Err(e) => Err(os_failure(e, FailStage::Exec, -1)),
        };
    }
    let mut status = 0;
    // SAFETY: reaping our own child, which exits right after its report.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let errno = i32::from_le_bytes(report[0..4].try_into().unwrap());
    let stage = match report[4] {
        0 => FailStage::Exec,
        1 => FailStage::Chdir,
        _ => FailStage::Fd,
    };
    let detail = i32::from_le_bytes(report[5..9].try_into().unwrap());
    Err((errno, stage, detail))
}

/// Everything the child needs, prepared before it is created.
struct ExecPlan<'a> {
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    env: &'a [*const libc::c_char],
    cwd: Option<&'a CString>,
    targets: &'a [RawFd],
    staged: &'a [RawFd],
    err_w: RawFd,
    guardian: libc::pid_t,
}

/// Bytes of stack for the child between clone and exec.
const CHILD_STACK_BYTES: usize = 256 * 1024;

/// Creates the child the way `posix_spawn` does: `clone(CLONE_VM |
/// CLONE_VFORK)` on a stack of its own, so no page tables are copied and we
/// resume only once the child has exec'd or exited. The child shares our
/// memory until then and touches nothing but the prepared plan.
fn clone_vfork(plan: &ExecPlan<'_>) -> io::Result<libc::pid_t> {
    extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the plan, alive while the parent is suspended.
        unsafe { exec_child(&*(arg as *const ExecPlan<'_>)) }
    }
    // One stack serves every child: the guardian is single-threaded and
    // suspended while a child uses it, so two children never share it.
    thread_local! {
        static STACK: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; CHILD_STACK_BYTES]);
    }
    let top = STACK.with(|stack| {
        let mut stack = stack.borrow_mut();
        // The stack grows down: hand over its 16-byte-aligned top.
        (stack.as_mut_ptr() as usize + CHILD_STACK_BYTES) & !15
    });
    // SAFETY: the child runs `child_main` on the thread-local stack, which
    // outlives it (we are suspended until it execs or exits), and only makes
    // system calls.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const ExecPlan<'_> as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// The child's side of a spawn: set up and exec, or report why not.
unsafe fn exec_child(plan: &ExecPlan<'_>) -> ! {
    let fail = |stage: FailStage, detail: i32| -> ! {
        let errno = *libc::__errno_location();
        let mut report = [0u8; 9];
        report[0..4].copy_from_slice(&errno.to_le_bytes());
        report[4] = stage as u8;
        report[5..9].copy_from_slice(&detail.to_le_bytes());
        libc::write(plan.err_w, report.as_ptr() as *const _, report.len());
        libc::_exit(127)
    };
    // A clean signal state: the host interpreter's handler (SIGINT) and
    // ignored signals (SIGPIPE, SIGXFSZ) back to default, as subprocess does,
    // before anything is unblocked; dispositions are per process (no
    // CLONE_SIGHAND), so this does not touch the guardian's.
    for sig in [libc::SIGINT, libc::SIGPIPE, libc::SIGXFSZ] {
        libc::signal(sig, libc::SIG_DFL);
    }
    let empty = sigset(&[]);
    libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

    // Die with the guardian; keep our own orphans in our subtree.
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    if libc::getppid() != plan.guardian {
        libc::_exit(127);
    }
    libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

    // Everything from 3 up closes on exec, then the targets are placed
    // (dup2 clears close-on-exec on them), then unlisted stdio is closed.
    if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
        let max = libc::sysconf(libc::_SC_OPEN_MAX) as RawFd;
        for fd in 3..max {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    for (&target, &src) in plan.targets.iter().zip(plan.staged) {
        if libc::dup2(src, target) < 0 {
            fail(FailStage::Fd, target);
        }
    }
    for stdio in 0..3 {
        if !plan.targets.contains(&stdio) {
            libc::close(stdio);
        }
    }
    if let Some(dir) = plan.cwd {
        if libc::chdir(dir.as_ptr()) != 0 {
            fail(FailStage::Chdir, -1);
        }
    }
    libc::execve(plan.program.as_ptr(), plan.argv.as_ptr(), plan.env.as_ptr());
    fail(FailStage::Exec, -1)
}

/// SIGKILLs every descendant (they are all our children or become so as
/// their parents die) and reaps them, until none is left.
fn kill_everything() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        for pid in sys::children_of(me) {
            // SAFETY: our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer; blocks until a child
        // changes state, and fails with ECHILD once there are none.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            return;
        }
    }
}

/// Entry point shared by the `vllm-rs-guardian` binary and the Python module:
/// parses `<ctrl fd> <supervisor pid>` and runs the guardian.
pub fn main_from_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> ! {
    let args: Vec<String> = args.into_iter().map(|a| String::from_utf8_lossy(&a.into_vec()).into_owned()).collect();
    let parse = |i: usize| args.get(i).and_then(|a| a.parse::<i32>().ok());
    match (parse(0), parse(1)) {
        (Some(fd), Some(pid)) => run(fd, pid),
        _ => {
            eprintln!("usage: vllm-rs-guardian <control fd> <supervisor pid>");
            std::process::exit(2)
        }
    }
}
