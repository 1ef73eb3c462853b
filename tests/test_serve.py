"""`python -m vllm_rs serve` end to end with the `openai` client, one suite
run against both frontends (the Rust binary and the Python API servers):
completions and chat, streaming, stop strings and stop token ids, errors,
auth, the small routes, engine pinning, and a model directory."""

from __future__ import annotations

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
from pathlib import Path

import openai
import psutil
import pytest
from vllm_rs.engine.models import write_model_dir

READY_TIMEOUT_S = 120
API_KEY = "sk-test-key"
READY_LINE = re.compile(r"serving the OpenAI API on (http://\S+|unix:\S+) ")
SOCKET_DIR_LINE = re.compile(r"engine sockets in (\S+) ")


def rust_frontend_available() -> bool:
    try:
        from vllm_rs.frontend import frontend_binary

        frontend_binary()
        return True
    except (ImportError, FileNotFoundError):
        return False


FRONTENDS = [
    pytest.param("rust", marks=pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")),
    "python",
]


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
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = READY_LINE.search(line)
            if match and self.url is None:
                self.url = match.group(1).replace("0.0.0.0", "127.0.0.1")
                self._ready.set()
        self._ready.set()

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


def assert_all_gone(processes: list[psutil.Process], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return
        assert time.monotonic() < deadline, f"still running: {[(p.pid, p.name()) for p in alive]}"
        time.sleep(0.05)


@pytest.fixture(scope="module", params=FRONTENDS)
def stack(request):
    """echo on 2 engines behind an API key (given in the environment, as
    vLLM takes it); the Python frontend runs 2 API servers."""
    frontend = request.param
    extra = ["--api-server-count", "2"] if frontend == "python" else []
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2",
                  "--max-model-len", "512", "--frontend", frontend, *extra, env={"VLLM_API_KEY": API_KEY})  # fmt: skip
    try:
        serve.wait_ready()
        serve.frontend = frontend
        yield serve
        processes = serve.descendants()
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
    finally:
        serve.kill()


def test_api_key_is_on_no_command_line_and_is_required(stack):
    for process in stack.stack_processes():
        assert API_KEY.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes(), process.cmdline()
    assert stack.http("GET", "/v1/models")[0] == 401
    assert stack.http("GET", "/v1/models", headers={"authorization": "Bearer wrong"})[0] == 401
    assert stack.http("GET", "/v1/models", headers={"authorization": f"Bearer {API_KEY}"})[0] == 200


def test_completion(stack):
    result = stack.client().completions.create(model="echo", prompt="hello", max_tokens=7)
    choice = result.choices[0]
    assert choice.text == "hellohe" and choice.finish_reason == "length"
    assert result.id.startswith("cmpl-") and result.model == "echo"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (5, 7, 12)


def test_streamed_completion_with_usage(stack):
    chunks = list(
        stack.client().completions.create(
            model="echo", prompt="stream me", max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "stream mestr"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_and_streamed_chat(stack):
    client = stack.client()
    messages = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="echo", messages=messages, max_tokens=11)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "user: hi\nas"
    assert reply.id.startswith("chatcmpl-")
    chunks = list(client.chat.completions.create(model="echo", messages=messages, max_completion_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "user"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_and_stop_token_ids(stack):
    client = stack.client()
    by_string = client.completions.create(model="echo", prompt="hello world", max_tokens=30, stop=["wor"])
    assert by_string.choices[0].text == "hello "
    assert by_string.choices[0].finish_reason == "stop" and by_string.choices[0].model_extra["stop_reason"] == "wor"
    by_token = client.completions.create(
        model="echo", prompt="hello", max_tokens=30, extra_body={"stop_token_ids": [ord("l")]}
    )
    assert by_token.choices[0].text == "he", "as vLLM: the stop token is not in the text"
    assert by_token.choices[0].model_extra["stop_reason"] == ord("l")


def test_errors_have_the_openai_shape(stack):
    client = stack.client()
    with pytest.raises(openai.AuthenticationError):
        stack.client(api_key="wrong").completions.create(model="echo", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert not_found.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="echo", prompt="x", max_tokens=1, temperature=-1)
    assert bad.value.body["param"] == "temperature" and bad.value.body["type"] == "BadRequestError"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="echo", prompt="x" * 10, max_tokens=600)
    assert "maximum context length is 512" in too_long.value.body["message"]
    status, body = stack.http(
        "POST", "/v1/completions", {"prompt": "x"}, {"authorization": f"Bearer {API_KEY}", "x-data-parallel-rank": "7"}
    )
    assert status == 400 and json.loads(body)["error"]["param"] == "x-data-parallel-rank"
    status, body = stack.http("GET", "/no/such/route", headers={"authorization": f"Bearer {API_KEY}"})
    assert status == 404 and json.loads(body)["error"]["code"] == 404


def test_small_routes_and_open_paths(stack):
    assert stack.http("GET", "/health")[0] == 200  # open without a key
    status, metrics = stack.http("GET", "/metrics")
    assert status == 200
    for name in ("vllm:num_requests_running", "vllm:request_success_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum"):  # fmt: skip
        assert name in metrics.decode(), name
    assert stack.http("GET", "/load")[0] == 401
    auth = {"authorization": f"Bearer {API_KEY}"}
    assert json.loads(stack.http("GET", "/load", headers=auth)[1]) == {"server_load": 0}
    assert "version" in json.loads(stack.http("GET", "/version", headers=auth)[1])
    for path in ("/reset_prefix_cache", "/sleep?level=1", "/wake_up"):
        assert stack.http("POST", path, headers=auth)[0] == 200, path
    models = stack.client().models.list().data
    assert [m.id for m in models] == ["echo"] and models[0].model_extra["max_model_len"] == 512


def test_requests_pinned_to_each_engine(stack):
    client = stack.client()
    for rank in ("0", "1"):
        result = client.completions.create(
            model="echo", prompt="pin", max_tokens=3, extra_headers={"X-data-parallel-rank": rank}
        )
        assert result.choices[0].text == "pin"


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_model_directory(tmp_path, frontend):
    model_dir = write_model_dir(str(tmp_path / "my-echo"), "echo")
    serve = Serve("--model", model_dir, "--port", "0", "--frontend", frontend)
    try:
        client = serve.client()
        assert [m.id for m in client.models.list().data] == [model_dir]
        assert client.completions.create(model=model_dir, prompt="dir", max_tokens=4).choices[0].text == "dird"
        serve.interrupt()
        assert serve.wait(30) == 0
    finally:
        serve.kill()


def test_usage_is_reported_once(tmp_path):
    serve = Serve("--model", "echo", "--port", "0", "--frontend", "python",
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
