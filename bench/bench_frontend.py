"""Rust frontend benchmark, against the same engine driven directly over ZeroMQ.

A fake engine (pyzmq + msgpack) answers at once: every loop it takes all new
requests and emits one token for each running request, in one message.

  * 64 streams of 256 tokens: streamed tokens/s through the frontend (SSE,
    `stream_options.include_usage` for the count) and straight from the engine
    (a client that plays the frontend's part on the sockets: ADD out, outputs
    decoded in). Goal: the frontend delivers at least 90% of that.
  * /v1/completions with max_tokens=1 from 64 concurrent keep-alive clients:
    requests/s and p50/p99 latency (and the same requests sent straight to
    the engine, for reference).

The streams are read by a native one-thread client
(`bench/clients/src/stream_load.rs`, built here with cargo): a Python
client costs as much CPU per token as the frontend itself. Its connections
are opened and warmed up (`GET /health`) before the clock starts.

Streaming is measured in two layouts, rounds alternating between the two
paths in each, and reported as the median round:
  * engine on its own core: the engine process is pinned to CPU 0, the
    clients and the frontend to the others, and the frontend runs one async
    worker per core it has (as it sizes itself when started on that cpuset).
    This is the measure that matters: it asks whether the frontend keeps up with
    the engine, and an engine has its own cores in deployment;
  * shared: every process on every core. On a small machine this measures
    mostly that the frontend's CPU is taken from the engine's (printed for
    the record).

Then, in the same run, this frontend beside vLLM 0.33's bundled one
(`site-packages/vllm/vllm-rs`) on the same 2 reference `echo` engines, both
launched as vLLM launches its frontend (listener fds inherited,
bench/frontends.py), alternated over `--baseline-rounds` rounds: req/s and
p50/p99 at max_tokens=1 from 64 connections (wrk), streamed tokens/s of 64 x
256 tokens at the same granularity (one SSE event per engine output), RSS,
start-up and the frontend's CPU seconds per 1000 requests, as medians with
min-max and the ratio to vLLM's (bench_serve.py's table). Where vLLM 0.33 is
not installed that part prints why it is skipped and measures ours alone.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_frontend.py [--quick] [--baseline-rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import zmq  # noqa: E402
from vllm_rs.utils import CoreEngineProcManager, RustFrontendProcessManager  # noqa: E402

from tests.support.engine_peer import connect_as_engine  # noqa: E402
from tests.support.frontend_stack import engine_listeners, rust_frontend  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. "
STREAM_GOAL = 0.90
#: Seconds between streaming rounds, so that no round pays for the previous one's clean-up.
ROUND_PAUSE = 0.05


# ---------------------------------------------------------------------------
# The engine


def instant_engine(vllm_config, on_head_node, input_address, executor_class, log_stats, dp_rank, local_dp_rank):
    """Engine-process target: echoes prompt tokens, one per running request per loop."""
    _ctx, dealer, push = connect_as_engine(input_address, vllm_config["output_address"], dp_rank, max_model_len=4096)
    active: dict[str, list] = {}  # id -> [prompt, max_tokens, generated]
    unpackb, packb = msgpack.unpackb, msgpack.packb
    while True:
        if not active:
            dealer.poll(1000)
        while True:
            try:
                kind, payload = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            message = unpackb(payload)
            if kind == b"\x00":
                active[message[0]] = [message[1], message[3].get("max_tokens", 16), 0]
            elif kind == b"\x01":
                for request_id in message:
                    active.pop(request_id, None)
        if not active:
            continue
        outputs = []
        for request_id, state in list(active.items()):
            prompt, max_tokens, generated = state
            state[2] = generated = generated + 1
            finished = generated >= max_tokens
            outputs.append(
                [request_id, [prompt[(generated - 1) % len(prompt)]], None, None, None, 1 if finished else None]
            )
            if finished:
                del active[request_id]
        stats = {"num_running_reqs": len(active), "num_waiting_reqs": 0}
        push.send(packb([dp_rank, outputs, stats, time.time()]))


@contextlib.contextmanager
def engine_process(input_address: str, output_address: str):
    manager = CoreEngineProcManager(
        instant_engine, 1, 0, 0, {"output_address": output_address}, True, input_address, None, False
    )
    try:
        yield manager
    finally:
        manager.shutdown()


# ---------------------------------------------------------------------------
# Straight to the engine


class DirectClient:
    """Plays the frontend's part on the sockets: ROUTER + PULL, ADD out, outputs in."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.input_address = f"tcp://127.0.0.1:{port}"
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.pull.setsockopt(zmq.LINGER, 0)
        port = self.pull.bind_to_random_port("tcp://127.0.0.1")
        self.output_address = f"tcp://127.0.0.1:{port}"

    def wait_registered(self) -> None:
        if not self.router.poll(60_000):
            raise RuntimeError("the engine did not register")
        self.router.recv_multipart()

    def add(self, prompt: list[int], max_tokens: int) -> str:
        request_id = uuid.uuid4().hex
        sampling = {"max_tokens": max_tokens, "ignore_eos": True, "stop_token_ids": [], "_all_stop_token_ids": []}
        request = [
            request_id,
            prompt,
            None,
            sampling,
            None,
            time.time(),
            None,
            None,
            None,
            None,
            None,
            0,
            0,
            0,
            None,
            False,
            request_id,
        ]
        self.router.send_multipart([b"\x00\x00", b"\x00", msgpack.packb(request)])
        return request_id

    def drain(self, pending: set[str], on_output=None) -> int:
        """Receives until every request in `pending` finished; returns tokens received."""
        tokens = 0
        while pending:
            message = msgpack.unpackb(self.pull.recv())
            for output in message[1]:
                tokens += len(output[1])
                if on_output is not None:
                    on_output(output)
                if len(output) > 5 and output[5] is not None:
                    pending.discard(output[0])
        return tokens

    def close(self) -> None:
        self.router.close()
        self.pull.close()
        self.ctx.term()


