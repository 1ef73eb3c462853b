"""The two Rust frontends the benchmarks compare, launched the same way on
the same engines: this project's `vllm-rs` and the one vLLM 0.33 bundles in
its wheel (`site-packages/vllm/vllm-rs`).

Both are started as vLLM starts its frontend (`RustFrontendProcessManager`:
`frontend --listen-fd --input-listener-fd --output-listener-fd --args-json`,
the HTTP socket and both engine listeners inherited), in front of this
project's reference engines (`echo`, so the engines cost the same whichever
frontend asks), serving one model directory: a byte-level BPE tokenizer
(`tests/fixtures/tokenizers/byte-bpe`, no BOS) under the name `toy`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import select
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from tests.support.frontend_stack import EngineListeners

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FIXTURE = ROOT / "tests" / "fixtures" / "tokenizers" / "byte-bpe"
#: Where the throwaway vLLM 0.33 venv is (tests/compat/README.md), unless VLLM033_VENV says.
VLLM033_VENV = Path(os.environ.get("VLLM033_VENV") or Path.home() / ".cache" / "vllm033")
#: Connections each engine opens to a frontend's listeners: DEALER to input, PUSH to output.
ENGINE_CONNECTIONS = 1


def vllm033_frontend() -> tuple[Path | None, str]:
    """vLLM 0.33's bundled frontend binary, or None and why it is not there."""
    found = sorted(glob.glob(str(VLLM033_VENV / "lib" / "python3*" / "site-packages" / "vllm" / "vllm-rs")))
    if not found:
        return (
            None,
            f"vLLM 0.33 is not installed in {VLLM033_VENV} (no site-packages/vllm/vllm-rs; see tests/compat/README.md)",
        )
    return Path(found[0]), ""


def our_frontend() -> Path:
    """This project's `vllm-rs` binary (VLLM_RS_FRONTEND_PATH, else the installed one)."""
    from vllm_rs.serving.frontend_binary import frontend_binary

    return Path(frontend_binary())


