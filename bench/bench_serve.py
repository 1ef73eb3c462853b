"""Whole-stack benchmark: this project's Rust frontend against the one vLLM
0.33 bundles in its wheel (what `VLLM_USE_RUST_FRONTEND=1` runs), in one run,
on the same 2 reference engines (`echo`), both launched as vLLM launches its
frontend (bench/frontends.py). The two alternate within every round (which
goes first alternates too), on fresh engines each time; each row reports the
median round and the ratio ours / vLLM's:

  * /v1/completions with max_tokens=1 from 64 keep-alive connections (wrk
    when installed, `apt-get install wrk`, else bench_frontend.py's asyncio
    client): requests/s, p50 and p99 latency, and the CPU seconds the
    frontend process spends per 1000 requests (on a small machine the
    frontend's CPU is taken from the engines'), and the engines' (both
    processes together: what the frontend's writes and batching cost them);
  * 64 streams of 256 tokens (the native client, bench/clients/src/
    stream_load.rs), `--stream-repeats` times back to back (a round is
    about 0.1 s on a 2-core machine): streamed tokens/s, the frontend's CPU milliseconds per
    1000 streamed tokens and SSE events per stream, both frontends at their
    default granularity (one event per engine output), how many events each
    read of the client brought and the p99 gap between a stream's events as
    they reached it (events that came together are 0 apart: a frontend that
    writes late delivers in bursts), and what the engines and the client
    spend per 1000 streamed tokens (on 2 cores the row is what all of them
    together leave: tokens/s is about 2 CPU-seconds over the sum of the
    three);
  * resident memory after that load, and start-up: spawn to the first 200 on
    /health, the engines already waiting on the listeners.

Without vLLM 0.33 (a throwaway venv, ~/.cache/vllm033 or VLLM033_VENV; see
tests/compat/README.md) only this project's frontend is measured and the
baseline is reported as skipped, with the reason. Targets (issue 21): req/s
>= 1.5x, p99 <= 0.7x, streamed tokens/s >= 1.3x, CPU per request <= 0.6x,
RSS and start-up <= 0.5x. Results also go to bench/results/serve.json.

`--against PATH` puts another build of this frontend (an older commit's
`vllm-rs`, launched the same way) in vLLM's column instead: how a change
moved every row.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_serve.py [--quick] [--rounds N] [--against PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_frontend import PROMPT, build_stream_load, frontend_requests, stream_round  # noqa: E402
from bench.frontends import (  # noqa: E402
    cpu_seconds,
    echo_engines,
    frontend_stack,
    frontends_to_compare,
    our_frontend,
    rss_mib,
    write_model_dir,
)

#: The baseline the targets are set against (the table's second column).
VLLM_BASELINE = "vLLM 0.33 bundled"

#: (row, key, unit, target ratio ours / vLLM's, True when higher is better)
ROWS = [
    ("req/s, max_tokens=1", "requests_per_s", "", 1.5, True),
    ("p50 latency", "p50_ms", " ms", None, False),
    ("p99 latency", "p99_ms", " ms", 0.7, False),
    ("CPU s / 1000 requests", "cpu_s_per_1000", "", 0.6, False),
    ("engines' CPU s / 1000 requests", "engine_cpu_s_per_1000", "", None, False),
    ("streamed tokens/s", "stream_tokens_per_s", "", 1.3, True),
    ("CPU ms / 1000 streamed tokens", "stream_cpu_ms_per_1000", " ms", None, False),
    ("engines' CPU ms / 1000 streamed tokens", "stream_engine_cpu_ms_per_1000", " ms", None, False),
    ("client's CPU ms / 1000 streamed tokens", "stream_client_cpu_ms_per_1000", " ms", None, False),
    ("SSE events per stream", "events_per_stream", "", None, None),
    ("SSE events per client read", "events_per_read", "", None, None),
    ("gap between a stream's events at the client, p99", "gap_p99_ms", " ms", None, False),
    ("RSS after load", "rss_mib", " MiB", 0.5, False),
    ("start-up to /health 200", "startup_ms", " ms", 0.5, False),
]

WRK_SCRIPT = f"""wrk.method = "POST"
wrk.body = '{{"model": "toy", "prompt": "{PROMPT}", "max_tokens": 1}}'
wrk.headers["Content-Type"] = "application/json"
"""
WRK_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def run(coroutine):
    """Runs `coroutine` on uvloop when it is installed."""
    try:
        import uvloop

        return uvloop.run(coroutine)
    except ImportError:
        return asyncio.run(coroutine)


def wrk_requests(port: int, concurrency: int, seconds: int, script: Path) -> tuple[float, float, float, int]:
    """requests/s, p50 and p99 (ms) and the number of requests of a wrk run
    (a C load generator, one thread: on 2 shared cores a Python client would
    be the bottleneck of a fast server)."""
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
    count = int(re.search(r"(\d+) requests in", out).group(1))
    return rps, latency["50"], latency["99"], count


def children_cpu_seconds() -> float:
    """CPU seconds of this process's ended children (the streaming client
    runs as one, stream_load, and is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def max_tokens_1(port: int, opts: argparse.Namespace, script: Path) -> tuple[float, float, float, int]:
    """The max_tokens=1 row: requests/s, p50, p99 (ms), requests sent."""
    if opts.client == "wrk":
        return wrk_requests(port, opts.concurrency, opts.seconds, script)
    rps, latencies = run(frontend_requests(port, opts.concurrency, opts.requests))
    p50 = statistics.median(latencies) * 1000
    return rps, p50, statistics.quantiles(latencies, n=100)[98] * 1000, opts.requests