def direct_streaming(client: DirectClient, streams: int, tokens: int) -> float:
    prompt = list(PROMPT.encode())
    start = time.perf_counter()
    pending = {client.add(prompt, tokens) for _ in range(streams)}
    received = client.drain(pending)
    elapsed = time.perf_counter() - start
    assert received == streams * tokens, received
    return received / elapsed


def direct_requests(client: DirectClient, concurrency: int, total: int) -> tuple[float, list[float]]:
    prompt = list(PROMPT.encode())
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    start = time.perf_counter()

    def send_one() -> None:
        sent_at[client.add(prompt, 1)] = time.perf_counter()

    for _ in range(concurrency):
        send_one()
    sent = concurrency
    while latencies.__len__() < total:
        message = msgpack.unpackb(client.pull.recv())
        for output in message[1]:
            if len(output) > 5 and output[5] is not None:
                latencies.append(time.perf_counter() - sent_at.pop(output[0]))
                if sent < total:
                    send_one()
                    sent += 1
    return total / (time.perf_counter() - start), latencies


# ---------------------------------------------------------------------------
# Through the frontend


class HttpConnection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def _send(self, path: str, payload: bytes) -> None:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self.writer.write(head + payload)

    async def _read_head(self) -> tuple[int, int, bool]:
        status = int((await self.reader.readline()).split()[1])
        length, chunked = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        return status, length, chunked

    async def post(self, path: str, payload: bytes) -> tuple[int, bytes]:
        """A request answered with a Content-Length body."""
        self._send(path, payload)
        status, length, chunked = await self._read_head()
        assert not chunked
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def build_client(name: str) -> Path:
    """Builds the bench client `name` (bench/clients, release); returns the path of its executable."""
    cache = Path(os.environ.get("VLLM_RS_CACHE") or Path.home() / ".cache" / "vllm-rs")
    env = {**os.environ, "CARGO_TARGET_DIR": os.environ.get("CARGO_TARGET_DIR") or str(cache / "target")}
    command = ["cargo", "build", "--release", "-p", "vllm-rs-bench-clients", "--bin", name, "--message-format=json"]
    built = subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True)
    for line in built.stdout.splitlines():
        artifact = json.loads(line)
        if artifact.get("reason") == "compiler-artifact" and artifact["target"]["name"] == name:
            return Path(artifact["executable"])
    raise RuntimeError(f"cargo built no {name} executable")


def build_stream_load() -> Path:
    """Builds the native streaming client; returns the path of its executable."""
    return build_client("stream_load")


def stream_round(stream_load: Path, port: int, streams: int, tokens: int, logprobs: int | None = None) -> dict:
    """One round of `streams` concurrent streams through the frontend (asking
    for `logprobs` when given): `tokens`, SSE `events` (all streams) and `seconds`."""
    command = [
        str(stream_load),
        "--port",
        str(port),
        "--streams",
        str(streams),
        "--tokens",
        str(tokens),
        "--prompt",
        PROMPT,
        *([] if logprobs is None else ["--logprobs", str(logprobs)]),
    ]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if ran.returncode != 0:
        raise RuntimeError(f"stream_load failed: {ran.stderr.strip()}")
    result = json.loads(ran.stdout)
    assert result["tokens"] == streams * tokens, result
    return result


