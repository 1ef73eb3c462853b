"""`serve` benchmark: the Rust frontend against the Python API server, in one
run, on the `echo` engine with 2 engines (`python -m vllm_rs serve --model
echo --data-parallel-size 2`):

  * /v1/completions with max_tokens=1 from 64 concurrent keep-alive clients:
    requests/s and p50/p99 latency;
  * 64 streams of 256 tokens: streamed tokens/s (SSE, counted from
    `stream_options.include_usage`);
  * the same streams with `logprobs=5` against without, in one run, on the
    Python API server (the Rust frontend does not serve logprobs yet);
    `--only-logprobs` runs just this row;

for `--frontend rust`, `--frontend python --api-server-count 1` and `2`.
Goal: the Rust frontend serves at least 5x the requests/s of one Python API
server at an equal or lower p99. Also, for the record, the `toy` model's
streamed tokens/s on this machine's CPU (one engine, 16 streams).

Each measurement is repeated (`--rounds`) and the best round is reported;
every stack is started and stopped by `serve` itself. max_tokens=1 load comes
from wrk when it is installed (`apt-get install wrk`; on 2 shared cores a
Python client caps a fast server), else from bench_frontend.py's asyncio
client (`--client python`). Streams are read by bench_frontend.py's native
streaming client (frontend-bin/examples/stream_load.rs, built with cargo).
Results also go to bench/results/serve.json.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_serve.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The client and measurements of bench_frontend.py; they ask for the model `toy`,
# so the echo stacks are served under that name too.
from bench.bench_frontend import build_stream_load, frontend_requests, frontend_streaming  # noqa: E402

READY_LINE = re.compile(rb"serving the OpenAI API on http://[^:]+:(\d+) ")


def served_port(output, log) -> int | None:
    """The HTTP port `serve` announces in `output` (its stdout, bytes), copying
    each line read to `log`; None when it ends without announcing one."""
    for line in output:
        log.write(line)
        if match := READY_LINE.search(line):
            return int(match.group(1))
    return None


REQUESTS_GOAL = 5.0
STACKS = {
    "rust": ["--frontend", "rust"],
    "python x1": ["--frontend", "python", "--api-server-count", "1"],
    "python x2": ["--frontend", "python", "--api-server-count", "2"],
}
#: Where streamed logprobs are measured (the frontend that serves them).
LOGPROBS_STACK = ("python x1", STACKS["python x1"])


@contextlib.contextmanager
def serve(*args: str, log_path: Path):
    """A `serve` process; yields its port once it is ready, Ctrl-C at the end."""
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_rs", "serve", "--port", "0", "--disable-log-stats", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            port = served_port(proc.stdout, log)
            if port is None:
                raise RuntimeError(f"serve {' '.join(args)} did not start; see {log_path}")
            yield port
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            log.write(proc.stdout.read())
            if proc.wait(60) != 0:
                print(f"  serve exited with {proc.returncode}; see {log_path}", file=sys.stderr)


def run(coroutine):
    """Runs `coroutine` on uvloop when it is installed."""
    try:
        import uvloop

        return uvloop.run(coroutine)
    except ImportError:
        return asyncio.run(coroutine)


WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '{"model": "toy", "prompt": "The quick brown fox jumps over the lazy dog. ", "max_tokens": 1}'
wrk.headers["Content-Type"] = "application/json"
"""
WRK_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def wrk_requests(port: int, concurrency: int, seconds: int, log_dir: Path) -> tuple[float, float, float]:
    """requests/s, p50 and p99 (ms) of max_tokens=1 requests sent by wrk (a C
    load generator, one thread): on 2 shared cores a Python client would be
    the bottleneck of a fast server, so wrk measures the server instead."""
    script = log_dir / "max_tokens_1.lua"
    script.write_text(WRK_SCRIPT)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}/v1/completions"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw failed requests:\n{out}")
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    latency = {q: float(v) * scale[unit] for q, v, unit in WRK_LATENCY.findall(out)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rps, latency["50"], latency["99"]


def bench_echo_stack(name: str, args: list[str], opts: argparse.Namespace, stream_load: Path, log_dir: Path) -> dict:
    """Best rounds of both measurements on one stack."""
    log_path = log_dir / f"serve-{name.replace(' ', '')}.log"
    with serve(
        "--model", "echo", "--served-model-name", "toy", "--data-parallel-size", "2", *args, log_path=log_path
    ) as port:
        run(frontend_requests(port, opts.concurrency, opts.concurrency * 4))  # warm-up
        best = (0.0, 0.0, 0.0)
        best_stream = 0.0
        for _ in range(opts.rounds):
            if opts.client == "wrk":
                measured = wrk_requests(port, opts.concurrency, opts.seconds, log_dir)
            else:
                rps, latencies = run(frontend_requests(port, opts.concurrency, opts.requests))
                measured = (rps, statistics.median(latencies) * 1000, statistics.quantiles(latencies, n=100)[98] * 1000)
            best = max(best, measured)
            best_stream = max(best_stream, frontend_streaming(stream_load, port, opts.streams, opts.tokens))
    return {"requests_per_s": best[0], "p50_ms": best[1], "p99_ms": best[2], "stream_tokens_per_s": best_stream}


def bench_toy(opts: argparse.Namespace, stream_load: Path, log_dir: Path) -> float:
    """Streamed tokens/s of the toy model on this machine (one engine)."""
    with serve("--model", "toy", "--device", "cpu", log_path=log_dir / "serve-toy.log") as port:
        frontend_streaming(stream_load, port, 2, 8)  # warm-up
        return max(frontend_streaming(stream_load, port, opts.toy_streams, opts.toy_tokens) for _ in range(opts.rounds))


def bench_logprobs(opts: argparse.Namespace, stream_load: Path, log_dir: Path) -> dict:
    """Streamed tokens/s with `logprobs=5` and without, on one stack (the
    Python API server: the Rust frontend does not serve logprobs yet)."""
    name, args = LOGPROBS_STACK
    with serve(
        "--model", "echo", "--served-model-name", "toy", "--data-parallel-size", "2", *args,
        log_path=log_dir / "serve-logprobs.log",
    ) as port:  # fmt: skip
        frontend_streaming(stream_load, port, 2, 8, logprobs=5)  # warm-up
        plain = with_logprobs = 0.0
        for _ in range(opts.rounds):
            plain = max(plain, frontend_streaming(stream_load, port, opts.streams, opts.tokens))
            with_logprobs = max(with_logprobs, frontend_streaming(stream_load, port, opts.streams, opts.tokens, 5))
    return {"stack": name, "stream_tokens_per_s": plain, "logprobs5_stream_tokens_per_s": with_logprobs,
            "ratio": with_logprobs / plain}  # fmt: skip


def print_logprobs(r: dict) -> None:
    """The logprobs row."""
    print(f"  logprobs=5 ({r['stack']}): {r['logprobs5_stream_tokens_per_s']:.0f} vs {r['stream_tokens_per_s']:.0f} "
          f"streamed tokens/s without: {r['ratio']:.2f}x", flush=True)  # fmt: skip


def main() -> int:
    """Runs every measurement; prints the table and writes serve.json."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=6000, help="max_tokens=1 requests per round (python client)")
    parser.add_argument("--seconds", type=int, default=8, help="length of a wrk round")
    parser.add_argument(
        "--client",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="load generator for max_tokens=1 (default: wrk when installed, `apt-get install wrk`)",
    )
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--toy-streams", type=int, default=16)
    parser.add_argument("--toy-tokens", type=int, default=128)
    parser.add_argument("--only-logprobs", action="store_true", help="run only the logprobs=5 streaming row")
    opts = parser.parse_args()
    if opts.quick:
        opts.rounds, opts.requests, opts.seconds, opts.toy_tokens = 1, 1000, 3, 32
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    stream_load = build_stream_load()
    if opts.only_logprobs:
        print_logprobs(bench_logprobs(opts, stream_load, results_dir))
        return 0
    print(f"serve on echo, 2 engines; {opts.concurrency} clients x max_tokens=1 ({opts.client} client), "
          f"{opts.streams} streams x {opts.tokens} tokens; best of {opts.rounds}; {os.cpu_count()} CPUs")  # fmt: skip
    results: dict = {"cpus": os.cpu_count(), "options": vars(opts), "stacks": {}}
    for name, args in STACKS.items():
        r = bench_echo_stack(name, args, opts, stream_load, results_dir)
        results["stacks"][name] = r
        print(f"  {name:10s} {r['requests_per_s']:9.0f} req/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"{r['stream_tokens_per_s']:9.0f} streamed tokens/s", flush=True)  # fmt: skip
    rust, python1 = results["stacks"]["rust"], results["stacks"]["python x1"]
    ratio = rust["requests_per_s"] / python1["requests_per_s"]
    met = ratio >= REQUESTS_GOAL and rust["p99_ms"] <= python1["p99_ms"]
    results["rust_vs_python1_requests_ratio"] = ratio
    results["goal_met"] = met
    verdict = "a smoke run, too short to judge" if opts.quick else ("met" if met else "NOT met")
    print(f"  Rust / one Python API server: {ratio:.1f}x requests/s, p99 {rust['p99_ms']:.2f} vs {python1['p99_ms']:.2f} ms "
          f"(goal: >= {REQUESTS_GOAL:.0f}x at equal or lower p99: {verdict})")  # fmt: skip
    results["logprobs"] = bench_logprobs(opts, stream_load, results_dir)
    print_logprobs(results["logprobs"])
    toy = bench_toy(opts, stream_load, results_dir)
    results["toy_cpu_stream_tokens_per_s"] = toy
    print(
        f"  toy model on the CPU (1 engine, rust frontend): {toy:.0f} tokens/s over {opts.toy_streams} streams of {opts.toy_tokens}"
    )
    (results_dir / "serve.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
