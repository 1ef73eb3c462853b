"""What the API server's robustness tests share: a real API server process
(`APIServerProcessManager`) on a loopback port, engines that are either the
repo's echo engine processes or a `ScriptedEngine` the test plays itself over
real pyzmq sockets, and small raw-HTTP helpers. No tests live here."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
from vllm_rs.engine import make_engine_config, run_engine_core
from vllm_rs.engine.config import ClientAddresses
from vllm_rs.network_utils import make_zmq_listener
from vllm_rs.utils import APIServerProcessManager, CoreEngineProcManager

from tests.support.engine_peer import connect_as_engine

ADD, ABORT, UTILITY = b"\x00", b"\x01", b"\x03"
FINISH_LENGTH = 1
#: Generous deadline for anything a test waits on.
DEADLINE_S = 60.0


@dataclass
class RunningServer:
    """A started API server: its manager, port and engine addresses."""

    manager: APIServerProcessManager
    port: int
    input_address: str
    output_address: str
    engines: CoreEngineProcManager | None = None

    @property
    def pid(self) -> int:
        """The API server process id."""
        return self.manager.processes[0].pid

    def wait_until_serving(self) -> None:
        """Returns once `/health` answers (any status): HTTP is up."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                request("GET", self.port, "/health", timeout_s=5)
                return
            except OSError:
                assert self.manager.processes[0].is_alive(), "the API server exited during start-up"
                assert time.monotonic() < deadline, "the API server never started serving"
                time.sleep(0.05)


@contextlib.contextmanager
def api_server(
    echo_engines: int = 0,
    max_model_len: int | None = None,
    env: dict[str, str] | None = None,
    tokenizer: str | None = None,
    serve_args: dict[str, Any] | None = None,
) -> Iterator[RunningServer]:
    """One API server for one engine: `echo_engines=1` starts the repo's echo
    engine process, else the test must register an engine itself (see
    `ScriptedEngine`). `env` is set for the server (and engine) processes;
    `tokenizer` is the `--tokenizer` argument; `serve_args` adds or replaces
    `serve` arguments (`model`, ...)."""
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    http_sock = socket.socket()
    try:
        http_sock.bind(("127.0.0.1", 0))
        http_sock.listen(1024)
        listeners = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER), make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
        addresses = listeners[0].address, listeners[1].address
        engines = None
        if echo_engines:
            config = make_engine_config("echo", clients=[ClientAddresses(*addresses)])
            engines = CoreEngineProcManager(run_engine_core, echo_engines, 0, 0, config, True, addresses[0], None, True)
        args = argparse.Namespace(
            model="echo", data_parallel_size=1, api_key=None, max_model_len=max_model_len, tokenizer=tokenizer
        )
        vars(args).update(serve_args or {})
        manager = APIServerProcessManager("http://127.0.0.1", http_sock, args, 1, [listeners[0]], [listeners[1]])
        port = http_sock.getsockname()[1]
    finally:
        http_sock.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    server = RunningServer(manager, port, addresses[0], addresses[1], engines)
    try:
        yield server
    finally:
        manager.shutdown(timeout=10)
        if engines is not None:
            for process in engines.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, 18)  # SIGCONT: a stopped engine must be able to exit
            engines.shutdown(timeout=10)


class ScriptedEngine:
    """Engine 0 played by the test: a real DEALER/PUSH pair registered with
    the server; the test reads ADDs and pushes whatever outputs it wants."""

    def __init__(self, server: RunningServer, max_model_len: int = 512):
        self.ctx, self.dealer, self.push = connect_as_engine(
            server.input_address, server.output_address, 0, max_model_len
        )
        self.aborted: list[str] = []

    def next_add(self, timeout_s: float = DEADLINE_S) -> tuple[str, list[int], dict[str, Any]]:
        """The next ADD (request id, prompt, sampling params); ABORTs met on
        the way are recorded in `aborted`."""
        message = msgpack.unpackb(self.next_add_payload(timeout_s), strict_map_key=False)
        return message[0], message[1], message[3]

    def next_add_payload(self, timeout_s: float = DEADLINE_S) -> bytes:
        """The msgpack payload of the next ADD, as it came; ABORTs met on the
        way are recorded in `aborted`."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.dealer.poll(remaining * 1000), "no ADD arrived"
            kind, payload = self.dealer.recv_multipart()
            if kind == ADD:
                return payload
            if kind == ABORT:
                self.aborted.extend(msgpack.unpackb(payload))

    def wait_for_abort(self, request_id: str, timeout_s: float = DEADLINE_S) -> None:
        """Returns once ABORT for `request_id` arrived."""
        deadline = time.monotonic() + timeout_s
        while request_id not in self.aborted:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.dealer.poll(remaining * 1000), f"no ABORT for {request_id}"
            kind, payload = self.dealer.recv_multipart()
            if kind == ABORT:
                self.aborted.extend(msgpack.unpackb(payload))

    def send_outputs(self, outputs: list[list[Any]]) -> None:
        """Pushes one well-formed batch."""
        self.push.send(msgpack.packb([0, outputs, {"num_running_reqs": 0, "num_waiting_reqs": 0}, time.time()]))

    def close(self) -> None:
        """Closes the sockets and the context."""
        self.dealer.close(linger=0)
        self.push.close(linger=0)
        self.ctx.term()


def request(method: str, port: int, path: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout_s: float = DEADLINE_S) -> tuple[int, dict[str, Any] | bytes]:  # fmt: skip
    """One HTTP request on a fresh connection; the status and the JSON body
    (raw bytes when it is not JSON)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw
    finally:
        connection.close()


def in_background(fn: Any, *args: Any) -> Future:
    """Runs `fn(*args)` on a thread (an HTTP call while the test plays the engine)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def assert_error_shape(status: int, body: Any, expected_status: int | None = None, param: str | None = None) -> None:
    """`body` is an OpenAI error with `status` (4xx unless given), naming `param` when given."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == status, (status, error)
    if expected_status is not None:
        assert status == expected_status, (status, error)
    else:
        assert 400 <= status < 500, (status, error)
    if param is not None:
        assert error["param"] == param, error
    assert "Traceback" not in error["message"] and "Error(" not in error["message"], error
