//! Test harness: starts the real `vllm-rs frontend` binary with inherited
//! listener fds, exactly as `RustFrontendProcessManager` does, next to mock
//! engines on real ZeroMQ sockets.
#![allow(dead_code)]

pub mod mock_engine;

use mock_engine::{EngineSpec, MockEngine};
use serde_json::{json, Value};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;
use vllm_rs_test_support::{poll_until, poll_until_async};

pub const BINARY: &str = env!("CARGO_BIN_EXE_vllm-rs");

/// A fresh temporary directory for this test.
pub fn temp_dir(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "vllm-rs-test-{tag}-{}-{}",
        std::process::id(),
        vllm_rs_engine::ids::random_hex(6)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A folder under the system temp dir that is removed, with all it holds,
/// when the test drops it (a failing test's too).
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the HTTP socket is made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HttpSocket {
    Tcp4,
    Tcp6,
    Unix,
    /// IPv4, bound but not listening.
    Tcp4BoundOnly,
}

/// How the engine sockets are given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZmqSockets {
    TcpListeners,
    IpcListeners,
    Addresses,
    /// `ipc://@NAME` addresses the frontend binds (abstract: no file permissions).
    AbstractAddresses,
}

pub struct Options {
    pub args: Value,
    pub engine_count: u32,
    pub start_index: u32,
    pub dp_size: u32,
    pub http: HttpSocket,
    pub zmq: ZmqSockets,
    pub extra_args: Vec<String>,
    /// Environment variables for the frontend (`VLLM_API_KEY` is never inherited).
    pub env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            args: json!({"model_tag": "toy", "engine_ready_timeout_secs": 20}),
            engine_count: 1,
            start_index: 0,
            dp_size: 1,
            http: HttpSocket::Tcp4,
            zmq: ZmqSockets::TcpListeners,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }
}

pub struct Frontend {
    pub child: Child,
    /// `http://127.0.0.1:PORT` (TCP) or the socket path (Unix).
    pub base_url: String,
    pub unix_path: Option<PathBuf>,
    pub input_address: String,
    pub output_address: String,
    pub stderr_path: PathBuf,
    /// Removed (fields drop after `drop`) once the child is gone.
    dir: TempDir,
}

fn bound_only_tcp4() -> (OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as _;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let rc =
            libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32);
        assert_eq!(rc, 0);
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_in).cast(), &mut len);
        (OwnedFd::from_raw_fd(fd), u16::from_be(addr.sin_port))
    }
}

/// A listening ZeroMQ-side socket and the address engines connect to.
fn zmq_listener(kind: ZmqSockets, dir: &std::path::Path, name: &str) -> (Option<OwnedFd>, String) {
    match kind {
        ZmqSockets::TcpListeners => {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            (Some(l.into()), format!("tcp://127.0.0.1:{port}"))
        }
        ZmqSockets::IpcListeners => {
            let path = dir.join(name);
            let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
            (Some(l.into()), format!("ipc://{}", path.display()))
        }
        ZmqSockets::Addresses => {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            (None, format!("tcp://127.0.0.1:{port}"))
        }
        ZmqSockets::AbstractAddresses => {
            let unique = dir.file_name().unwrap().to_string_lossy().to_string();
            (None, format!("ipc://@{unique}-{name}"))
        }
    }
}

impl Frontend {
    /// Starts the binary; does not wait for readiness.
    pub fn spawn(options: Options) -> Frontend {
        let dir = temp_dir("fe");
        let (http_fd, base_url, unix_path): (OwnedFd, String, Option<PathBuf>) = match options.http {
            HttpSocket::Tcp4 => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let url = format!("http://{}", l.local_addr().unwrap());
                (l.into(), url, None)
            }
            HttpSocket::Tcp6 => {
                let l = std::net::TcpListener::bind("[::1]:0").unwrap();
                let url = format!("http://{}", l.local_addr().unwrap());
                (l.into(), url, None)
            }
            HttpSocket::Unix => {
                let path = dir.join("http.sock");
                let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
                (l.into(), path.display().to_string(), Some(path))
            }
            HttpSocket::Tcp4BoundOnly => {
                let (fd, port) = bound_only_tcp4();
                (fd, format!("http://127.0.0.1:{port}"), None)
            }
        };
        let (input_fd, input_address) = zmq_listener(options.zmq, &dir, "input.sock");
        let (output_fd, output_address) = zmq_listener(options.zmq, &dir, "output.sock");

