"""vLLM 0.33's `tests/entrypoints/test_api_server_process_manager.py`,
adapted to take `APIServerProcessManager`, `RustFrontendProcessManager` and
`wait_for_completion_or_failure` from `vllm_rs.utils` (and `make_zmq_listener`
/ `make_zmq_socket` from `vllm_rs.network_utils`) instead of vLLM. Written
anew for this project; each test keeps the intent of the vLLM case of the
same name. Differences:

- vLLM's tests set a module global for the workers' run time, which a
  spawned child never sees (it re-imports the module); here the run time
  travels to the worker as its `args`.
- vLLM marks two cases `@pytest.mark.timeout(30)` (pytest-timeout); here
  every wait has its own bound instead, and waits on an event (the workers
  printing that they run) where vLLM's sleeps a fixed time.
- vLLM checks that the Rust frontend's launch log shows `"hf_token": "***"`;
  `vllm_rs` leaves secrets out of `--args-json` altogether and passes them
  in the child's environment, so this checks that instead (neither secret
  in the log line nor on the command line).

Skips unless vLLM is importable, like the rest of tests/compat (README.md).
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
import time
from unittest.mock import patch

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

import zmq  # noqa: E402
from vllm_rs.network_utils import make_zmq_listener, make_zmq_socket  # noqa: E402
from vllm_rs.utils import APIServerProcessManager, wait_for_completion_or_failure  # noqa: E402

from tests.support.api_server_workers import adopting_worker, sleeping_worker  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402


def manager_kwargs(runtime_s: float, with_stats_update: bool = True) -> dict:
    kwargs = {
        "target_server_fn": sleeping_worker,
        "listen_address": "localhost:8000",
        "sock": socket.socket(),
        "args": runtime_s,
        "num_servers": 3,
        "input_listeners": [make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER) for _ in range(3)],
        "output_listeners": [make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL) for _ in range(3)],
    }
    if with_stats_update:
        kwargs["stats_update_address"] = "tcp://127.0.0.1:7000"
    return kwargs


def watch_in_thread(manager, **kwargs) -> tuple[threading.Thread, dict]:
    """Runs `wait_for_completion_or_failure(manager, **kwargs)` in a thread
    that shuts the manager down when it returns; the exception lands in the
    returned dict."""
    result: dict = {"exception": None}

    def run() -> None:
        try:
            wait_for_completion_or_failure(api_server_manager=manager, **kwargs)
        except Exception as e:
            result["exception"] = e
        finally:
            manager.shutdown()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_until_watching(caplog) -> None:
    """Returns once the watcher thread has started waiting (it logs that first),
    so that what the test does next happens while it waits."""
    wait_until(lambda: "Waiting for API servers to complete" in caplog.text, "the watcher to start waiting", 30)


@pytest.mark.parametrize("with_stats_update", [True, False])
def test_api_server_process_manager_init(with_stats_update, capfd):
    kwargs = manager_kwargs(1.0, with_stats_update)
    manager = APIServerProcessManager(**kwargs)
    try:
        assert len(manager.processes) == 3
        # The parent's copies of the listeners are closed once the children have them.
        assert all(
            listener.socket.fileno() == -1 for listener in (*kwargs["input_listeners"], *kwargs["output_listeners"])
        )
        assert all(proc.is_alive() for proc in manager.processes)
        # Each child runs its target (and so has adopted what it was given).
        printed: list[str] = []
        wait_until(
            lambda: (
                printed.append(capfd.readouterr().out)
                or all(f"worker {i} sleeps" in "".join(printed) for i in range(3))
            ),
            "every worker to run",
            30,
        )
        assert all(proc.is_alive() for proc in manager.processes)
    finally:
        manager.shutdown()
        kwargs["sock"].close()
    assert not any(proc.is_alive() for proc in manager.processes)


def test_api_server_child_adopts_inherited_zmq_listeners():
    input_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
    output_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    http_socket = socket.socket()
    manager = APIServerProcessManager(
        target_server_fn=adopting_worker,
        listen_address="localhost:8000",
        sock=http_socket,
        args=None,
        num_servers=1,
        input_listeners=[input_listener],
        output_listeners=[output_listener],
    )
    ctx = zmq.Context()
    dealer = make_zmq_socket(ctx, input_listener.address, zmq.DEALER, bind=False, identity=b"test")
    push = make_zmq_socket(ctx, output_listener.address, zmq.PUSH, bind=False)
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        assert input_listener.socket.fileno() == -1 and output_listener.socket.fileno() == -1
        dealer.send(b"input")
        push.send(b"output")
        assert dealer.recv() == b"ok"
        manager.processes[0].join(10)
        assert manager.processes[0].exitcode == 0
    finally:
        manager.shutdown()
        dealer.close(linger=0)
        push.close(linger=0)
        ctx.term()
        http_socket.close()


@patch("vllm_rs.utils.run_api_server_worker_proc", sleeping_worker)
def test_wait_for_completion_or_failure(caplog):
    caplog.set_level(logging.INFO, logger="vllm_rs")
    kwargs = manager_kwargs(5.0)
    manager = APIServerProcessManager(**kwargs)
    try:
        assert len(manager.processes) == 3
        thread, result = watch_in_thread(manager)
        wait_until_watching(caplog)
        assert all(proc.is_alive() for proc in manager.processes)
        manager.processes[0].terminate()  # one API server fails
        thread.join(timeout=5.0)  # vLLM allows 1 s; a loaded 2-core machine needs more
        assert not thread.is_alive()
        assert result["exception"] is not None and "died with exit code" in str(result["exception"])
        for i, proc in enumerate(manager.processes):
            assert not proc.is_alive(), f"process {i} should not be alive"
    finally:
        manager.shutdown()
        kwargs["sock"].close()


def test_normal_completion():
    kwargs = manager_kwargs(0.1)
    manager = APIServerProcessManager(**kwargs)
    try:
        wait_until(lambda: not any(proc.is_alive() for proc in manager.processes), "every worker to finish", 30)
        assert all(proc.exitcode == 0 for proc in manager.processes)
        started = time.monotonic()
        wait_for_completion_or_failure(api_server_manager=manager)  # all done: returns at once, no error
        assert time.monotonic() - started < 5
    finally:
        manager.shutdown()
        kwargs["sock"].close()


def test_external_process_monitoring(caplog):
    caplog.set_level(logging.INFO, logger="vllm_rs")
    # A plain multiprocessing process (stands in for the DP coordinator's),
    # not one started by vllm_rs: its sentinel is a pipe, not a pid fd.
    external = multiprocessing.get_context("spawn").Process(
        target=sleeping_worker, args=("localhost:8000", None, 100), name="MockExternalProcess"
    )
    external.start()

    class MockCoordinator:
        def __init__(self, proc):
            self.proc = proc

        def shutdown(self):
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=5)

    coordinator = MockCoordinator(external)
    kwargs = manager_kwargs(100)
    manager = APIServerProcessManager(**kwargs)
    try:
        assert len(manager.processes) == 3
        thread, result = watch_in_thread(manager, coordinator=coordinator)
        wait_until_watching(caplog)
        external.terminate()
        thread.join(timeout=5.0)
        assert not thread.is_alive(), "wait_for_completion_or_failure is still running"
        message = str(result["exception"])
        assert result["exception"] is not None, "no exception was raised"
        assert "died with exit code" in message and "MockExternalProcess" in message, message
        for i, proc in enumerate(manager.processes):
            assert not proc.is_alive(), f"API server process {i} was not terminated"
    finally:
        manager.shutdown()
        coordinator.shutdown()
        kwargs["sock"].close()


def test_rust_frontend_launch_log_redacts_credentials(monkeypatch, caplog):
    """No secret in the launch log line or on the frontend's command line;
    they reach it in its environment."""
    import vllm_rs.process.rust_frontend as rust_frontend
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_rs.utils import RustFrontendProcessManager

    hf_token, api_key = "hf_TESTTOKEN123", "sk-TESTKEY456"
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", "org/model", "--hf-token", hf_token, "--api-key", api_key]
    )
    spawned: dict = {}

    class FakeProc:
        name, pid, exitcode = "RustFrontend", 4321, 0

        def is_alive(self):
            return False

    def fake_spawn_executable(cmd, *, name, env=None, pass_fds=()):
        spawned.update(cmd=list(cmd), env=dict(env or {}))
        return FakeProc()

    monkeypatch.setattr(rust_frontend, "spawn_executable", fake_spawn_executable)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    input_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
    output_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    try:
        with caplog.at_level("INFO", logger="vllm_rs.utils"):
            manager = RustFrontendProcessManager(
                "/nonexistent/vllm-rs", sock, args, input_listener, output_listener, 0, 1, 1
            )
            manager.shutdown()
    finally:
        sock.close()
    assert "Launching Rust frontend:" in caplog.text
    for secret in (hf_token, api_key):
        assert secret not in caplog.text
        assert not any(secret in arg for arg in spawned["cmd"])
    assert spawned["env"]["VLLM_API_KEY"] == api_key and spawned["env"]["HF_TOKEN"] == hf_token
