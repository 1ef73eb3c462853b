"""The servers bench_models.py measures, each a context manager yielding a
`Served` once it answers: this project's whole stack (`python -m vllm_rs
serve`) and llama.cpp's own
`llama-server`; plus the resident memory of a server's processes."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
from vllm_rs.engine.step_log import STEP_LOG_ENV

#: Environment variable naming the llama-server executable (else PATH).
LLAMA_SERVER_ENV = "VLLM_RS_LLAMA_SERVER"
#: Seconds llama-server may take to load the model and listen.
LLAMA_START_S = 300
#: The frontend fails requests when the engine is silent this long (60 s by
#: default); one step of 16 prefills takes longer than that on a loaded CPU.
STACK_ENV = {"VLLM_RS_ENGINE_STALL_TIMEOUT_S": "1800"}
#: Context tokens per llama-server slot: a 128-token prompt, 128 outputs, room.
LLAMA_SLOT_CTX = 512


class ServerStartError(RuntimeError):
    """A server exited or stayed silent instead of announcing it listens."""


@dataclass
class Served:
    """A running server: where its OpenAI API is, what model name it
    answers to, and the process whose memory holds the weights."""

    base_url: str
    model: str
    engine_pid: int


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` now."""
    return psutil.Process(pid).memory_info().rss


def _listener_pid(port: int) -> int:
    """The process listening on TCP `port` on this host."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise ServerStartError(f"no process listens on port {port}")


def engine_process(port: int) -> int:
    """The engine core of the `serve` stack whose frontend listens on
    `port`: the largest process (by RSS) under `serve` other than the
    frontend itself."""
    frontend = psutil.Process(_listener_pid(port))
    root = frontend
    while (parent := root.parent()) is not None and "vllm_rs" in " ".join(parent.cmdline()):
        root = parent
    candidates = [p for p in root.children(recursive=True) if p.pid != frontend.pid]
    if not candidates:
        raise ServerStartError(f"serve on port {port} has no engine process")
    return max(candidates, key=lambda p: p.memory_info().rss).pid


#: serve's ready line, naming its HTTP port.
READY_LINE = re.compile(rb"serving the OpenAI API on http://[^:]+:(\d+) ")


def served_port(output: Iterable[bytes], log: IO[bytes]) -> int | None:
    """The HTTP port `serve` announces in `output` (its stdout), copying each
    line read to `log`; None when it ends without announcing one."""
    for line in output:
        log.write(line)
        if match := READY_LINE.search(line):
            return int(match.group(1))
    return None


@contextlib.contextmanager
def serve_stack(*args: str, log_path: Path, log_stats: bool = False):
    """A `python -m vllm_rs serve ARGS` process; yields (its port, its pid)
    once it is ready, Ctrl-C at the end. Its output goes to `log_path`.
    Without `log_stats` it runs with `--disable-log-stats` (no scheduler
    stats, so the /metrics gauges stay at 0)."""
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_rs", "serve", "--port", "0", *([] if log_stats else ["--disable-log-stats"]), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            port = served_port(proc.stdout, log)
            if port is None:
                raise RuntimeError(f"serve {' '.join(args)} did not start; see {log_path}")
            yield port, proc.pid
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            log.write(proc.stdout.read())
            if proc.wait(60) != 0:
                print(f"  serve exited with {proc.returncode}; see {log_path}", file=sys.stderr)


@contextlib.contextmanager
def vllm_rs_stack(
    gguf: Path,
    threads: int,
    dtype: str | None,
    kv_cache_bytes: int,
    log_dir: Path,
    step_log_dir: Path,
    kernel_precision: str = "exact",
):
    """`python -m vllm_rs serve GGUF` with its engine on `threads` intra-op
    threads (OMP_NUM_THREADS) and a KV cache of `kv_cache_bytes`, one
    engine, the served model named `smollm2`, sequences capped at
    llama-server's slot context (so one stream's budget fits one sequence),
    the kernel at `kernel_precision` (`--kernel-precision`); the engine
    writes its step records to `step_log_dir` (VLLM_RS_STEP_LOG)."""
    args = ["--model", str(gguf), "--served-model-name", "smollm2", "--device", "cpu",
            "--kv-cache-memory-bytes", str(kv_cache_bytes), "--max-model-len", str(LLAMA_SLOT_CTX),
            "--kernel-precision", kernel_precision]  # fmt: skip
    if dtype is not None:
        args += ["--dtype", dtype]
    with (
        stack_environment(threads, **{STEP_LOG_ENV: str(step_log_dir)}),
        serve_stack(*args, log_path=log_dir / "models-serve.log") as (port, _),
    ):
        yield Served(f"http://127.0.0.1:{port}/v1", "smollm2", engine_process(port))


@contextlib.contextmanager
def stack_environment(threads: int, **extra: str):
    """STACK_ENV, OMP_NUM_THREADS=`threads` and `extra` set in this process's
    environment (which `serve_stack` passes on) for the block; each variable
    restored, or removed where it was unset, after it."""
    values = {**STACK_ENV, "OMP_NUM_THREADS": str(threads), **extra}
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def find_llama_server(option: str | None) -> tuple[Path | None, str]:
    """The llama-server executable: `option`, else $VLLM_RS_LLAMA_SERVER,
    else `llama-server` on PATH. Returns (path, "") or (None, why not)."""
    named = option or os.environ.get(LLAMA_SERVER_ENV)
    if named:
        path = Path(named)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        source = "--llama-server" if option else LLAMA_SERVER_ENV
        return None, f"{source}={named} is not an executable file"
    found = shutil.which("llama-server")
    if found:
        return Path(found), ""
    return None, f"no llama-server: set {LLAMA_SERVER_ENV} or --llama-server (build it as --help says)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int, parallel: int, log_dir: Path, extra: Sequence[str] = ()):
    """llama.cpp's server on the same GGUF and threads, `parallel` slots of
    LLAMA_SLOT_CTX tokens, with `extra` options (e.g. `--embedding`); its
    log goes to models-llama-server.log."""
    port = _free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "--parallel", str(parallel), "-c", str(parallel * LLAMA_SLOT_CTX),
               "--alias", "smollm2", "--no-webui", *extra]  # fmt: skip
    log_path = log_dir / "models-llama-server.log"
    listening = threading.Event()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

        def copy_log() -> None:
            # Drains the pipe for the server's whole life: it logs every request.
            for line in proc.stdout:
                log.write(line)
                if b"listening on" in line:
                    listening.set()
            listening.set()

        reader = threading.Thread(target=copy_log, daemon=True)
        reader.start()
        try:
            if not listening.wait(LLAMA_START_S) or proc.poll() is not None:
                raise ServerStartError(f"llama-server did not start; see {log_path}")
            yield Served(f"http://127.0.0.1:{port}/v1", "smollm2", proc.pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join()
    if proc.returncode not in (0, -signal.SIGTERM):
        print(f"  llama-server exited with {proc.returncode}; see {log_path}", file=sys.stderr)
