"""The Rust frontend as a process: `RustFrontendProcessManager` starts the
installed `vllm-rs` binary, `CoreEngineProcManager` starts the reference
engine with the `echo` model (as `serve` does), and the `openai` package is
the client: an engine that dies, bad `--args-json`, credentials kept out of
the logs, a graceful stop. What its HTTP surface does is in tests/conformance/."""

from __future__ import annotations

import argparse
import contextlib
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from vllm_rs.engine import make_engine_config, run_engine_core
from vllm_rs.engine.config import ClientAddresses
from vllm_rs.engine.core import FAIL_AT_STEP_ENV
from vllm_rs.utils import CoreEngineProcManager, RustFrontendProcessManager, wait_for_completion_or_failure

from tests.support.frontend_stack import engine_listeners, rust_frontend
from tests.support.wait import WaitTimeout, wait_until

READY_TIMEOUT_S = 60


@dataclass
class Stack:
    frontend: RustFrontendProcessManager
    engines: CoreEngineProcManager | None
    port: int
    log_dir: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=30)

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    def frontend_log(self) -> str:
        return (self.log_dir / "frontend.log").read_text(errors="replace")

    def wait_ready(self) -> None:
        proc = self.frontend.processes[0]

        def healthy() -> bool:
            if not proc.is_alive():
                raise AssertionError(f"frontend exited with {proc.exitcode}:\n{self.frontend_log()}")
            try:
                return self.get("/health") == 200
            except OSError:
                return False

        try:
            wait_until(healthy, "the frontend to become healthy", READY_TIMEOUT_S)
        except WaitTimeout:
            raise AssertionError(f"frontend not ready after {READY_TIMEOUT_S}s:\n{self.frontend_log()}") from None


@contextlib.contextmanager
def serving(tmp_path: Path, engine_count: int = 1, start_engines: bool = True, **args):
    """A frontend for the `echo` model with `engine_count` reference engines
    (their log goes to the test's fd 2); `args` become the server arguments."""
    listeners = engine_listeners()
    engines = None
    try:
        if start_engines:
            config = make_engine_config(
                "echo", clients=[ClientAddresses(listeners.input.address, listeners.output.address)]
            )
            engines = CoreEngineProcManager(
                run_engine_core, engine_count, 0, 0, config, True, listeners.input.address, None, True
            )
        namespace = argparse.Namespace(model="echo", **args)
        with rust_frontend(
            namespace, listeners, engine_count=engine_count, log_path=tmp_path / "frontend.log"
        ) as frontend:
            yield Stack(frontend.manager, engines, frontend.port, tmp_path)
    finally:
        if engines is not None:
            engines.shutdown()


@pytest.fixture(autouse=True)
def _short_engine_wait(monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "30")


def test_engine_death_gives_503_and_fails_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_AT_STEP_ENV, "3")  # the engine fails in its third step
    with serving(tmp_path) as stack:
        stack.wait_ready()
        with pytest.raises(openai.InternalServerError) as info:
            stack.client().completions.create(model="echo", prompt="never finished", max_tokens=50)
        assert "ENGINE_CORE_DEAD" in info.value.body["message"]
        assert stack.get("/health") == 503
        with pytest.raises(openai.InternalServerError):
            stack.client().completions.create(model="echo", prompt="after", max_tokens=5)
        with pytest.raises(RuntimeError, match="Engine core process EngineCore_0 died unexpectedly"):
            wait_for_completion_or_failure(stack.frontend, stack.engines)


def test_bad_args_json_exits_2(tmp_path):
    with serving(tmp_path, start_engines=False, max_model_len="big") as stack:
        with pytest.raises(RuntimeError, match=r"Process RustFrontend \(PID: \d+\) died with exit code 2"):
            wait_for_completion_or_failure(stack.frontend)
        assert "max_model_len" in stack.frontend_log()


def test_credentials_never_reach_the_log(tmp_path, caplog):
    secret = "sk-very-secret-4711"
    caplog.set_level(logging.INFO)
    with serving(tmp_path, api_key=secret, enable_log_requests=True) as stack:
        stack.wait_ready()
        with pytest.raises(openai.AuthenticationError):
            stack.client("wrong").completions.create(model="echo", prompt="x", max_tokens=1)
        ok = stack.client(secret).completions.create(model="echo", prompt="x", max_tokens=1)
        assert ok.choices[0].text == "x"
        assert stack.get("/health") == 200
    launch = [r.getMessage() for r in caplog.records if "Launching Rust frontend" in r.getMessage()]
    assert launch and "api_key" not in launch[0]  # the key goes to the frontend's environment
    assert secret not in caplog.text
    log = stack.frontend_log()
    assert "received request" in log  # enable_log_requests took effect
    assert secret not in log


def test_shutdown_is_graceful_exit_0(tmp_path):
    with serving(tmp_path) as stack:
        stack.wait_ready()
        proc = stack.frontend.processes[0]
        stack.frontend.shutdown()
        assert proc.exitcode == 0, stack.frontend_log()
        assert "frontend stopped" in stack.frontend_log()