        let mut command = Command::new(BINARY);
        command.arg("frontend").arg("--listen-fd").arg(http_fd.as_raw_fd().to_string());
        let mut inherited: Vec<RawFd> = vec![http_fd.as_raw_fd()];
        match (&input_fd, &output_fd) {
            (Some(i), Some(o)) => {
                command.args([
                    "--input-listener-fd",
                    &i.as_raw_fd().to_string(),
                    "--output-listener-fd",
                    &o.as_raw_fd().to_string(),
                ]);
                inherited.extend([i.as_raw_fd(), o.as_raw_fd()]);
            }
            _ => {
                command.args(["--input-address", &input_address, "--output-address", &output_address]);
            }
        }
        command
            .args(["--engine-start-index", &options.start_index.to_string()])
            .args(["--engine-count", &options.engine_count.to_string()])
            .args(["--data-parallel-size", &options.dp_size.to_string()])
            .args(&options.extra_args)
            .args(["--args-json", &options.args.to_string()]);
        let stderr_path = dir.join("stderr.log");
        command.env_remove("VLLM_API_KEY").envs(options.env.iter().map(|(k, v)| (k, v)));
        command.stdout(Stdio::null()).stderr(std::fs::File::create(&stderr_path).unwrap());
        // The listeners reach the child at the same numbers; every other fd keeps CLOEXEC.
        unsafe {
            command.pre_exec(move || {
                for &fd in &inherited {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawning vllm-rs");
        // The parent's copies close here, as the Python manager does.
        drop((http_fd, input_fd, output_fd));
        Frontend { child, base_url, unix_path, input_address, output_address, stderr_path, dir }
    }

    /// Starts the binary with mock engines `start..start+count` and waits until /health is 200.
    pub async fn start_with_engines(options: Options, tweak: impl Fn(&mut EngineSpec)) -> (Frontend, Vec<MockEngine>) {
        let (start, count) = (options.start_index, options.engine_count);
        let mut frontend = Frontend::spawn(options);
        let engines = (start..start + count)
            .map(|i| {
                let mut spec = EngineSpec::new(i, &frontend.input_address, &frontend.output_address);
                tweak(&mut spec);
                MockEngine::start(spec)
            })
            .collect();
        frontend.wait_ready(Duration::from_secs(30)).await;
        (frontend, engines)
    }

    /// Waits until /health answers 200 (panics with the log if the process exits).
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let client = &reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        let this = &*self;
        let ready = poll_until_async(timeout, || async move {
            if this.has_exited() {
                return true; // told below
            }
            if this.unix_path.is_some() {
                matches!(this.unix_request("GET", "/health", None).await, Ok((200, _)))
            } else {
                client.get(this.url("/health")).send().await.is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("frontend exited early ({status}):\n{}", self.stderr());
        }
        assert!(ready.is_some(), "frontend not ready after {timeout:?}:\n{}", self.stderr());
    }

    /// Whether the process has exited (it stays unreaped: `child` still gets its status).
    pub fn has_exited(&self) -> bool {
        // SAFETY: waitid only writes the struct it is given; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        let found = unsafe { libc::waitid(libc::P_PID, self.child.id(), &mut info, flags) };
        // SAFETY: si_pid is set (non-zero) only when a state change was found.
        found == 0 && unsafe { info.si_pid() } != 0
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits up to `timeout` until the log holds `needle` at least `count` times.
    pub async fn wait_for_log(&self, needle: &str, count: usize, timeout: Duration) -> bool {
        poll_until_async(timeout, || async move { self.stderr().matches(needle).count() >= count }).await.is_some()
    }

    pub fn signal(&self, signal: libc::c_int) {
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        poll_until(timeout, || self.child.try_wait().unwrap())
    }

    /// A raw HTTP/1.1 request over the Unix socket: `(status, body)`.
    pub async fn unix_request(&self, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::UnixStream::connect(self.unix_path.as_ref().unwrap()).await?;
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok((status, body))
    }
}

impl Drop for Frontend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `args` and no engines; returns its exit status and stderr.
pub fn run_to_exit(args: &[&str], timeout: Duration) -> (ExitStatus, String) {
    run_to_exit_with_env(args, &[], timeout)
}

/// `run_to_exit` with extra environment variables.
pub fn run_to_exit_with_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> (ExitStatus, String) {
    let mut command = Command::new(BINARY);
    command.args(args).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    if poll_until(timeout, || child.try_wait().unwrap()).is_none() {
        let _ = child.kill();
        panic!("{args:?} did not exit within {timeout:?}");
    }
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    (output.status, text)
}

/// Runs the frontend with one engine at unused addresses, `extra` flags,
/// `args_json` and `env`, and returns its exit code and output. fd 0 is no
/// socket, so a configuration that passes validation exits 2 naming
/// `--listen-fd`; anything refused earlier names what was wrong.
pub fn exit_of(args_json: &str, extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut args = vec!["frontend", "--listen-fd", "0", "--input-address", "tcp://127.0.0.1:1"];
    args.extend(["--output-address", "tcp://127.0.0.1:2", "--engine-start-index", "0", "--engine-count", "1"]);
    args.extend(["--data-parallel-size", "1"]);
    args.extend(extra);
    args.extend(["--args-json", args_json]);
    let (status, text) = run_to_exit_with_env(&args, env, Duration::from_secs(20));
    (status.code(), text)
}

/// The `data:` payloads of a server-sent-event body.
pub fn sse_payloads(body: &str) -> Vec<String> {
    body.split("\n\n").filter_map(|event| event.trim().strip_prefix("data: ").map(str::to_owned)).collect()
}

/// Posts JSON and returns `(status, body as JSON or string)`.
pub async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}
