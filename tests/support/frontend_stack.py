"""A Rust frontend of a test's (or benchmark's) own, started as vLLM starts
its frontend (`RustFrontendProcessManager`: the HTTP socket and both engine
listeners inherited, the arguments in `--args-json`), in front of whatever
engines the caller connects to the listeners. The one way tests and
benchmarks start a frontend without `serve`. No tests live here."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
from vllm_rs.network_utils import ZmqListener, make_zmq_listener
from vllm_rs.utils import RustFrontendProcessManager


@dataclass
class EngineListeners:
    """The frontend's two engine listeners on loopback TCP: the engines'
    DEALERs connect to `input` (ROUTER), their PUSHes to `output` (PULL)."""

    input: ZmqListener
    output: ZmqListener


def engine_listeners() -> EngineListeners:
    """A fresh pair of engine listeners on ephemeral loopback ports (engines
    may connect before a frontend takes them over: they queue in the backlog)."""
    return EngineListeners(
        make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER), make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    )


@dataclass
class Frontend:
    """A running frontend: its manager and its HTTP port on 127.0.0.1."""

    manager: RustFrontendProcessManager
    port: int

    @property
    def process(self):
        """The frontend's process handle."""
        return self.manager.processes[0]


@contextlib.contextmanager
def _stderr_to(log_path: Path | None) -> Iterator[None]:
    """Points fd 2 at `log_path` (appending) while the frontend starts, so it logs there."""
    if log_path is None:
        yield
        return
    saved = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    """`variables` set in this process's environment, and removed again."""
    os.environ.update(variables)
    try:
        yield
    finally:
        for name in variables:
            os.environ.pop(name, None)


@contextlib.contextmanager
def rust_frontend(
    args: argparse.Namespace,
    listeners: EngineListeners | None = None,
    *,
    binary: str | os.PathLike | None = None,
    engine_count: int = 1,
    backlog: int = 128,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    before_start: Callable[[int], None] | None = None,
) -> Iterator[Frontend]:
    """Binds an HTTP socket on an ephemeral port of 127.0.0.1 (listening with
    `backlog`), calls `before_start(port)`, then starts `binary` (None: this
    package's `vllm-rs`) with `args` over `listeners` (default: a fresh
    `engine_listeners()`) for `engine_count` engines (also its data-parallel
    size). Its stderr goes to `log_path` when given; `env` is set in this
    process's environment only while it starts, so that only the frontend
    inherits it. This process's copy of the HTTP socket is closed once the
    frontend runs. Yields the `Frontend`, which is shut down (with its
    listeners) on exit; on a failed start the listeners are cleaned up."""
    listeners = listeners or engine_listeners()
    http = socket.socket()
    try:
        http.bind(("127.0.0.1", 0))
        http.listen(backlog)
        port = http.getsockname()[1]
        if before_start is not None:
            before_start(port)
        with _stderr_to(log_path), _environment(env or {}):
            manager = RustFrontendProcessManager(
                None if binary is None else os.fspath(binary),
                http,
                args,
                listeners.input,
                listeners.output,
                0,
                engine_count,
                engine_count,
            )
    except BaseException:
        listeners.input.cleanup()
        listeners.output.cleanup()
        raise
    finally:
        http.close()
    try:
        yield Frontend(manager, port)
    finally:
        manager.shutdown()
