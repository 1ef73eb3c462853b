"""`python -m vllm_rs serve` as a process, and `Serve`, the handle on one
that the other `serve` suites (tests/conformance/ included) start stacks
with: a model directory served, the Python-only options refused, and usage
reporting.
What the HTTP surface does is asserted in tests/conformance/."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import psutil
import pytest
from vllm_rs.engine.model_loader.registry import write_model_dir

from tests.support.wait import WaitTimeout, wait_until

READY_TIMEOUT_S = 120
API_KEY = "sk-test-key"
READY_LINE = re.compile(r"serving the OpenAI API on (http://\S+|unix:\S+) ")
SOCKET_DIR_LINE = re.compile(r"engine sockets in (\S+) ")


def rust_frontend_available() -> bool:
    try:
        from vllm_rs.serving.frontend_binary import frontend_binary

        frontend_binary()
        return True
    except (ImportError, FileNotFoundError):
        return False


def skip_module_unless_packaged_model_serves() -> None:
    """Skips the calling test module, saying why, unless both the packaged
    SmolLM2 GGUF and the vllm-rs binary are there (for suites that serve it)."""
    from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

    try:
        packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}", allow_module_level=True)
    if not rust_frontend_available():
        pytest.skip("the vllm-rs binary is not built", allow_module_level=True)


#: Marks a test that starts the frontend: skipped, saying why, where the binary is not built.
needs_frontend = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")


class Serve:
    """A `serve` process in its own session (so a Ctrl-C can reach its whole
    process group), its output collected line by line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.args = args
        environment = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_rs", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()
            match = READY_LINE.search(line)
            if match and self.url is None:
                self.url = match.group(1).replace("0.0.0.0", "127.0.0.1")
                self._ready.set()
        self._ready.set()
        with self._new_line:
            self._new_line.notify_all()

    def wait_for_line(self, pattern: str, timeout_s: float = READY_TIMEOUT_S) -> re.Match:
        """The first output line matching the regex `pattern`, waiting for it
        while the process runs."""
        deadline = time.monotonic() + timeout_s
        with self._new_line:
            while True:
                for line in self.lines:
                    if match := re.search(pattern, line):
                        return match
                remaining = deadline - time.monotonic()
                assert remaining > 0 and self._reader.is_alive(), f"no line matching {pattern!r} in:\n{self.output}"
                self._new_line.wait(remaining)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        self._ready.wait(timeout_s)
        assert self.url is not None, f"serve did not become ready:\n{self.output}"
        return self.url

    def client(self, api_key: str = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.wait_ready()}/v1", api_key=api_key, max_retries=0, timeout=60)

    def http(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.wait_ready() + path, data=data, method=method, headers=headers or {})
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    @property
    def socket_dir(self) -> str:
        """The private directory of the engine sockets (from serve's log)."""
        match = SOCKET_DIR_LINE.search(self.output)
        assert match, f"serve did not log its socket directory:\n{self.output}"
        return match.group(1)

    def stack_processes(self) -> list[psutil.Process]:
        """serve and every process below it."""
        return [psutil.Process(self.proc.pid), *self.descendants()]

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(10)
        return code

    def interrupt(self) -> None:
        """Ctrl-C at a terminal: SIGINT to the whole process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """Leaves nothing behind (test cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for child in self.descendants():
            child.kill()
        if self.proc.stdout:
            self._reader.join(10)
            self.proc.stdout.close()


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None, timeout_s: float = 600):
    """A `Serve` of `args`, yielded once it is ready (a real model may take
    minutes on a loaded machine) and killed when the block ends."""
    serve = Serve(*args, env=env)
    try:
        serve.wait_ready(timeout_s=timeout_s)
        yield serve
    finally:
        serve.kill()


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def assert_all_gone(processes: list[psutil.Process], within_s: float) -> None:
    """Every one of `processes` exits within `within_s`."""
    try:
        wait_until(lambda: not _running(processes), "every process to exit", within_s)
    except WaitTimeout:
        raise AssertionError(f"still running: {[(p.pid, p.name()) for p in _running(processes)]}") from None


@needs_frontend
def test_model_directory(tmp_path):
    model_dir = write_model_dir(str(tmp_path / "my-echo"), "echo")
    serve = Serve("--model", model_dir, "--port", "0")
    try:
        client = serve.client()
        assert [m.id for m in client.models.list().data] == [model_dir]
        assert client.completions.create(model=model_dir, prompt="dir", max_tokens=4).choices[0].text == "dird"
        serve.interrupt()
        assert serve.wait(30) == 0
    finally:
        serve.kill()


@needs_frontend
def test_usage_is_reported_once(tmp_path):
    serve = Serve("--model", "echo", "--port", "0",
                  env={"VLLM_NO_USAGE_STATS": "", "VLLM_DO_NOT_TRACK": "", "DO_NOT_TRACK": "", "VLLM_CONFIG_ROOT": str(tmp_path)})  # fmt: skip
    try:
        serve.wait_ready()
        serve.interrupt()
        assert serve.wait(30) == 0
    finally:
        serve.kill()
    records = [json.loads(line) for line in (tmp_path / "usage_stats.json").read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["context"] == "OPENAI_API_SERVER" and records[0]["model_architecture"] == "EchoModel"
    assert records[0]["data_parallel_size"] == 1 and records[0]["max_model_len"] == 8192