def measure(binary: Path, model_dir: Path, opts: argparse.Namespace, stream_load: Path, log_dir: Path) -> dict:
    """One round on one frontend, fresh engines and frontend: every row."""
    script = log_dir / "max_tokens_1.lua"
    script.write_text(WRK_SCRIPT)
    with (
        echo_engines(model_dir, opts.engines) as engines,
        frontend_stack(binary, model_dir, engines, log_dir / f"{binary.parent.name}.log") as stack,
    ):
        run(frontend_requests(stack.port, opts.concurrency, opts.concurrency * 4))  # warm-up
        engine_pids = [process.pid for process in engines.manager.processes]
        before, engines_before = cpu_seconds(stack.pid), sum(map(cpu_seconds, engine_pids))
        rps, p50, p99, sent = max_tokens_1(stack.port, opts, script)
        cpu = cpu_seconds(stack.pid) - before
        engine_cpu = sum(map(cpu_seconds, engine_pids)) - engines_before
        before_stream, engines_before_stream = cpu_seconds(stack.pid), sum(map(cpu_seconds, engine_pids))
        client_before = children_cpu_seconds()
        # One round of 64 x 256 tokens takes about 0.1 s here: back-to-back
        # repeats make the row long enough to measure more than one hiccup.
        rounds = [stream_round(stream_load, stack.port, opts.streams, opts.tokens) for _ in range(opts.stream_repeats)]
        streamed = {key: sum(r[key] for r in rounds) for key in ("tokens", "seconds", "events", "reads")}
        stream_cpu = cpu_seconds(stack.pid) - before_stream
        stream_engine_cpu = sum(map(cpu_seconds, engine_pids)) - engines_before_stream
        stream_client_cpu = children_cpu_seconds() - client_before
        return {
            "requests_per_s": rps,
            "p50_ms": p50,
            "p99_ms": p99,
            "cpu_s_per_1000": cpu / sent * 1000,
            "engine_cpu_s_per_1000": engine_cpu / sent * 1000,
            "stream_tokens_per_s": streamed["tokens"] / streamed["seconds"],
            "stream_cpu_ms_per_1000": stream_cpu * 1e6 / streamed["tokens"],
            "stream_engine_cpu_ms_per_1000": stream_engine_cpu * 1e6 / streamed["tokens"],
            "stream_client_cpu_ms_per_1000": stream_client_cpu * 1e6 / streamed["tokens"],
            "events_per_stream": streamed["events"] / (opts.streams * opts.stream_repeats),
            "events_per_read": streamed["events"] / streamed["reads"],
            "gap_p99_ms": statistics.median(r["gap_p99_ms"] for r in rounds),
            "rss_mib": rss_mib(stack.pid),
            "startup_ms": stack.startup_s * 1000,
        }


def summarize(rounds: list[dict]) -> dict:
    """Median, min and max of every row over the rounds."""
    return {
        key: {"median": statistics.median(r[key] for r in rounds), "min": min(r[key] for r in rounds),
              "max": max(r[key] for r in rounds)}
        for _, key, _, _, _ in ROWS
    }  # fmt: skip


