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

Where the kernel has no `sch_netem` (`tc` says "Specified qdisc kind is
unknown"), or with `--relay`, the delay comes from a userspace relay instead
(the `delay_relay` bench client, bench/clients): the second namespace
holds the head's address on its loopback, so the node's connections (its
node channel, its engine's frontend and coordinator sockets) reach
listeners the bench made there, and the relay, running in the head's
namespace, forwards each to the head, releasing every chunk 0.5 ms after it
arrived, in each direction, keeping order and pipelining. The relay costs
something of its own, so the two-host run is measured through it twice:

  * two hosts, relay 0 ms:    forwarding only (the relay's cost)
  * two hosts, relay 0.5 ms:  forwarding with 0.5 ms each way

and the ratios printed are each to the one-host run, and 0.5 ms to 0 ms
(the delay's own effect).

Measured like bench_serve.py: max_tokens=1 requests/s from 64 keep-alive
clients (wrk when installed, else bench_frontend.py's asyncio client), and
streamed tokens/s over 64 streams of 256 tokens (the native stream_load
client). Printed as ratios to the one-host run; the goal is at least 90%
for the two-host run (with the relay: the 0.5 ms run). Results also go to
bench/results/multinode.json.

Run (as root): ~/.cache/vllm-rs/venv/bin/python bench/bench_multinode.py [--quick] [--relay]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_frontend import build_client, build_stream_load, frontend_requests, frontend_streaming  # noqa: E402
from bench.bench_serve import WRK_SCRIPT, run, wrk_requests  # noqa: E402
from bench.model_servers import served_port  # noqa: E402
from tests.support import netns  # noqa: E402

GOAL = 0.90
DELAY_MS = 0.5
RPC_PORT = 29660
ENV = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
COMMON = ["--model", "echo", "--served-model-name", "toy", "--disable-log-stats", "--data-parallel-size", "2"]
#: The head's warning naming the TCP engine sockets it bound (frontend and coordinator).
ENGINE_SOCKETS = re.compile(rb"engine sockets on (\S+(?:, \S+)*): TCP")
#: Two-host layouts through the delay relay, and their one-way delay in ms.
RELAY_LAYOUTS = {"two hosts, relay 0 ms": 0.0, "two hosts, relay 0.5 ms": DELAY_MS}


def _start(hosts: netns.Hosts, i: int, args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(
        hosts.command(i, [sys.executable, "-m", "vllm_rs", "serve", *COMMON, *args]),
        stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True,
    )  # fmt: skip


def _engine_ports(output, log) -> list[int]:
    """The ports of the TCP engine sockets the head announces in `output`
    (its stdout, bytes), copying each line read to `log`."""
    for line in output:
        log.write(line)
        if match := ENGINE_SOCKETS.search(line):
            return [int(endpoint.rsplit(b":", 1)[1]) for endpoint in match.group(1).split(b", ")]
    raise RuntimeError("the head ended without naming its engine sockets")


def _start_relay(hosts: netns.Hosts, relay: Path, delay_ms: float, ports: list[int], log) -> subprocess.Popen:
    """The delay relay, in the head's namespace, forwarding connections made
    in the node's namespace to the head's address on each of `ports` to the
    same port of the head."""
    address = hosts.address(0)
    listeners = []
    with hosts.inside(1):
        for port in ports:
            listener = socket.create_server((address, port), backlog=64)
            listeners.append(listener)
    try:
        args = [str(relay), "--delay-us", str(round(delay_ms * 1000))]
        for listener, port in zip(listeners, ports):
            args += ["--relay", f"{listener.fileno()}:{address}:{port}"]
        return subprocess.Popen(
            hosts.command(0, args), stdout=log, stderr=subprocess.STDOUT,
            pass_fds=[listener.fileno() for listener in listeners], start_new_session=True,
        )  # fmt: skip
    finally:
        for listener in listeners:
            listener.close()  # the relay has its own copies


@contextlib.contextmanager
def stack(hosts: netns.Hosts, layout: str, log_dir: Path, relay: Path | None):
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
    name = re.sub(r"[ ,]+", "-", layout)
    head_log_path = log_dir / f"multinode-{name}-head.log"
    procs = []
    relay_proc = None
    with open(head_log_path, "wb") as head_log, open(log_dir / f"multinode-{name}-node.log", "wb") as node_log:
        head = subprocess.Popen(
            hosts.command(0, [sys.executable, "-m", "vllm_rs", "serve", *COMMON, *head_args]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, start_new_session=True,
        )  # fmt: skip
        procs.append(head)
        try:
            if layout in RELAY_LAYOUTS:
                assert relay is not None
                ports = [RPC_PORT, *_engine_ports(head.stdout, head_log)]
                relay_proc = _start_relay(hosts, relay, RELAY_LAYOUTS[layout], ports, node_log)
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
            if relay_proc is not None:
                relay_proc.kill()
                relay_proc.wait()


def measure(
    hosts: netns.Hosts, layout: str, opts: argparse.Namespace, stream_load: Path, log_dir: Path, relay: Path | None
) -> dict:
    """Best rounds of requests/s and streamed tokens/s, the load run from
    inside the head's namespace."""
    script = log_dir / "max_tokens_1.lua"
    script.write_text(WRK_SCRIPT)
    with stack(hosts, layout, log_dir, relay) as port, hosts.inside(0):
        run(frontend_requests(port, opts.concurrency, opts.concurrency * 4))  # warm-up
        best_rps, best_p99, best_stream = 0.0, 0.0, 0.0
        for _ in range(opts.rounds):
            if opts.client == "wrk":
                rps, _, p99, _ = wrk_requests(port, opts.concurrency, opts.seconds, script)
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
    parser.add_argument("--relay", action="store_true", help="delay with the userspace relay even where netem exists")
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
    hosts = netns.Hosts(2)
    results: dict = {"cpus": os.cpu_count(), "options": vars(opts), "delay_ms_each_way": DELAY_MS, "layouts": {}}
    relay = None
    try:
        if not opts.relay:
            try:
                hosts.add_delay(0, DELAY_MS)
                hosts.add_delay(1, DELAY_MS)
            except subprocess.CalledProcessError as e:
                print(f"  tc netem is unavailable here ({e.stderr.strip()}): delaying with a userspace relay")
                opts.relay = True
        if opts.relay:
            relay = build_client("delay_relay")
            # The node's connections to the head's address end at its own loopback, where the relay listens.
            subprocess.run(
                ["ip", "-n", hosts.names[1], "addr", "add", f"{hosts.address(0)}/32", "dev", "lo"], check=True
            )
        results["delayed_by"] = "relay" if opts.relay else "netem"
        two_hosts = list(RELAY_LAYOUTS) if opts.relay else ["two hosts"]
        print(f"serve on echo, 2 engines, rust frontend; {opts.concurrency} clients x max_tokens=1 ({opts.client} "
              f"client), {opts.streams} streams x {opts.tokens} tokens; best of {opts.rounds}; {DELAY_MS} ms each way "
              f"by {results['delayed_by']}; {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        for layout in ("one host", "one host, TCP", *two_hosts):
            started = time.monotonic()
            r = measure(hosts, layout, opts, stream_load, results_dir, relay)
            results["layouts"][layout] = r
            print(f"  {layout:24s} {r['requests_per_s']:9.0f} req/s  p99 {r['p99_ms']:7.2f} ms  "
                  f"{r['stream_tokens_per_s']:9.0f} streamed tokens/s  ({time.monotonic() - started:.0f}s)",
                  flush=True)  # fmt: skip
    finally:
        hosts.close()
    layouts = results["layouts"]
    ratios: dict = {}
    pairs = [(layout, "one host") for layout in ("one host, TCP", *two_hosts)]
    if opts.relay:
        pairs.append(tuple(RELAY_LAYOUTS)[::-1])
    for layout, base in pairs:
        r, b = layouts[layout], layouts[base]
        ratio = {
            "requests": r["requests_per_s"] / b["requests_per_s"],
            "stream": r["stream_tokens_per_s"] / b["stream_tokens_per_s"],
        }
        ratios[f"{layout} / {base}"] = ratio
        print(f"  {layout} / {base}: {ratio['requests']:.2f} requests/s, {ratio['stream']:.2f} streamed tokens/s")
    results["ratios"] = ratios
    judged = ratios[f"{two_hosts[-1]} / one host"]
    met = min(judged.values()) >= GOAL
    results["goal_met"] = met
    verdict = "a smoke run, too short to judge" if opts.quick else ("met" if met else "NOT met")
    print(f"  goal: {two_hosts[-1]} keeps >= {GOAL:.0%} of one host: {verdict}")
    (results_dir / "multinode.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
