"""The two Rust frontends the benchmarks compare, launched the same way on
the same engines: this project's `vllm-rs` and the one vLLM 0.33 bundles in
its wheel (`site-packages/vllm/vllm-rs`).

Both are started as vLLM starts its frontend (`RustFrontendProcessManager`:
`frontend --listen-fd --input-listener-fd --output-listener-fd --args-json`,
the HTTP socket and both engine listeners inherited), in front of this
project's reference engines (`echo`, so the engines cost the same whichever
frontend asks), serving one model directory: a byte-level BPE tokenizer
(`frontend-bin/tests/fixtures/byte-bpe`, no BOS) under the name `toy`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FIXTURE = ROOT / "frontend-bin" / "tests" / "fixtures" / "byte-bpe"
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
    from vllm_rs.frontend import frontend_binary

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
    input_listener: object
    output_listener: object
    count: int


@contextlib.contextmanager
def echo_engines(model_dir: Path, count: int) -> Iterator[Engines]:
    """`count` reference engines serving `model_dir`, connected (and queued in
    the backlog) on a fresh pair of TCP listeners no frontend accepts yet."""
    from vllm_rs.engine import run_engine_core
    from vllm_rs.engine.config import ClientAddresses, make_engine_config
    from vllm_rs.network_utils import make_zmq_listener
    from vllm_rs.utils import CoreEngineProcManager

    input_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
    output_listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    config = make_engine_config(str(model_dir), data_parallel_size=count, log_stats=False)
    config.clients = [ClientAddresses(input_listener.address, output_listener.address)]
    manager = CoreEngineProcManager(
        run_engine_core, count, 0, 0, config, True, input_listener.address, None, False
    )  # fmt: skip
    try:
        for listener in (input_listener, output_listener):
            wait_backlog(listener.address, count * ENGINE_CONNECTIONS, deadline=time.monotonic() + 120)
        yield Engines(manager, input_listener, output_listener, count)
    finally:
        manager.shutdown()
        for listener in (input_listener, output_listener):
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
    extra `args` go to `--args-json`."""
    from vllm_rs.utils import RustFrontendProcessManager

    http = socket.socket()
    http.bind(("127.0.0.1", 0))
    http.listen(1024)
    port = http.getsockname()[1]
    namespace = argparse.Namespace(
        model=str(model_dir), served_model_name=["toy"], disable_log_stats=True, max_model_len=4096, **args
    )
    saved = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            spawned = time.perf_counter()
            frontend = RustFrontendProcessManager(
                str(binary), http, namespace, engines.input_listener, engines.output_listener, 0, engines.count,
                engines.count,
            )  # fmt: skip
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    http.close()
    try:
        startup = wait_healthy(port, frontend, spawned)
        yield Stack(port, frontend.processes[0].pid, startup)
    finally:
        frontend.shutdown()


def wait_healthy(port: int, frontend, spawned: float) -> float:
    """Seconds from `spawned` to the first 200 on /health."""
    deadline = time.monotonic() + 120
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() < deadline:
        if not frontend.processes[0].is_alive():
            raise RuntimeError("the frontend exited during start-up")
        with contextlib.suppress(OSError, urllib.error.HTTPError):
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - spawned
        time.sleep(0.001)
    raise RuntimeError("the frontend did not become healthy")


def rss_mib(pid: int) -> float:
    """Resident memory of `pid`, MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