def print_table(ours: dict, theirs: dict | None, rounds: int, quick: bool, baseline: str = VLLM_BASELINE) -> list[dict]:
    """The issue's table (markdown): median (min-max) for each frontend, the
    ratio and whether its target is met; returns the rows. `baseline` names
    the second column; the targets (issue 21's, against vLLM 0.33) are judged
    only against vLLM's frontend."""
    print(f"\n| measure | ours | {baseline} | ratio | target |\n| --- | --- | --- | --- | --- |")
    table = []
    for name, key, unit, target, higher in ROWS:

        def cell(s: dict, key: str = key, unit: str = unit) -> str:
            return f"{s[key]['median']:,.2f}{unit} ({s[key]['min']:,.2f}-{s[key]['max']:,.2f})"

        if theirs is None:
            print(f"| {name} | {cell(ours)} | skipped | | |")
            continue
        ratio = ours[key]["median"] / theirs[key]["median"]
        verdict = ""
        if target is not None and baseline == VLLM_BASELINE:
            met = ratio >= target if higher else ratio <= target
            goal = f"{'>=' if higher else '<='} {target}x"
            verdict = f"{goal}: {'smoke run' if quick else ('met' if met else 'NOT met')}"
        table.append({"measure": name, "key": key, "ratio": ratio, "target": target, "verdict": verdict})
        print(f"| {name} | {cell(ours)} | {cell(theirs)} | {ratio:.2f}x | {verdict} |")
    print(f"\n(median of {rounds} rounds, min-max in brackets, alternated in each round)")
    return table


def add_options(parser: argparse.ArgumentParser) -> None:
    """The comparison's options (bench_frontend.py takes them too)."""
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=6000, help="max_tokens=1 requests per round (python client)")
    parser.add_argument("--seconds", type=int, default=8, help="length of a wrk round")
    parser.add_argument(
        "--client",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="load generator for max_tokens=1 (default: wrk when installed, `apt-get install wrk`)",
    )
    parser.add_argument(
        "--against",
        type=str,
        default=None,
        help="another build of this frontend (say an older commit's) as the baseline instead of vLLM 0.33's",
    )
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument(
        "--stream-repeats", type=int, default=3, help="back-to-back rounds of streams per measure (summed)"
    )


def compare(opts: argparse.Namespace, stream_load: Path) -> dict:
    """Ours and vLLM 0.33's bundled frontend (where installed), alternated
    over `opts.rounds` rounds on fresh echo engines; prints the table and
    returns the rounds, medians and ratios."""
    if opts.against is not None:
        frontends, why_not, baseline = {"ours": our_frontend(), "vllm033": Path(opts.against)}, "", opts.against
    else:
        (frontends, why_not), baseline = frontends_to_compare(), VLLM_BASELINE
    print(f"{opts.engines} echo engines; {opts.concurrency} connections x max_tokens=1 ({opts.client}), "
          f"{opts.streams} streams x {opts.tokens} tokens; {opts.rounds} rounds; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    measured: dict[str, list[dict]] = {name: [] for name in frontends}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model_dir = write_model_dir(Path(tmp) / "model")
        for round_index in range(opts.rounds):
            order = list(frontends) if round_index % 2 == 0 else list(reversed(frontends))
            for name in order:
                result = measure(frontends[name], model_dir, opts, stream_load, Path(tmp))
                measured[name].append(result)
                print(f"  round {round_index + 1} {name:8s} {result['requests_per_s']:8.0f} req/s  "
                      f"p99 {result['p99_ms']:6.2f} ms  {result['stream_tokens_per_s']:8.0f} tokens/s  "
                      f"{result['events_per_stream']:.0f} events/stream", flush=True)  # fmt: skip
    summary = {name: summarize(rounds) for name, rounds in measured.items()}
    table = print_table(summary["ours"], summary.get("vllm033"), opts.rounds, opts.quick, baseline)
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    return {"cpus": os.cpu_count(), "options": vars(opts), "rounds": measured, "summary": summary,
            "ratios": table, "baseline_skipped": why_not or None}  # fmt: skip


def main() -> int:
    """Runs the rounds; prints the table and writes serve.json."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round (a smoke run)")
    add_options(parser)
    opts = parser.parse_args()
    if opts.against is not None and not Path(opts.against).is_file():
        parser.error(f"--against: no such file: {opts.against}")
    if opts.quick:
        opts.rounds, opts.requests, opts.seconds, opts.stream_repeats = 1, 1000, 3, 1
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    results = compare(opts, build_stream_load())
    (results_dir / "serve.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
