//! The process core end to end, with the `vllm-rs-guardian` binary as guardian:
//! real children, real fds, real process trees.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use vllm_rs_test_support::wait_until;

use vllm_rs_core::{kill_process_tree, spawn, ExitStatus, RegisterError, SpawnError, SpawnSpec};

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        vllm_rs_core::supervisor::set_guardian_command(vec![env!("CARGO_BIN_EXE_vllm-rs-guardian").into()]);
    });
}

fn spec(args: &[&str]) -> SpawnSpec {
    SpawnSpec { argv: args.iter().map(OsString::from).collect(), ..Default::default() }
}

fn no_interrupt() -> std::io::Result<()> {
    Ok(())
}

#[test]
fn exit_codes_and_signals_are_reported() {
    setup();
    let child = spawn(&spec(&["sh", "-c", "exit 3"])).unwrap();
    assert_eq!(child.wait(Some(Duration::from_secs(10)), no_interrupt).unwrap(), Some(ExitStatus::Code(3)));
    let sleeper = spawn(&spec(&["sleep", "100"])).unwrap();
    assert_eq!(sleeper.try_status().unwrap(), None);
    sleeper.signal(libc::SIGTERM).unwrap();
    let status = sleeper.wait(Some(Duration::from_secs(10)), no_interrupt).unwrap();
    assert_eq!(status, Some(ExitStatus::Signal(libc::SIGTERM)));
    assert_eq!(status.unwrap().exitcode(), -libc::SIGTERM);
}

#[test]
fn passed_fds_arrive_at_the_same_number() {
    setup();
    let (r, w) = vllm_rs_core::sys::pipe().unwrap();
    // Move the write end to a high number the child must find it at.
    let high = vllm_rs_core::sys::dup_at_least(w.as_raw_fd(), 40).unwrap();
    drop(w);
    let fd = high.as_raw_fd();
    let mut s = spec(&["bash", "-c", &format!("echo -n hi >&{fd}")]);
    s.pass_fds = vec![fd];
    let child = spawn(&s).unwrap();
    drop(high);
    let mut got = String::new();
    std::fs::File::from(r).read_to_string(&mut got).unwrap();
    assert_eq!(got, "hi");
    assert_eq!(child.wait(None, no_interrupt).unwrap(), Some(ExitStatus::Code(0)));
}

#[test]
fn exec_and_fd_failures_are_errors_that_say_what() {
    setup();
    match spawn(&spec(&["/definitely/not/here"])) {
        Err(SpawnError::Failed { errno, path, .. }) => {
            assert_eq!((errno, path), (libc::ENOENT, Some(OsString::from("/definitely/not/here"))))
        }
        other => panic!("expected ENOENT, got {other:?}"),
    }
    let mut nowhere = spec(&["true"]);
    nowhere.cwd = Some("/definitely/not/here".into());
    match spawn(&nowhere) {
        Err(SpawnError::BadCwd { path, source }) => {
            assert_eq!((path.to_str(), source.raw_os_error()), (Some("/definitely/not/here"), Some(libc::ENOENT)))
        }
        other => panic!("expected a missing cwd, got {other:?}"),
    }
    match vllm_rs_core::supervisor::remove_on_exit(std::path::Path::new("/definitely/not/here")) {
        Err(RegisterError::Path { path, source }) => {
            assert_eq!((path.to_str(), source.raw_os_error()), (Some("/definitely/not/here"), Some(libc::ENOENT)))
        }
        other => panic!("expected a missing path, got {other:?}"),
    }
    let sleeper = spawn(&spec(&["sleep", "100"])).unwrap();
    let err = sleeper.signal(1000).unwrap_err();
    assert_eq!((err.pid, err.source.raw_os_error()), (sleeper.pid(), Some(libc::EINVAL)));
    assert!(err.to_string().contains(&format!("process {}", sleeper.pid())), "{err}");
    sleeper.signal(libc::SIGKILL).unwrap();
    sleeper.wait(Some(Duration::from_secs(10)), no_interrupt).unwrap();
    let mut bad = spec(&["true"]);
    bad.pass_fds = vec![999];
    let err = spawn(&bad).unwrap_err();
    assert!(err.to_string().contains("fd 999"), "{err}");
    assert!(matches!(spawn(&spec(&[])), Err(SpawnError::EmptyArgv)));
}

fn tree_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/support/tree.sh")
}

/// The fields of `/proc/PID/stat` after the command name (state, ppid, pgrp,
/// session, ...); `None` once the process is gone.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(')').next()?.split_whitespace().map(str::to_owned).collect())
}

fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|fields| fields.first().map(String::as_str) != Some("Z"))
}

/// How many of `pids` lead a session of their own: daemons whose `setsid`
/// has run. (Their parent need not be gone from the tree: under the process
/// core's subreapers an orphan is adopted inside it, not by init.)
fn detached(pids: &[i32]) -> usize {
    pids.iter()
        .filter(|&&pid| stat_fields(pid).is_some_and(|f| f.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(pid)))
        .count()
}

fn recorded(pidfile: &std::path::Path) -> Vec<i32> {
    std::fs::read_to_string(pidfile).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

#[test]
fn kill_process_tree_leaves_no_survivor_in_forking_and_daemon_trees() {
    setup();
    // (tree, processes it starts, how many of them detach as daemons)
    for (kind, size, daemons) in [("forking", 10, 0), ("daemons", 13, 6)] {
        let dir = std::env::temp_dir().join(format!("vllm-rs-tree-{}-{kind}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pids");
        let _ = std::fs::remove_file(&pidfile);
        let root = spawn(&spec(&["sh", tree_script().to_str().unwrap(), kind, pidfile.to_str().unwrap()])).unwrap();
        wait_until(&format!("the {kind} tree to build"), Duration::from_secs(20), || recorded(&pidfile).len() >= size);
        // The daemons must have left their parents before the kill, so that it
        // is their detachment that is tested (the forking tree keeps forking).
        wait_until(&format!("{daemons} daemons to detach"), Duration::from_secs(20), || {
            detached(&recorded(&pidfile)) >= daemons
        });
        kill_process_tree(root.pid()).unwrap();
        let survivors: Vec<i32> = recorded(&pidfile).into_iter().filter(|&p| alive(p)).collect();
        assert!(survivors.is_empty(), "{kind}: survivors {survivors:?}");
        assert_eq!(
            root.wait(Some(Duration::from_secs(10)), no_interrupt).unwrap(),
            Some(ExitStatus::Signal(libc::SIGKILL))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