def write_model_dir(directory: Path) -> Path:
    """A model directory both frontends and the `echo` engines serve: the
    byte-level tokenizer fixture without its BOS (an answer echoes the
    prompt's bytes), and a config naming the `echo` engine."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = json.loads((TOKENIZER_FIXTURE / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    shutil.copy(TOKENIZER_FIXTURE / "tokenizer_config.json", directory / "tokenizer_config.json")
    config = {
        "model_type": "echo",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 260,
        "max_position_embeddings": 4096,
        "eos_token_id": 258,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@dataclass
class Engines:
    """Reference `echo` engines waiting on a pair of listeners."""

    manager: object
    listeners: EngineListeners
    count: int


@contextlib.contextmanager
def echo_engines(model_dir: Path, count: int) -> Iterator[Engines]:
    """`count` reference engines serving `model_dir`, connected (and queued in
    the backlog) on a fresh pair of TCP listeners no frontend accepts yet."""
    from vllm_rs.engine import run_engine_core
    from vllm_rs.engine.config import ClientAddresses, make_engine_config
    from vllm_rs.utils import CoreEngineProcManager

    from tests.support.frontend_stack import engine_listeners

    listeners = engine_listeners()
    config = make_engine_config(str(model_dir), data_parallel_size=count, log_stats=False)
    config.clients = [ClientAddresses(listeners.input.address, listeners.output.address)]
    manager = CoreEngineProcManager(
        run_engine_core, count, 0, 0, config, True, listeners.input.address, None, False
    )  # fmt: skip
    try:
        for listener in (listeners.input, listeners.output):
            wait_backlog(listener.address, count * ENGINE_CONNECTIONS, deadline=time.monotonic() + 120)
        yield Engines(manager, listeners, count)
    finally:
        manager.shutdown()
        for listener in (listeners.input, listeners.output):
            listener.cleanup()


def wait_backlog(address: str, connections: int, deadline: float) -> None:
    """Waits until the TCP listener at `address` (`tcp://127.0.0.1:PORT`)
    holds `connections` connections nobody accepted yet: the kernel's accept
    queue length, `rx_queue` of a LISTEN socket in /proc/net/tcp."""
    port = int(address.rsplit(":", 1)[1])
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                if state == "0A" and int(local.split(":")[1], 16) == port:
                    if int(queues.split(":")[1], 16) >= connections:
                        return
        time.sleep(0.01)
    raise RuntimeError(f"the engines did not connect to {address}")


@dataclass
class Stack:
    """A frontend serving over the engines: its HTTP port and pid, and the
    seconds from its spawn to its first 200 on /health."""

    port: int
    pid: int
    startup_s: float


@contextlib.contextmanager
def frontend_stack(binary: Path, model_dir: Path, engines: Engines, log_path: Path, **args: object) -> Iterator[Stack]:
    """`binary` started as vLLM's RustFrontendProcessManager starts it, in
    front of `engines` (which it takes over: one frontend per Engines);
    extra `args` go to `--args-json`. Start-up is timed from the spawn (the
    manager's call to `spawn_executable`, once it has built the command line,
    which costs the same whichever binary it names) to the first 200 on
    /health, as `HealthProbe` reads it."""
    from vllm_rs.process import rust_frontend as launch

    from tests.support.frontend_stack import rust_frontend

    namespace = argparse.Namespace(
        model=str(model_dir), served_model_name=["toy"], disable_log_stats=True, max_model_len=4096, **args
    )
    probes: list[HealthProbe] = []
    spawned: list[float] = []
    spawn = launch.spawn_executable

    def timed_spawn(*spawn_args: Any, **spawn_kwargs: Any) -> Any:
        spawned.append(time.perf_counter())
        return spawn(*spawn_args, **spawn_kwargs)

    with (
        mock.patch.object(launch, "spawn_executable", timed_spawn),
        rust_frontend(
            namespace, engines.listeners, binary=binary, engine_count=engines.count, backlog=1024, log_path=log_path,
            before_start=lambda port: probes.append(HealthProbe(port)),
        ) as frontend,
    ):  # fmt: skip
        try:
            healthy = probes[0].wait(frontend.process)
            yield Stack(frontend.port, frontend.process.pid, healthy - spawned[0])
        finally:
            probes[0].close()


class HealthProbe:
    """Times the first 200 on /health without polling at an interval: the
    request is sent before the frontend starts, into the accept queue of the
    HTTP listener, so the answer comes as soon as the frontend accepts and
    serves it. An answer other than 200 (not ready yet; neither frontend
    gives one, both accept HTTP connections once ready) is followed by the
    same request on a new connection after `RETRY_S`, so that a frontend
    answering 503 is not flooded while it starts."""

    REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    RETRY_S = 0.001

    def __init__(self, port: int):
        self.port = port
        self.connection = self._send()

    def _send(self) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", self.port))
        connection.sendall(self.REQUEST)
        return connection

    def wait(self, process: Any, timeout: float = 120) -> float:
        """`time.perf_counter()` once a 200 has been read; raises when
        `process` exits first or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.is_alive():
            if self._status(process, deadline) == b"200":
                return time.perf_counter()
            self.connection.close()
            time.sleep(self.RETRY_S)
            self.connection = self._send()
        if not process.is_alive():
            raise RuntimeError("the frontend exited during start-up")
        raise RuntimeError("the frontend did not become healthy")

    def _status(self, process: Any, deadline: float) -> bytes | None:
        """The status code answered on the current connection, or None when
        it closed (or the frontend exited) without one."""
        answer = b""
        while b"\r\n" not in answer and time.monotonic() < deadline:
            # Woken by the answer; the timeout is only there to notice an exit.
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if not readable:
                if not process.is_alive():
                    return None
                continue
            try:
                chunk = self.connection.recv(4096)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            answer += chunk
        parts = answer.split(b" ", 2)
        return parts[1] if len(parts) > 2 else None

    def close(self) -> None:
        """Closes the current connection."""
        self.connection.close()


def rss_mib(pid: int) -> float:
    """Resident memory of `pid`, MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used (all its threads, ended ones
    included), seconds, read from the kernel's CPU clock of the process
    (nanoseconds; /proc/PID/stat counts 10 ms ticks, a tenth of what a
    streamed round costs the frontend)."""
    # clock_getcpuclockid(3) for another process: CPUCLOCK_SCHED of the whole thread group.
    return time.clock_gettime((~pid << 3) | 2)


def frontends_to_compare() -> tuple[dict[str, Path], str]:
    """Ours, and vLLM 0.33's bundled frontend where it is installed (printing
    why not where it is not, and returning that reason, else ""): the
    frontends a benchmark puts side by side."""
    frontends = {"ours": our_frontend()}
    vllm_binary, why_not = vllm033_frontend()
    if vllm_binary is None:
        print(f"vLLM 0.33 baseline skipped: {why_not}")
    else:
        frontends["vllm033"] = vllm_binary
    return frontends, why_not
