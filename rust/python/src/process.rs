//! The process functions and classes of `vllm_rs._core`: argument conversion
//! over the process core (`vllm-rs-core`). Blocking calls release the GIL and
//! let Python signal handlers (a Ctrl-C) interrupt them.

use std::ffi::OsString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

#[cfg(target_os = "linux")]
pub use linux::register;
#[cfg(not(target_os = "linux"))]
pub use other::register;

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::errors::{os_error, IntoPyErr};
    use vllm_rs_core::error::ProcessError;
    use vllm_rs_core::{guardian, killtree, supervisor, sys, ChildProcess, ExitStatus};

    fn to_duration(timeout: Option<f64>) -> PyResult<Option<Duration>> {
        match timeout {
            None => Ok(None),
            Some(t) if t.is_nan() => Err(PyValueError::new_err("timeout must be a number, not NaN")),
            // Negative means "do not wait"; past 1e9 s (31 years) means "forever" in practice.
            Some(t) => Ok(Some(Duration::from_secs_f64(t.clamp(0.0, 1e9)))),
        }
    }

    /// Runs a blocking call without the GIL; a Python exception raised by a
    /// signal handler while it waits (KeyboardInterrupt) ends it and propagates.
    fn blocking<T: Send, E: IntoPyErr + Send>(
        py: Python<'_>,
        f: impl FnOnce(&mut dyn FnMut() -> io::Result<()>) -> Result<T, E> + Send,
    ) -> PyResult<T> {
        let raised: Mutex<Option<PyErr>> = Mutex::new(None);
        let result = py.detach(|| {
            let mut on_interrupt = || match Python::attach(|py| py.check_signals()) {
                Ok(()) => Ok(()),
                Err(err) => {
                    *raised.lock().unwrap() = Some(err);
                    Err(io::Error::from(io::ErrorKind::Interrupted))
                }
            };
            f(&mut on_interrupt)
        });
        if let Some(err) = raised.into_inner().unwrap() {
            return Err(err);
        }
        result.map_err(IntoPyErr::into_pyerr)
    }

    /// A child process with the `multiprocessing.BaseProcess` surface.
    #[pyclass(name = "Process", module = "vllm_rs._core")]
    pub struct PyProcess {
        inner: ChildProcess,
        /// The process name (`multiprocessing` style).
        #[pyo3(get, set)]
        name: String,
        /// Fds kept open for the child's lifetime (closed by `close()`).
        held: Mutex<Vec<OwnedFd>>,
    }

    impl PyProcess {
        fn status(&self) -> PyResult<Option<ExitStatus>> {
            self.inner.try_status().map_err(ProcessError::into_pyerr)
        }
    }

    #[pymethods]
    impl PyProcess {
        /// The child's pid.
        #[getter]
        fn pid(&self) -> i32 {
            self.inner.pid()
        }

        /// Same as `pid`, as in `multiprocessing`.
        #[getter]
        fn ident(&self) -> i32 {
            self.inner.pid()
        }

        /// A pid fd: readable once the process has exited; works with
        /// `select` and `multiprocessing.connection.wait`.
        #[getter]
        fn sentinel(&self) -> RawFd {
            self.inner.pidfd()
        }

        /// None while running; the exit code, or minus the signal number.
        #[getter]
        fn exitcode(&self) -> PyResult<Option<i32>> {
            Ok(self.status()?.map(ExitStatus::exitcode))
        }

        /// True until the process has exited.
        fn is_alive(&self) -> PyResult<bool> {
            Ok(self.status()?.is_none())
        }

        /// Sends SIGTERM (through the pid fd: never to a reused pid).
        fn terminate(&self) -> PyResult<()> {
            self.send_signal(libc::SIGTERM)
        }

        /// Sends SIGKILL (through the pid fd).
        fn kill(&self) -> PyResult<()> {
            self.send_signal(libc::SIGKILL)
        }

        /// Sends `signal` through the pid fd; nothing once the process exited.
        fn send_signal(&self, signal: i32) -> PyResult<()> {
            self.inner.signal(signal).map_err(ProcessError::into_pyerr)
        }

        /// Waits up to `timeout` seconds (forever if None) for the process to
        /// exit, without holding the GIL. Returns None either way.
        #[pyo3(signature = (timeout=None))]
        fn join(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
            let timeout = to_duration(timeout)?;
            let inner = &self.inner;
            blocking(py, |on_interrupt| inner.wait(timeout, on_interrupt))?;
            Ok(())
        }

        /// Releases the fds held for the child. Raises ValueError while it runs.
        fn close(&self) -> PyResult<()> {
            if self.status()?.is_none() {
                return Err(PyValueError::new_err(format!(
                    "Cannot close a process while it is still running. You should first call join() or terminate(). ({})",
                    self.name
                )));
            }
            self.held.lock().unwrap().clear();
            Ok(())
        }

        fn __repr__(&self) -> PyResult<String> {
            let state = match self.status()? {
                None => "started".to_owned(),
                Some(s) => format!("stopped exitcode={}", s.exitcode()),
            };
            Ok(format!("<Process name={:?} pid={} {}>", self.name, self.inner.pid(), state))
        }
    }

    /// One child for `spawn_many`, with the fields of `spawn`'s arguments.
    /// One with `hold_fds` starts one process only: that process owns them.
    #[pyclass(name = "SpawnRequest", module = "vllm_rs._core", frozen)]
    pub struct SpawnRequest {
        /// The command; argv[0] is looked up in PATH unless it holds a `/`.
        #[pyo3(get)]
        argv: Vec<OsString>,
        /// The handle's name.
        #[pyo3(get)]
        name: String,
        /// The whole environment as (name, value) pairs; None: ours.
        #[pyo3(get)]
        env: Option<Vec<(OsString, OsString)>>,
        /// The working directory; None: ours.
        #[pyo3(get)]
        cwd: Option<OsString>,
        /// Fds the child inherits at the same numbers.
        #[pyo3(get)]
        pass_fds: Vec<RawFd>,
        /// Fds the handle takes ownership of (kept open while the child runs).
        #[pyo3(get)]
        hold_fds: Vec<RawFd>,
        /// Set once a process took ownership of `hold_fds`.
        started: AtomicBool,
    }

    #[pymethods]
    impl SpawnRequest {
        #[new]
        #[pyo3(signature = (argv, *, name, env=None, cwd=None, pass_fds=Vec::new(), hold_fds=Vec::new()))]
        fn new(
            argv: Vec<OsString>,
            name: String,
            env: Option<Vec<(OsString, OsString)>>,
            cwd: Option<OsString>,
            pass_fds: Vec<RawFd>,
            hold_fds: Vec<RawFd>,
        ) -> Self {
            SpawnRequest { argv, name, env, cwd, pass_fds, hold_fds, started: AtomicBool::new(false) }
        }

        fn __repr__(&self) -> String {
            format!("SpawnRequest(argv={:?}, name={:?})", self.argv, self.name)
        }
    }

    /// Takes ownership of every request's `hold_fds`, after refusing (with
    /// nothing taken) an fd that is not open, one listed twice, or a request
    /// whose fds a process it started already owns: two owners would close
    /// the same fd number twice.
    fn claim_held(requests: &[&SpawnRequest]) -> PyResult<Vec<Vec<OwnedFd>>> {
        let mut seen = std::collections::HashSet::new();
        for request in requests {
            if !request.hold_fds.is_empty() && request.started.load(Ordering::Relaxed) {
                return Err(PyValueError::new_err(format!(
                    "{} already started a process, which owns its hold_fds",
                    request.__repr__()
                )));
            }
            for &fd in &request.hold_fds {
                if !sys::fd_is_open(fd) {
                    return Err(os_error(libc::EBADF, format!("cannot hold fd {fd}: it is not open"), None));
                }
                if !seen.insert(fd) {
                    return Err(PyValueError::new_err(format!("fd {fd} is in hold_fds twice")));
                }
            }
        }
        Ok(requests
            .iter()
            .map(|request| {
                if !request.hold_fds.is_empty() {
                    request.started.store(true, Ordering::Relaxed);
                }
                // SAFETY: each fd is open and listed once: ownership passes here.
                request.hold_fds.iter().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect()
            })
            .collect())
    }

    /// Starts each request through the guardian, pipelined; each outcome is a
    /// `Process` or the exception that request raised.
    fn spawn_all(py: Python<'_>, requests: &[&SpawnRequest]) -> PyResult<Vec<Result<PyProcess, PyErr>>> {
        let held = claim_held(requests)?;
        let specs: Vec<supervisor::SpawnSpec> = requests
            .iter()
            .map(|r| supervisor::SpawnSpec {
                argv: r.argv.clone(),
                env: r.env.clone(),
                cwd: r.cwd.clone(),
                pass_fds: r.pass_fds.clone(),
            })
            .collect();
        let started = py.detach(|| supervisor::spawn_many(&specs));
        Ok(started
            .into_iter()
            .zip(requests)
            .zip(held)
            .map(|((outcome, request), held)| {
                // A failed request's fds close with `held` right here.
                outcome
                    .map(|child| PyProcess { inner: child, name: request.name.clone(), held: Mutex::new(held) })
                    .map_err(IntoPyErr::into_pyerr)
            })
            .collect())
    }

    /// Starts `argv` through this process's guardian. The child inherits
    /// exactly `pass_fds` at the same numbers (plus open stdio), `env` (None:
    /// ours), `cwd` (None: ours); it dies with this process and takes its
    /// descendants along. `hold_fds` are owned by the handle from now on.
    /// Failures raise the `OSError` subclass of their errno, with `errno`
    /// and `filename` (the program or directory) set; nothing is left running.
    #[pyfunction]
    #[pyo3(signature = (argv, *, name, env=None, cwd=None, pass_fds=Vec::new(), hold_fds=Vec::new()))]
    pub fn spawn(
        py: Python<'_>,
        argv: Vec<OsString>,
        name: String,
        env: Option<Vec<(OsString, OsString)>>,
        cwd: Option<OsString>,
        pass_fds: Vec<RawFd>,
        hold_fds: Vec<RawFd>,
    ) -> PyResult<PyProcess> {
        let request = SpawnRequest::new(argv, name, env, cwd, pass_fds, hold_fds);
        spawn_all(py, &[&request])?.pop().expect("one outcome")
    }

    /// Starts many children at once, one per `SpawnRequest`. The requests are
    /// pipelined to the guardian; returns, in order, a `Process` or the
    /// exception each request raised (nothing is left running for a failed one).
    #[pyfunction]
    pub fn spawn_many(py: Python<'_>, requests: Vec<PyRef<'_, SpawnRequest>>) -> PyResult<Vec<Py<PyAny>>> {
        let requests: Vec<&SpawnRequest> = requests.iter().map(|r| &**r).collect();
        spawn_all(py, &requests)?
            .into_iter()
            .map(|outcome| match outcome {
                Ok(process) => Ok(Py::new(py, process)?.into_any()),
                Err(err) => Ok(err.into_value(py).into_any()),
            })
            .collect()
    }

    /// SIGKILLs `pid` and every descendant, including ones that fork while
    /// this runs and (below children started here) ones that detached; waits
    /// until they have exited. Returns quietly if `pid` is gone.
    #[pyfunction]
    pub fn kill_process_tree(py: Python<'_>, pid: i32) -> PyResult<usize> {
        if pid <= 0 {
            return Err(PyValueError::new_err(format!("kill_process_tree: invalid pid {pid}")));
        }
        py.detach(|| killtree::kill_process_tree(pid)).map_err(ProcessError::into_pyerr)
    }

    /// Waits until any of `fds` is readable (or hung up), or `timeout`
    /// seconds pass (None: forever), without the GIL; a signal whose Python
    /// handler raises ends it (looked for at least every 50 ms). Returns the
    /// ready fds.
    #[pyfunction]
    #[pyo3(signature = (fds, timeout=None))]
    pub fn wait_fds(py: Python<'_>, fds: Vec<RawFd>, timeout: Option<f64>) -> PyResult<Vec<RawFd>> {
        let timeout = to_duration(timeout)?;
        let outcome = blocking(py, |on_interrupt| sys::poll_readable_checking(&fds, timeout, on_interrupt))?;
        Ok(match outcome {
            sys::PollOutcome::TimedOut => Vec::new(),
            sys::PollOutcome::Ready(ready) => ready.into_iter().map(|i| fds[i]).collect(),
        })
    }

    /// Sets the command that starts this process's guardian (the control fd
    /// and our pid are appended).
    #[pyfunction]
    pub fn set_guardian_command(argv: Vec<OsString>) {
        supervisor::set_guardian_command(argv);
    }

    /// Has this process's guardian remove `path` (a file, or a directory
    /// by the rule in docs/process-core.md) once this process is gone,
    /// however it ends (SIGKILL included), if it still names the same inode.
    /// Returns once the guardian has acknowledged. A missing path raises
    /// FileNotFoundError naming it.
    #[pyfunction]
    pub fn remove_on_exit(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| supervisor::remove_on_exit(&path)).map_err(IntoPyErr::into_pyerr)
    }

    /// Undoes `remove_on_exit(path)`, for a caller that removes the path
    /// itself; a no-op if it was never registered.
    #[pyfunction]
    pub fn cancel_remove_on_exit(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| supervisor::cancel_remove_on_exit(&path)).map_err(IntoPyErr::into_pyerr)
    }

    /// Pid of this process's guardian, or None before the first spawn.
    #[pyfunction]
    pub fn guardian_pid() -> Option<i32> {
        supervisor::guardian_pid()
    }

    /// Runs the guardian loop in this (fresh, single-threaded) interpreter.
    /// Never returns.
    #[pyfunction]
    pub fn guardian_main(py: Python<'_>, ctrl_fd: RawFd, supervisor_pid: i32) {
        py.detach(|| guardian::run(ctrl_fd, supervisor_pid))
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<PyProcess>()?;
        m.add_class::<SpawnRequest>()?;
        m.add_function(wrap_pyfunction!(spawn, m)?)?;
        m.add_function(wrap_pyfunction!(spawn_many, m)?)?;
        m.add_function(wrap_pyfunction!(kill_process_tree, m)?)?;
        m.add_function(wrap_pyfunction!(wait_fds, m)?)?;
        m.add_function(wrap_pyfunction!(set_guardian_command, m)?)?;
        m.add_function(wrap_pyfunction!(guardian_pid, m)?)?;
        m.add_function(wrap_pyfunction!(remove_on_exit, m)?)?;
        m.add_function(wrap_pyfunction!(cancel_remove_on_exit, m)?)?;
        m.add_function(wrap_pyfunction!(guardian_main, m)?)?;
        m.add("SUPPORTED", true)?;
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use super::*;
    use pyo3::exceptions::PyNotImplementedError;

    /// Process management needs Linux (pid fds, prctl, /proc).
    #[pyfunction]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn unsupported(
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        Err(PyNotImplementedError::new_err(format!(
            "vllm_rs process management needs Linux (pidfd, prctl, /proc); this is {}",
            std::env::consts::OS
        )))
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let f = wrap_pyfunction!(unsupported, m)?;
        for name in [
            "spawn",
            "spawn_many",
            "SpawnRequest",
            "kill_process_tree",
            "wait_fds",
            "set_guardian_command",
            "guardian_pid",
            "guardian_main",
            "remove_on_exit",
            "cancel_remove_on_exit",
        ] {
            m.add(name, &f)?;
        }
        m.add("SUPPORTED", false)?;
        Ok(())
    }
}
