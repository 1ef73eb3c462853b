//! Options of the process: every numeric `--args-json` key and environment
//! variable out of range exits 2 naming it (never a panic), one fd given to
//! two flags is refused, and the API key comes from `VLLM_API_KEY`.

mod common;

use common::{Frontend, Options, BINARY};
use serde_json::json;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn assert_refused(code: Option<i32>, text: &str, name: &str) {
    assert_eq!(code, Some(2), "{name}: {text}");
    assert!(text.contains(name), "the message should name {name}: {text}");
    assert!(!text.contains("panicked") && !text.contains("--listen-fd"), "{name}: {text}");
}

#[test]
fn huge_or_negative_timeouts_in_args_json_exit_2_naming_the_key() {
    for key in ["shutdown_timeout", "http_timeout_keep_alive", "engine_ready_timeout_secs", "engine_stall_timeout_s"] {
        for bad in ["1e300", "1e19", "-0.5"] {
            let (code, text) = common::exit_of(&format!(r#"{{"model_tag": "toy", "{key}": {bad}}}"#), &[], &[]);
            assert_refused(code, &text, key);
        }
    }
    let (code, text) = common::exit_of(r#"{"model_tag": "toy", "max_model_len": 1e19}"#, &[], &[]);
    assert_refused(code, &text, "max_model_len");
}

#[test]
fn a_bad_reasoning_effort_map_in_args_json_exits_2_with_vllms_message() {
    for (map, message) in [
        (r#"["low"]"#, "must be a JSON object mapping reasoning efforts to strings."),
        (r#"{"low": 1}"#, "must be a JSON object mapping reasoning efforts to strings."),
        (r#"{"turbo": "high"}"#, "has unknown efforts ['turbo']; keys must be one of ['none', 'minimal',"),
    ] {
        let (code, text) =
            common::exit_of(&format!(r#"{{"model_tag": "toy", "reasoning_effort_map": {map}}}"#), &[], &[]);
        assert_refused(code, &text, "--reasoning-effort-map");
        assert!(text.contains(message), "{map}: {text}");
    }
}

#[test]
fn out_of_range_environment_variables_exit_2_naming_the_variable() {
    let toy = r#"{"model_tag": "toy"}"#;
    for (name, bad) in [
        ("VLLM_ENGINE_READY_TIMEOUT_S", "1e300"),
        ("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "inf"),
        ("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "0"),
        ("VLLM_RS_MAX_ENGINE_MESSAGE_BYTES", "-1"),
        ("VLLM_RS_HTTP_BODY_TIMEOUT_S", "1e19"),
        ("VLLM_RS_HTTP_HEADER_TIMEOUT_S", "nan"),
        ("VLLM_RS_HTTP_MAX_HEADER_BYTES", "100"),
        ("TOKIO_WORKER_THREADS", "100000000"),
    ] {
        let (code, text) = common::exit_of(toy, &[], &[(name, bad)]);
        assert_refused(code, &text, name);
    }
    // In range, validation passes and the next check (fd 0 is no socket) is what fails.
    let (code, text) =
        common::exit_of(toy, &[], &[("VLLM_RS_HTTP_MAX_HEADER_BYTES", "8192"), ("VLLM_RS_HTTP_BODY_TIMEOUT_S", "0.5")]);
    assert_eq!(code, Some(2));
    assert!(text.contains("--listen-fd"), "{text}");
}

#[test]
fn one_descriptor_for_two_flags_exits_2() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let output = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (fd, out_fd) = (listener.as_raw_fd(), output.as_raw_fd());
    let mut command = Command::new(BINARY);
    command
        .args(["frontend", "--listen-fd", &fd.to_string(), "--input-listener-fd", &fd.to_string()])
        .args(["--output-listener-fd", &out_fd.to_string()])
        .args(["--engine-start-index", "0", "--engine-count", "1", "--data-parallel-size", "1"])
        .args(["--args-json", r#"{"model_tag": "toy", "engine_ready_timeout_secs": 5}"#])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: fcntl on descriptors this test owns, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            for fd in [fd, out_fd] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    vllm_rs_test_support::poll_until(Duration::from_secs(30), || child.try_wait().unwrap());
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--listen-fd and --input-listener-fd"), "{text}");
}

#[tokio::test]
async fn api_key_from_the_environment_guards_the_api_and_stays_off_the_command_line() {
    let options = Options { env: vec![("VLLM_API_KEY".into(), "sk-from-env".into())], ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    let client = reqwest::Client::new();
    assert_eq!(client.get(fe.url("/v1/models")).send().await.unwrap().status(), 401);
    assert_eq!(client.get(fe.url("/v1/models")).bearer_auth("wrong").send().await.unwrap().status(), 401);
    assert_eq!(client.get(fe.url("/v1/models")).bearer_auth("sk-from-env").send().await.unwrap().status(), 200);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", fe.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("sk-from-env"));
    let log = fe.stderr();
    assert!(!log.contains("sk-from-env") && !log.contains("visible to every local user"), "{log}");
}

#[tokio::test]
async fn api_key_in_args_json_still_works_but_warns() {
    let options = Options { args: json!({"model_tag": "toy", "api_key": "sk-from-args"}), ..Default::default() };
    let (fe, _engines) = Frontend::start_with_engines(options, |_| {}).await;
    let client = reqwest::Client::new();
    assert_eq!(client.get(fe.url("/v1/models")).send().await.unwrap().status(), 401);
    assert_eq!(client.get(fe.url("/v1/models")).bearer_auth("sk-from-args").send().await.unwrap().status(), 200);
    let log = fe.stderr();
    assert!(log.contains("visible to every local user") && log.contains("VLLM_API_KEY"), "{log}");
    assert!(!log.contains("sk-from-args"), "the key reached the log");
}
