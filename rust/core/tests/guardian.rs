//! The `vllm-rs-guardian` binary driven directly over its control socket,
//! with this test process as its supervisor.

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use vllm_rs_core::sys::{self, PollOutcome};
use vllm_rs_core::wire::{self, Reply, Request};

/// Starts a guardian for this process on one end of a socket pair; returns
/// it and our end once it has said it is ready.
fn start_guardian() -> (Child, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let their_fd = theirs.as_raw_fd();
    let mut command = Command::new(env!("CARGO_BIN_EXE_vllm-rs-guardian"));
    command.arg("3").arg(std::process::id().to_string());
    // SAFETY: only fcntl/dup2 between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec set.
            match their_fd {
                3 => sys::cvt(libc::fcntl(3, libc::F_SETFD, 0)).map(drop),
                _ => sys::cvt(libc::dup2(their_fd, 3)).map(drop),
            }
        });
    }
    let child = command.spawn().unwrap();
    drop(theirs);
    let (body, _) = wire::recv(&ours).unwrap().expect("the guardian said nothing");
    assert!(matches!(Reply::decode(&body).unwrap(), Reply::Ready { .. }));
    (child, ours)
}

/// A fresh directory for one test, removed with everything in it when
/// dropped, also when the test fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("vllm-rs-guardian-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn registration(id: u64, path: &Path) -> Vec<u8> {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let path = path.as_os_str().as_bytes().to_vec();
    Request::RemoveOnExit { id, path, dev: meta.dev(), ino: meta.ino(), file_type: meta.mode() & libc::S_IFMT }.encode()
}

#[test]
fn registrations_queued_before_a_sigterm_still_count() {
    let scratch = Scratch::new("sigterm");
    let (file, sockets) = (scratch.0.join("registered.sock"), scratch.0.join("sockets"));
    let _file = UnixListener::bind(&file).unwrap();
    std::fs::create_dir(&sockets).unwrap();
    let _inside = UnixListener::bind(sockets.join("engine.sock")).unwrap();

    let (mut guardian, ctrl) = start_guardian();
    let pid = guardian.id() as libc::pid_t;
    let exited = sys::pidfd_open(pid).unwrap();
    // Stopped, it sees the requests and the SIGTERM at once when it resumes:
    // the requests must win.
    // SAFETY: signalling our own child, which we have not reaped.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    wire::send(&ctrl, &registration(1, &file), &[]).unwrap();
    wire::send(&ctrl, &registration(2, &sockets), &[]).unwrap();
    // SAFETY: as above.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
        libc::kill(pid, libc::SIGCONT);
    }
    let outcome = sys::poll_readable(&[exited.as_raw_fd()], Some(Duration::from_secs(60)), || Ok(())).unwrap();
    assert!(matches!(outcome, PollOutcome::Ready(_)), "the guardian did not exit");
    assert!(guardian.wait().unwrap().success());
    assert!(!file.exists() && !sockets.exists());
}

#[test]
fn every_registration_is_acknowledged() {
    let scratch = Scratch::new("ack");
    let dir = scratch.0.join("cancelled");
    std::fs::create_dir(&dir).unwrap();
    let (mut guardian, ctrl) = start_guardian();
    wire::send(&ctrl, &registration(7, &dir), &[]).unwrap();
    wire::send(&ctrl, &Request::CancelRemoveOnExit { id: 8, path: dir.as_os_str().as_bytes().to_vec() }.encode(), &[])
        .unwrap();
    for expected in [7, 8] {
        let (body, _) = wire::recv(&ctrl).unwrap().expect("the guardian closed its end");
        assert!(matches!(Reply::decode(&body).unwrap(), Reply::Acknowledged { id } if id == expected));
    }
    drop(ctrl); // the supervisor "exits": the guardian follows, leaving the cancelled directory
    assert!(guardian.wait().unwrap().success());
    assert!(dir.is_dir());
}