def frontend_streaming(stream_load: Path, port: int, streams: int, tokens: int, logprobs: int | None = None) -> float:
    """One round of `streams` concurrent streams through the frontend (asking
    for `logprobs` when given); tokens/s."""
    result = stream_round(stream_load, port, streams, tokens, logprobs)
    return result["tokens"] / result["seconds"]


# ---------------------------------------------------------------------------
# CPU layouts


def pin(pid: int, cpus: set[int]) -> None:
    """Moves every thread of `pid` to `cpus` (new threads inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


def engine_on_own_core(engine_pids: list[int], others: list[int]) -> None:
    """The engine processes on CPU 0; the given others (and this process) on the rest."""
    cpus = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    for pid in engine_pids:
        pin(pid, {0})
    for pid in [os.getpid(), *others]:
        pin(pid, cpus - {0})


def share_all_cores(pids: list[int]) -> None:
    """Every process given (and this one) on every core."""
    for pid in [os.getpid(), *pids]:
        pin(pid, set(range(os.cpu_count() or 1)))


async def frontend_requests(port: int, concurrency: int, total: int) -> tuple[float, list[float]]:
    connections = [HttpConnection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in connections))
    payload = json.dumps({"model": "toy", "prompt": PROMPT, "max_tokens": 1}).encode()
    latencies: list[float] = []
    remaining = [total]

    async def worker(connection: HttpConnection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            sent = time.perf_counter()
            status, reply = await connection.post("/v1/completions", payload)
            latencies.append(time.perf_counter() - sent)
            assert status == 200, reply[:200]

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - start
    for c in connections:
        c.close()
    return total / elapsed, latencies


@contextlib.contextmanager
def frontend_stack(log_path: Path, workers: int | None = None):
    """The installed `vllm-rs` binary behind RustFrontendProcessManager, with
    one instant engine; yields (HTTP port, frontend pid, engine pid). `workers`
    sets the frontend's async workers (TOKIO_WORKER_THREADS), else it sizes
    itself to the machine."""
    import argparse as _argparse

    listeners = engine_listeners()
    with engine_process(listeners.input.address, listeners.output.address) as engine:
        args = _argparse.Namespace(model="toy", disable_log_stats=True)
        env = {"TOKIO_WORKER_THREADS": str(workers)} if workers is not None else None
        with rust_frontend(args, listeners, backlog=1024, log_path=log_path, env=env) as frontend:
            wait_healthy(frontend.port, frontend.manager)
            yield frontend.port, frontend.process.pid, engine.processes[0].pid


def wait_healthy(port: int, frontend: RustFrontendProcessManager) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not frontend.processes[0].is_alive():
            raise RuntimeError("the frontend exited during start-up")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.05)
    raise RuntimeError("the frontend did not become healthy")


# ---------------------------------------------------------------------------


def streaming_rounds(client: DirectClient, stream_load: Path, port: int, args, rounds: int) -> dict[str, float]:
    """Alternating direct and frontend rounds (after one warm-up each); medians."""
    direct_runs, frontend_runs = [], []
    for _ in range(rounds + 1):
        direct_runs.append(direct_streaming(client, args.streams, args.tokens))
        time.sleep(ROUND_PAUSE)
        frontend_runs.append(frontend_streaming(stream_load, port, args.streams, args.tokens))
        time.sleep(ROUND_PAUSE)  # the frontend closes the client's connections before the next round
    direct, frontend = statistics.median(direct_runs[1:]), statistics.median(frontend_runs[1:])
    return {
        "direct_tokens_per_s": direct,
        "frontend_tokens_per_s": frontend,
        "ratio": frontend / direct,
        "pair_ratio_median": statistics.median(f / d for f, d in zip(frontend_runs[1:], direct_runs[1:])),
    }


def print_streaming(title: str, result: dict[str, float], goal: bool) -> None:
    print(f"  {title}:")
    print(f"    frontend : {result['frontend_tokens_per_s']:9.0f} tokens/s")
    print(f"    direct   : {result['direct_tokens_per_s']:9.0f} tokens/s")
    verdict = (
        f" (goal >= {STREAM_GOAL:.2f}: {'PASS' if result['ratio'] >= STREAM_GOAL else 'BELOW GOAL'})" if goal else ""
    )
    print(
        f"    frontend / direct = {result['ratio']:.2f}{verdict}; "
        f"median of round-by-round ratios {result['pair_ratio_median']:.2f}"
    )


def vllm033_baseline(args: argparse.Namespace, stream_load: Path) -> dict:
    """This frontend beside vLLM 0.33's bundled one (bench_serve.py's
    alternated rounds and table) with this run's streams, tokens and
    connections; ours alone, with the reason printed, where vLLM 0.33 is not
    installed."""
    # Imported here: bench_serve imports this module's clients.
    from bench.bench_serve import add_options, compare

    parser = argparse.ArgumentParser()
    add_options(parser)
    opts = parser.parse_args([])
    opts.quick, opts.rounds = args.quick, args.baseline_rounds
    opts.streams, opts.tokens, opts.concurrency = args.streams, args.tokens, args.concurrency
    if args.quick:
        opts.requests, opts.seconds, opts.stream_repeats = 1000, 3, 1
    print(f"\nbeside vLLM 0.33's bundled frontend, {opts.rounds} alternated rounds:")
    return compare(opts, stream_load)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--baseline-rounds",
        type=int,
        help="rounds beside vLLM 0.33's bundled frontend (default 5, 1 with --quick; 0 skips the comparison)",
    )
    args = parser.parse_args()
    if args.baseline_rounds is None:
        args.baseline_rounds = 1 if args.quick else 5
    if args.baseline_rounds < 0:
        parser.error("--baseline-rounds must be 0 or more")
    rounds = 5 if args.quick else 30
    total = 2000 if args.quick else 10000
    cpus = os.cpu_count() or 1
    stream_load = build_stream_load()

    results: dict[str, object] = {
        "streams": args.streams,
        "tokens": args.tokens,
        "concurrency": args.concurrency,
        "cpus": cpus,
    }
    client = DirectClient()
    with (
        engine_process(client.input_address, client.output_address) as direct_engine,
        tempfile.TemporaryDirectory() as tmp,
    ):
        client.wait_registered()
        log = Path(tmp) / "frontend.log"
        direct_pid = direct_engine.processes[0].pid
        if cpus >= 2:
            # The frontend gets the cores the engine leaves, and one async worker
            # per core it has, as it would started on that cpuset.
            with frontend_stack(log, workers=cpus - 1) as (port, frontend_pid, frontend_engine):
                engine_on_own_core([direct_pid, frontend_engine], [frontend_pid])
                results["engine_on_own_core"] = streaming_rounds(client, stream_load, port, args, rounds)
        with frontend_stack(log) as (port, frontend_pid, frontend_engine):
            share_all_cores([direct_pid, frontend_engine, frontend_pid])
            results["shared"] = streaming_rounds(client, stream_load, port, args, rounds)
            direct_requests(client, args.concurrency, min(total, 1000))  # warm-up
            direct_rps, direct_lat = direct_requests(client, args.concurrency, total)
            asyncio.run(frontend_requests(port, args.concurrency, min(total, 1000)))  # warm-up
            fe_rps, fe_lat = asyncio.run(frontend_requests(port, args.concurrency, total))
    client.close()

    results.update(
        direct_requests_per_s=direct_rps,
        direct_p50_ms=statistics.median(direct_lat) * 1e3,
        direct_p99_ms=statistics.quantiles(direct_lat, n=100)[98] * 1e3,
        frontend_requests_per_s=fe_rps,
        frontend_p50_ms=statistics.median(fe_lat) * 1e3,
        frontend_p99_ms=statistics.quantiles(fe_lat, n=100)[98] * 1e3,
    )
    print(f"cpus: {cpus}")
    print(f"streaming, {args.streams} streams x {args.tokens} tokens, median of {rounds} rounds:")
    if "engine_on_own_core" in results:
        print_streaming(
            "engine on its own core (CPU 0), clients and frontend on the rest", results["engine_on_own_core"], goal=True
        )
    print_streaming("every process on every core", results["shared"], goal=cpus < 2)
    print(
        f"/v1/completions max_tokens=1, {args.concurrency} concurrent, {total} requests (every process on every core):"
    )
    print(
        f"  frontend : {fe_rps:9.0f} req/s  p50 {results['frontend_p50_ms']:6.2f} ms  p99 {results['frontend_p99_ms']:6.2f} ms"
    )
    print(
        f"  direct   : {direct_rps:9.0f} req/s  p50 {results['direct_p50_ms']:6.2f} ms  p99 {results['direct_p99_ms']:6.2f} ms"
    )
    if args.baseline_rounds > 0:
        results["vllm033_baseline"] = vllm033_baseline(args, stream_load)
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "frontend.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
