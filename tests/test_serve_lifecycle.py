"""`serve` keeping the stack healthy and stopping it: Ctrl-C, SIGTERM, an
engine killed mid-stream, the frontend killed mid-stream, SIGKILL of serve,
and the usage errors that start nothing. Both frontends where it matters."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.test_serve import FRONTENDS, Serve, assert_all_gone

ENGINE_PID = re.compile(r"EngineCore_(\d+) ready \(pid (\d+)\)")
API_SERVER_PID = re.compile(r"\(APIServer_0 pid=(\d+)\)")
ENGINE_TOTALS = re.compile(r"EngineCore_(\d+) stopped: (\d+) requests finished")


def engine_pids(serve: Serve) -> dict[int, int]:
    return {int(rank): int(pid) for rank, pid in ENGINE_PID.findall(serve.output)}


def frontend_pid(serve: Serve, frontend: str) -> int:
    if frontend == "python":
        return int(API_SERVER_PID.search(serve.output).group(1))
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


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_ctrl_c_drains_exits_0_and_both_engines_served(frontend):
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2", "--frontend", frontend)
    try:
        client = serve.client()
        with ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda i: client.completions.create(model="echo", prompt=f"r{i:02d}", max_tokens=200).choices[0].text, range(48)))
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


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_sigterm_exits_0_and_removes_the_unix_socket(tmp_path, frontend):
    path = str(tmp_path / "api.sock")
    serve = Serve("--model", "echo", "--uds", path, "--frontend", frontend)
    try:
        assert serve.wait_ready().startswith("unix:")
        conn = http.client.HTTPConnection("localhost")
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.connect(path)
        conn.request("POST", "/v1/completions", body='{"prompt": "uds", "max_tokens": 3}', headers={"content-type": "application/json"})
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


@pytest.mark.parametrize("victim", ["engine", "frontend"])
@pytest.mark.parametrize("frontend", FRONTENDS)
def test_process_killed_mid_stream(frontend, victim):
    """The stream ends with an error, serve exits 1 within 2 s naming the
    process, and nothing is left running."""
    serve = Serve("--model", "toy", "--port", "0", "--max-model-len", "2048", "--frontend", frontend)
    try:
        stream = start_long_stream(serve)
        processes = serve.descendants()
        pid = engine_pids(serve)[0] if victim == "engine" else frontend_pid(serve, frontend)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        received, error = drain_until_error(stream)
        assert error is not None, f"the stream ended cleanly after {received} more chunks"
        if victim == "engine":  # told through ENGINE_CORE_DEAD: an error chunk
            assert isinstance(error, openai.APIError) and "ENGINE_CORE_DEAD" in str(error), error
        code = serve.wait(10)
        assert time.monotonic() - killed_at < 2.0, serve.output
        named = "Engine core process EngineCore_0 died unexpectedly" if victim == "engine" else f"(PID: {pid}) died with exit code -9"
        assert code == 1 and named in serve.output, serve.output
        assert_all_gone(processes, within_s=1)
    finally:
        serve.kill()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_sigkill_of_serve_leaves_nothing_running(frontend):
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2", "--frontend", frontend)
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
        deadline = time.monotonic() + 1
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not path.exists()
    finally:
        serve.kill()


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_serve_expecting_usage_error(*args: str) -> list[str]:
    """Runs serve, expects exit 2 with a one-line error; returns stderr lines."""
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VLLM_NO_USAGE_STATS": "1"},
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
    (line,) = run_serve_expecting_usage_error("--frontend", "rust", "--api-server-count", "2")
    assert "--api-server-count" in line


@pytest.mark.skipif(torch_cuda_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_a_usage_error_starting_nothing():
    (line,) = run_serve_expecting_usage_error("--model", "toy", "--device", "cuda", "--port", "0")
    assert "--device cuda" in line and "not available" in line


ENGINE_ABORTS = re.compile(r"EngineCore_0 stopped: \d+ requests finished, (\d+) aborted")


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_client_gone_mid_stream_aborts_the_request_in_the_engine(frontend):
    serve = Serve("--model", "toy", "--port", "0", "--max-model-len", "2048", "--frontend", frontend)
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
