"""Multi-node benchmark: the echo stack (Rust frontend, 2 engines) with both
engines on one host, against the same engines spread over two hosts, in one
run. Hosts are Linux network namespaces joined by a veth pair
(`tests/support/netns.py`, needs root); the load comes from inside the
head's namespace, to the head's HTTP port on its loopback.

  * one host:        `serve --data-parallel-size 2` (engine sockets: Unix)
  * one host, TCP:   the head runs rank 0, a `--headless` node in the same
                     namespace runs rank 1 (TCP without network delay)
  * two hosts:       the headless node in a second namespace, `tc netem`
                     adding 0.5 ms of delay each way (RTT 1 ms)

Measured like bench_serve.py: max_tokens=1 requests/s from 64 keep-alive
clients (wrk when installed, else bench_frontend.py's asyncio client), and
streamed tokens/s over 64 streams of 256 tokens (the native stream_load
client). Printed as ratios to the one-host run; the goal is at least 90%
for the two-host run. Results also go to bench/results/multinode.json.

Run: sudo ~/.cache/vllm-rs/venv/bin/python bench/bench_multinode.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_frontend import build_stream_load, frontend_requests, frontend_streaming  # noqa: E402
from bench.bench_serve import run, served_port, wrk_requests  # noqa: E402
from tests.support import netns  # noqa: E402

GOAL = 0.90
DELAY_MS = 0.5
RPC_PORT = 29660
ENV = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
COMMON = ["--model", "echo", "--served-model-name", "toy", "--disable-log-stats", "--data-parallel-size", "2"]


def _start(hosts: netns.Hosts, i: int, args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(
        hosts.command(i, [sys.executable, "-m", "vllm_rs", "serve", *COMMON, *args]),
        stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True,
    )  # fmt: skip


@contextlib.contextmanager
def stack(hosts: netns.Hosts, layout: str, log_dir: Path):
    """The stack in `layout`; yields the head's HTTP port once it is ready."""
    head_args = ["--host", "127.0.0.1", "--port", "0"]
    node_host = None
    if layout != "one host":
        node_host = 0 if layout == "one host, TCP" else 1
        address = hosts.address(0)
        head_args += ["--data-parallel-size-local", "1", "--data-parallel-address", address,
                      "--data-parallel-rpc-port", str(RPC_PORT)]  # fmt: skip
        node_args = ["--headless", "--data-parallel-size-local", "1", "--data-parallel-start-rank", "1",
                     "--data-parallel-address", address, "--data-parallel-rpc-port", str(RPC_PORT)]  # fmt: skip
    name = layout.replace(" ", "").replace(",", "-")
    head_log_path = log_dir / f"multinode-{name}-head.log"
    procs = []
    with open(head_log_path, "wb") as head_log, open(log_dir / f"multinode-{name}-node.log", "wb") as node_log:
        head = subprocess.Popen(
            hosts.command(0, [sys.executable, "-m", "vllm_rs", "serve", *COMMON, *head_args]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, start_new_session=True,
        )  # fmt: skip
        procs.append(head)
        try:
            if node_host is not None:
                procs.append(_start(hosts, node_host, node_args, node_log))
            port = served_port(head.stdout, head_log)
            if port is None:
                raise RuntimeError(f"the {layout} stack did not start; see {head_log_path}")
            yield port
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
            head_log.write(head.stdout.read())
            for proc in procs:
                proc.wait(60)


def measure(hosts: netns.Hosts, layout: str, opts: argparse.Namespace, stream_load: Path, log_dir: Path) -> dict:
    """Best rounds of requests/s and streamed tokens/s, the load run from
    inside the head's namespace."""
    with stack(hosts, layout, log_dir) as port, hosts.inside(0):
        run(frontend_requests(port, opts.concurrency, opts.concurrency * 4))  # warm-up
        best_rps, best_p99, best_stream = 0.0, 0.0, 0.0
        for _ in range(opts.rounds):
            if opts.client == "wrk":
                rps, _, p99 = wrk_requests(port, opts.concurrency, opts.seconds, log_dir)
            else:
                rps, latencies = run(frontend_requests(port, opts.concurrency, opts.requests))
                p99 = statistics.quantiles(latencies, n=100)[98] * 1000
            if rps > best_rps:
                best_rps, best_p99 = rps, p99
            best_stream = max(best_stream, frontend_streaming(stream_load, port, opts.streams, opts.tokens))
    return {"requests_per_s": best_rps, "p99_ms": best_p99, "stream_tokens_per_s": best_stream}


def main() -> int:
    """Runs the three layouts and prints their ratios to the one-host run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=6000, help="max_tokens=1 requests per round (python client)")
    parser.add_argument("--seconds", type=int, default=8, help="length of a wrk round")
    parser.add_argument(
        "--client", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python",
        help="max_tokens=1 load generator (default: wrk when installed)",
    )  # fmt: skip
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    opts = parser.parse_args()
    if opts.quick:
        opts.rounds, opts.requests, opts.seconds = 1, 1000, 3
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"bench_multinode: skipped: {reason}")
        return 0
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    stream_load = build_stream_load()
    print(f"serve on echo, 2 engines, rust frontend; {opts.concurrency} clients x max_tokens=1 ({opts.client} client), "
          f"{opts.streams} streams x {opts.tokens} tokens; best of {opts.rounds}; netem {DELAY_MS} ms each way; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    hosts = netns.Hosts(2)
    results: dict = {"cpus": os.cpu_count(), "options": vars(opts), "delay_ms_each_way": DELAY_MS, "layouts": {}}
    try:
        try:
            hosts.add_delay(0, DELAY_MS)
            hosts.add_delay(1, DELAY_MS)
        except subprocess.CalledProcessError as e:
            # A kernel without sch_netem: the two-host run then measures TCP over the veth pair only.
            results["delay_ms_each_way"] = 0
            print(f"  tc netem is unavailable here ({e.stderr.strip()}): two hosts measured WITHOUT added delay")
        for layout in ("one host", "one host, TCP", "two hosts"):
            started = time.monotonic()
            r = measure(hosts, layout, opts, stream_load, results_dir)
            results["layouts"][layout] = r
            print(f"  {layout:14s} {r['requests_per_s']:9.0f} req/s  p99 {r['p99_ms']:7.2f} ms  "
                  f"{r['stream_tokens_per_s']:9.0f} streamed tokens/s  ({time.monotonic() - started:.0f}s)",
                  flush=True)  # fmt: skip
    finally:
        hosts.close()
    base = results["layouts"]["one host"]
    for layout in ("one host, TCP", "two hosts"):
        r = results["layouts"][layout]
        r["requests_ratio"] = r["requests_per_s"] / base["requests_per_s"]
        r["stream_ratio"] = r["stream_tokens_per_s"] / base["stream_tokens_per_s"]
        print(f"  {layout} / one host: {r['requests_ratio']:.2f} requests/s, {r['stream_ratio']:.2f} streamed tokens/s")
    two = results["layouts"]["two hosts"]
    met = min(two["requests_ratio"], two["stream_ratio"]) >= GOAL
    results["goal_met"] = met
    verdict = "a smoke run, too short to judge" if opts.quick else ("met" if met else "NOT met")
    print(f"  goal: two hosts keep >= {GOAL:.0%} of one host: {verdict}")
    (results_dir / "multinode.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
