"""`serve` keeping the stack healthy and stopping it: Ctrl-C, SIGTERM, an
engine killed mid-stream, the frontend killed mid-stream, SIGKILL of serve,
and the usage errors that start nothing."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import psutil
import pytest
import zmq
from vllm_rs.engine.protocol import ENGINE_CORE_DEAD

from tests.support.wait import WaitTimeout, wait_until
from tests.test_serve import Serve, assert_all_gone, needs_frontend
from tests.thread_signals import signal_another_thread

ENGINE_PID = re.compile(r"EngineCore_(\d+) ready \(pid (\d+)\)")
ENGINE_TOTALS = re.compile(r"EngineCore_(\d+) stopped: (\d+) requests finished")


def wait_gone(path: str, within_s: float) -> bool:
    """Whether `path` is gone, polled until the deadline."""
    try:
        return wait_until(lambda: not os.path.lexists(path), f"{path} to go", within_s)
    except WaitTimeout:
        return False


def abstract_unix_sockets(processes) -> list[str]:
    """The abstract-namespace Unix socket names held open by `processes`."""
    inodes = set()
    for process in processes:
        for fd in os.listdir(f"/proc/{process.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{process.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    names = []
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("@"):
                names.append(fields[7])
    return names


def engine_pids(serve: Serve) -> dict[int, int]:
    return {int(rank): int(pid) for rank, pid in ENGINE_PID.findall(serve.output)}


def frontend_pid(serve: Serve) -> int:
    (binary,) = [p for p in serve.descendants() if p.name() == "vllm-rs"]
    return binary.pid


def start_long_stream(serve: Serve):
    """A streamed completion from the toy model that runs for seconds, after
    its first chunk."""
    stream = serve.client().completions.create(
        model="toy", prompt="Tell me a long story.", max_tokens=1900, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    return stream


def drain_until_error(stream) -> tuple[int, BaseException | None]:
    """Reads the rest of a stream: (chunks read, the error it ended with)."""
    count = 0
    try:
        for _ in stream:
            count += 1
    except Exception as e:  # an API error, or the transport failing underneath the client
        return count, e
    return count, None


@needs_frontend
def test_ctrl_c_drains_exits_0_and_both_engines_served():
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2")
    try:
        client = serve.client()
        with ThreadPoolExecutor(16) as pool:
            texts = list(
                pool.map(
                    lambda i: (
                        client.completions.create(model="echo", prompt=f"r{i:02d}", max_tokens=200).choices[0].text
                    ),
                    range(48),
                )
            )
        assert all(t.startswith(f"r{i:02d}") and len(t) == 200 for i, t in enumerate(texts))
        processes = serve.descendants()
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
        served = {int(rank): int(n) for rank, n in ENGINE_TOTALS.findall(serve.output)}
        assert set(served) == {0, 1} and all(n > 0 for n in served.values()), served
        assert sum(served.values()) == 48
    finally:
        serve.kill()


@needs_frontend
def test_sigterm_exits_0_and_removes_the_unix_socket(tmp_path):
    path = str(tmp_path / "api.sock")
    serve = Serve("--model", "echo", "--uds", path)
    try:
        assert serve.wait_ready().startswith("unix:")
        conn = http.client.HTTPConnection("localhost")
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.connect(path)
        conn.request(
            "POST",
            "/v1/completions",
            body='{"prompt": "uds", "max_tokens": 3}',
            headers={"content-type": "application/json"},
        )
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["choices"][0]["text"] == "uds"
        conn.close()
        processes = serve.descendants()
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
        assert not os.path.exists(path)
    finally:
        serve.kill()


@needs_frontend
def test_sigterm_given_to_a_helper_thread_stops_the_stack():
    """The kernel may hand serve's SIGTERM to one of its helper threads (the
    health probe); the main thread, waiting on the stack, still stops it."""
    serve = Serve("--model", "echo", "--port", "0")
    try:
        serve.wait_ready()
        processes = serve.descendants()
        signal_another_thread(serve.proc.pid, signal.SIGTERM)
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
    finally:
        serve.kill()


@needs_frontend
def test_engine_sockets_are_private_and_removed_with_the_stack():
    """The engine sockets are files of mode 0600 in a directory of mode 0700
    (abstract sockets would have no permission check at all); SIGTERM
    removes them and the directory."""
    serve = Serve("--model", "echo", "--port", "0")
    try:
        serve.wait_ready()
        directory = serve.socket_dir
        info = os.lstat(directory)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        assert sorted(os.listdir(directory)) == ["input-0", "output-0"]
        for name in ("input-0", "output-0"):
            mode = os.lstat(os.path.join(directory, name)).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        processes = serve.descendants()
        assert abstract_unix_sockets([*processes, psutil.Process(serve.proc.pid)]) == []
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
        assert not os.path.lexists(directory)
    finally:
        serve.kill()


def test_sigkill_of_serve_removes_the_socket_directory():
    serve = Serve("--model", "echo", "--port", "0")
    try:
        serve.wait_ready()
        directory = serve.socket_dir
        serve.proc.kill()
        assert wait_gone(directory, within_s=2), os.listdir(directory)
    finally:
        serve.kill()


@needs_frontend
def test_an_engine_lost_by_the_frontend_stops_the_stack():
    """The frontend's /health turns 503 while every engine process lives (here
    ENGINE_CORE_DEAD arrives on its output socket; a hung engine or a lost
    connection does the same): serve stops everything and exits 1 saying so."""
    serve = Serve("--model", "echo", "--port", "0")
    try:
        serve.wait_ready()
        processes = serve.descendants()
        directory = serve.socket_dir
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            push.connect(f"ipc://{directory}/output-0")
            push.send(ENGINE_CORE_DEAD)
            push.close(linger=10_000)
        finally:
            ctx.term()
        assert serve.wait(30) == 1, serve.output
        assert "error: the frontend reports an engine lost: " in serve.output, serve.output
        assert_all_gone(processes, within_s=1)
        assert not os.path.lexists(directory)
    finally:
        serve.kill()


@pytest.mark.parametrize("victim", ["engine", "frontend"])
@needs_frontend
def test_process_killed_mid_stream(victim):
    """The stream ends with an error, serve exits 1 naming the process (no
    timing asserted: the bound is the wait's generous deadline), and nothing
    is left running."""
    serve = Serve("--model", "toy", "--port", "0", "--max-model-len", "2048")
    try:
        stream = start_long_stream(serve)
        processes = serve.descendants()
        pid = engine_pids(serve)[0] if victim == "engine" else frontend_pid(serve)
        os.kill(pid, signal.SIGKILL)
        received, error = drain_until_error(stream)
        assert error is not None, f"the stream ended cleanly after {received} more chunks"
        if victim == "engine":  # told through ENGINE_CORE_DEAD: an error chunk
            assert isinstance(error, openai.APIError) and "ENGINE_CORE_DEAD" in str(error), error
        code = serve.wait(10)
        named = (
            "Engine core process EngineCore_0 died unexpectedly"
            if victim == "engine"
            else f"(PID: {pid}) died with exit code -9"
        )
        assert code == 1 and named in serve.output, serve.output
        assert_all_gone(processes, within_s=1)
        assert not os.path.lexists(serve.socket_dir)
    finally:
        serve.kill()


@needs_frontend
def test_sigkill_of_serve_leaves_nothing_running():
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2")
    try:
        serve.wait_ready()
        processes = serve.descendants()
        assert len(processes) >= 3  # guardian, engines, frontend
        serve.proc.kill()
        assert_all_gone(processes, within_s=1)
    finally:
        serve.kill()


def test_sigkill_of_serve_on_a_unix_socket_leaves_no_socket_file(tmp_path):
    path = tmp_path / "api.sock"
    serve = Serve("--model", "echo", "--uds", str(path))
    try:
        serve.wait_ready()
        processes = serve.descendants()
        serve.proc.kill()
        assert_all_gone(processes, within_s=1)
        assert wait_gone(str(path), within_s=1)
    finally:
        serve.kill()


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_serve_expecting_usage_error(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs serve, expects exit 2 with a one-line error; returns stderr lines."""
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", **(env or {})},
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result
    assert len(lines) == 1 and "error:" in lines[0], result.stderr
    assert "Launching" not in result.stdout and "Started" not in result.stdout, result.stdout
    return lines


def test_port_in_use_bad_model_and_bad_option_start_nothing(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        (line,) = run_serve_expecting_usage_error("--model", "echo", "--host", "127.0.0.1", "--port", str(port))
        assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line
    finally:
        taken.close()
    (line,) = run_serve_expecting_usage_error("--model", str(tmp_path / "no-such-model"))
    assert "no-such-model" in line
    (line,) = run_serve_expecting_usage_error("--no-such-option")
    assert "unrecognized arguments: --no-such-option" in line
    for count in ("2", "0"):
        (line,) = run_serve_expecting_usage_error("--model", "echo", "--api-server-count", count)
        assert f"--api-server-count {count}: one Rust frontend serves every engine" in line, line
    (line,) = run_serve_expecting_usage_error("--model", "echo", "--frontend", "python")
    assert "--frontend: invalid choice: 'python'" in line, line


BAD_NUMBERS = [
    ("--shutdown-timeout", "nan"),
    ("--shutdown-timeout", "inf"),
    ("--shutdown-timeout", "1e300"),
    ("--shutdown-timeout", "-1"),
    ("--engine-ready-timeout", "0"),
    ("--engine-ready-timeout", str(10**12)),
    ("--port", "65536"),
    ("--data-parallel-size", "0"),
    ("--max-model-len", "0"),
    ("--max-model-len", str(2**64)),
    ("--max-num-seqs", "0"),
    ("--max-num-batched-tokens", str(2**40)),
    ("--block-size", str(10**9)),
    ("--num-gpu-blocks", "0"),
    ("--seed", "-1"),
    ("--seed", str(2**64)),
]


@pytest.mark.parametrize("option, value", BAD_NUMBERS)
def test_every_numeric_option_is_checked_before_anything_starts(tmp_path, option, value):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    (line,) = run_serve_expecting_usage_error(
        "--model", "echo", "--port", "0", option, value, env={"XDG_RUNTIME_DIR": str(runtime)}
    )
    assert f"{option} " in line and "must be a number from" in line, line
    assert not list(runtime.iterdir())  # no socket directory was made


def test_empty_api_key_is_a_usage_error():
    (line,) = run_serve_expecting_usage_error("--model", "echo", "--port", "0", "--api-key", "")
    assert "--api-key: empty" in line


def test_engine_listener_failure_is_a_usage_error_leaving_no_directory(tmp_path):
    runtime = tmp_path / ("r" * 120)  # socket paths in it exceed what AF_UNIX holds
    runtime.mkdir(mode=0o700)
    (line,) = run_serve_expecting_usage_error("--model", "echo", "--port", "0", env={"XDG_RUNTIME_DIR": str(runtime)})
    assert "cannot create the engine listeners on" in line, line
    assert not list(runtime.iterdir())


@needs_frontend
def test_api_key_option_warns_and_stays_off_the_frontends_command_lines():
    key = "sk-from-the-command-line"
    serve = Serve("--model", "echo", "--port", "0", "--api-key", key)
    try:
        serve.wait_ready()
        assert "--api-key is visible to every local user" in serve.output
        for process in serve.descendants():  # serve's own command line holds it: that is what the warning is about
            assert key.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes(), process.cmdline()
        assert serve.http("GET", "/v1/models")[0] == 401
        assert serve.http("GET", "/v1/models", headers={"authorization": f"Bearer {key}"})[0] == 200
        serve.interrupt()
        assert serve.wait(30) == 0
    finally:
        serve.kill()


@pytest.mark.skipif(torch_cuda_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_a_usage_error_starting_nothing():
    (line,) = run_serve_expecting_usage_error("--model", "toy", "--device", "cuda", "--port", "0")
    assert "--device cuda" in line and "not available" in line


ENGINE_ABORTS = re.compile(r"EngineCore_0 stopped: \d+ requests finished, (\d+) aborted")


@needs_frontend
def test_client_gone_mid_stream_aborts_the_request_in_the_engine():
    serve = Serve("--model", "toy", "--port", "0", "--max-model-len", "2048")
    try:
        stream = start_long_stream(serve)
        next(iter(stream))
        stream.close()  # the client goes away, closing the connection
        # The engine handles its input in order: once a later request is
        # answered, the ABORT before it has been handled.
        later = serve.client().completions.create(model="toy", prompt="later", max_tokens=2)
        assert later.choices[0].finish_reason == "length"
        serve.interrupt()
        assert serve.wait(30) == 0
        assert ENGINE_ABORTS.search(serve.output).group(1) == "1", serve.output
    finally:
        serve.kill()
