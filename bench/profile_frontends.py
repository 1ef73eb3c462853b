"""Where each frontend's CPU goes on the max_tokens=1 row of bench_serve.py:
`perf record` (cpu-clock samples, the frontend process only) while wrk sends
max_tokens=1 completions from 64 connections to this project's frontend and to
vLLM 0.33's bundled one (bench/frontends.py), each on fresh `echo` engines.
Prints the top symbols by self time of each (flat profile: the share of the
frontend's samples spent in the function itself), grouped into costs
(`GROUPS`: the kernel, allocation, JSON, HTTP, the runtime, the tokenizer,
the engine protocol, metrics, copies; docs/frontend-performance.md, "The
fast paths", says which were cut), and writes the reports to
bench/results/profile-*.txt.

Both binaries keep their symbol tables; neither needs frame pointers for a
flat profile. `--inclusive` records call graphs too (`--call-graph dwarf`,
unwound from the stack copies perf takes, so no frame pointers either) and
lists the symbols by inclusive time (the share of samples in a function or
what it called): that is what tells which request step the allocations and
copies belong to (prompt encoding, detokenizer set-up, the HTTP write). `perf` is Debian's `linux-perf` (`apt-get install linux-perf`);
wrk is required (`apt-get install wrk`).

`--stream` records the streamed row instead (64 streams of 256 tokens,
`--stream-rounds` of them, read by the native client of bench_frontend.py)
and prints the frontend's CPU milliseconds per 1000 streamed tokens beside
the profile, and what it asked of the kernel per 1000 streamed tokens
(`perf stat` on the syscall tracepoints: `writev`s to the clients, reads of
the engines' sockets, `epoll_wait`s, futex calls, context switches) with the
client's reads: how many events each write carries is the cost the profile
cannot show, since on loopback every write also runs the receiving side's
TCP path and wakes the reader.

Run: ~/.cache/vllm-rs/venv/bin/python bench/profile_frontends.py [--seconds 8] [--stream] [--inclusive]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_frontend import build_stream_load, frontend_requests, stream_round  # noqa: E402
from bench.bench_serve import WRK_SCRIPT, run, wrk_requests  # noqa: E402
from bench.frontends import cpu_seconds, echo_engines, frontend_stack, frontends_to_compare, write_model_dir  # noqa: E402

#: Cost groups: a symbol belongs to the first group whose pattern it matches.
GROUPS = [
    ("kernel: sockets, syscalls, scheduling", r"^\[k\]"),
    ("allocation (malloc/free)", r"malloc|free|realloc|calloc|_int_|mi_|je_|tcache|arena|alloc::"),
    ("JSON parse/render", r"serde_json|serde::|sonic|simd_json|itoa|ryu"),
    ("HTTP (hyper/axum/h1)", r"hyper|axum|http::|httparse|h2::"),
    ("tokio runtime (tasks, wakers, I/O driver)", r"tokio|mio|futures|parking_lot|std::sync"),
    ("tokenizer / detokenizer", r"tokenizers|tokenizer|decode|onig|regex|fancy_regex|aho_corasick"),
    ("engine protocol (msgpack, ZMTP)", r"rmp|msgpack|zmq|zmtp|codec"),
    ("metrics / logging", r"prometheus|metrics|tracing"),
    ("memory copies / string ops", r"memcpy|memmove|memset|memcmp|strlen|__mem"),
]


def perf_report(data: Path, inclusive: bool = False) -> list[tuple[float, str]]:
    """(percent of samples, symbol) by self time, or by inclusive time
    (children counted) when `inclusive`, from `perf report`."""
    children = ["--children", "-g", "none"] if inclusive else ["--no-children"]
    out = subprocess.run(
        ["perf", "report", "-i", str(data), *children, "--sort", "symbol", "--stdio", "--percent-limit", "0.2"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = []
    for line in out.splitlines():
        # Self time is the only column without children; with them it is the second.
        match = re.match(r"^\s+([\d.]+)%\s+(?:[\d.]+%\s+)?(.*)$", line)
        if match:
            rows.append((float(match.group(1)), match.group(2).strip()))
    return rows


def grouped(rows: list[tuple[float, str]]) -> dict[str, float]:
    """Percent of samples per cost group (`other` for the rest)."""
    totals: dict[str, float] = {}
    for percent, symbol in rows:
        name = next((g for g, pattern in GROUPS if re.search(pattern, symbol)), "other")
        totals[name] = totals.get(name, 0.0) + percent
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def profile(name: str, binary: Path, opts: argparse.Namespace, tmp: Path, out_dir: Path) -> None:
    """One frontend under wrk, recorded by perf; prints and writes its report."""
    model_dir = write_model_dir(tmp / "model")
    script = tmp / "max_tokens_1.lua"
    script.write_text(WRK_SCRIPT)
    data = tmp / f"{name}.perf"
    with (
        echo_engines(model_dir, 2) as engines,
        frontend_stack(binary, model_dir, engines, tmp / f"{name}.log") as stack,
    ):
        run(frontend_requests(stack.port, 64, 256))  # warm-up
        graph = ["--call-graph", "dwarf,16384", "-F", "499"] if opts.inclusive else ["-F", "1999"]
        recorder = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", *graph, "-p", str(stack.pid), "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            measured = streamed(stack, opts, tmp) if opts.stream else loaded(stack, opts, script)
        finally:
            recorder.send_signal(2)
            recorder.wait(60)
    rows = perf_report(data)
    inclusive = perf_report(data, inclusive=True) if opts.inclusive else []
    data.unlink()
    lines = [f"{name}: {binary}", measured, ""]
    lines.append("cost groups (% of the frontend's samples):")
    lines += [f"  {percent:5.1f}%  {group}" for group, percent in grouped(rows).items()]
    lines.append("")
    lines.append(f"top {opts.top} symbols by self time:")
    lines += [f"  {percent:5.2f}%  {symbol[:150]}" for percent, symbol in rows[: opts.top]]
    if inclusive:
        lines += ["", f"top {opts.top} symbols by inclusive time:"]
        lines += [f"  {percent:5.2f}%  {symbol[:150]}" for percent, symbol in inclusive[: opts.top]]
    text = "\n".join(lines)
    print(text + "\n", flush=True)
    (out_dir / f"profile-{name}{'-stream' if opts.stream else ''}.txt").write_text(text + "\n")


def loaded(stack, opts: argparse.Namespace, script: Path) -> str:
    """The max_tokens=1 load (wrk) while recorded; what it measured."""
    rps, _, p99, sent = wrk_requests(stack.port, 64, opts.seconds, script)
    return f"{rps:.0f} req/s, p99 {p99:.2f} ms, {sent} requests while recorded"


#: What `--stream` counts of the frontend's requests to the kernel, with the name it prints.
KERNEL_COUNTS = {
    "syscalls:sys_enter_writev": "writev (HTTP writes)",
    "syscalls:sys_enter_recvfrom": "recvfrom (engine socket reads)",
    "syscalls:sys_enter_epoll_wait": "epoll_wait",
    "syscalls:sys_enter_futex": "futex",
    "syscalls:sys_enter_write": "write (worker wake-ups)",
    "context-switches": "context switches",
}


def streamed(stack, opts: argparse.Namespace, tmp: Path) -> str:
    """`opts.stream_rounds` rounds of 64 x 256 streamed tokens while recorded
    and counted (`KERNEL_COUNTS`); what they measured."""
    stream_load = build_stream_load()
    counts_file = tmp / "kernel-counts.csv"
    with KernelCounter(stack.pid, counts_file):
        before, tokens, seconds, reads = cpu_seconds(stack.pid), 0, 0.0, 0
        for _ in range(opts.stream_rounds):
            result = stream_round(stream_load, stack.port, 64, 256)
            tokens, seconds, reads = tokens + result["tokens"], seconds + result["seconds"], reads + result["reads"]
        cpu_ms = (cpu_seconds(stack.pid) - before) * 1e6 / tokens
    lines = [
        f"{tokens / seconds:.0f} streamed tokens/s, {cpu_ms:.2f} frontend CPU ms per 1000 tokens (perf running)",
        "per 1000 streamed tokens:",
        *(f"  {count:7.1f}  {name}" for name, count in kernel_counts(counts_file, tokens / 1000)),
        f"  {reads * 1000 / tokens:7.1f}  reads by the client",
    ]
    return "\n".join(lines)


class KernelCounter:
    """`perf stat` counting `KERNEL_COUNTS` of `pid` into `out` exactly
    while the `with` block runs: perf starts with its counters disabled and
    each enable and disable waits for perf's acknowledgement, so attaching
    to the process takes nothing from the counted rounds."""

    def __init__(self, pid: int, out: Path):
        control, self._control = os.pipe()
        self._ack, ack = os.pipe()
        try:
            self._perf = subprocess.Popen(
                ["perf", "stat", "-x,", "-o", str(out), "-D", "-1", "--control", f"fd:{control},{ack}",
                 "-e", ",".join(KERNEL_COUNTS), "-p", str(pid)],
                pass_fds=(control, ack), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
        except OSError:
            os.close(self._control)
            os.close(self._ack)
            raise
        finally:
            os.close(control)
            os.close(ack)

    def _command(self, command: bytes) -> None:
        """Sends `command` to perf and waits for its acknowledgement; a perf
        that ended instead (it could not attach or open a tracepoint) is an
        error with what it printed."""
        try:
            os.write(self._control, command + b"\n")
            answer = os.read(self._ack, 16)
        except BrokenPipeError:
            answer = b""
        if not answer.startswith(b"ack"):
            _, errors = self._perf.communicate(timeout=60)
            raise RuntimeError(
                f"perf stat did not acknowledge {command.decode()!r} (exit {self._perf.returncode}): "
                f"{errors.decode(errors='replace').strip()}"
            )

    def _end(self) -> None:
        """Stops perf (it writes its counts as it ends) and closes the pipes."""
        try:
            self._perf.send_signal(signal.SIGINT)
            self._perf.communicate(timeout=60)
        finally:
            os.close(self._control)
            os.close(self._ack)

    def __enter__(self) -> KernelCounter:
        try:
            self._command(b"enable")
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._command(b"disable")
        finally:
            self._end()


def kernel_counts(counts_file: Path, per: float) -> list[tuple[str, float]]:
    """`perf stat -x,` output read back: (printed name, count / `per`) for
    each of `KERNEL_COUNTS` perf could count (a tracepoint it may not open is
    left out, as perf reports it `<not supported>`)."""
    counts = []
    for line in counts_file.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in KERNEL_COUNTS and fields[0].isdigit():
            counts.append((KERNEL_COUNTS[fields[2]], int(fields[0]) / per))
    return counts


def main() -> int:
    """Profiles both frontends (ours only without vLLM 0.33)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8, help="length of the recorded wrk run")
    parser.add_argument("--top", type=int, default=30, help="symbols listed per frontend")
    parser.add_argument(
        "--inclusive", action="store_true", help="record call graphs too and list symbols by inclusive time"
    )
    parser.add_argument("--stream", action="store_true", help="record 64 x 256 streamed tokens instead of max_tokens=1")
    parser.add_argument("--stream-rounds", type=int, default=3, help="streamed rounds recorded with --stream")
    opts = parser.parse_args()
    for tool in ("perf", "wrk"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (apt-get install {'linux-perf' if tool == 'perf' else tool})")
            return 2
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    frontends, _ = frontends_to_compare()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        for name, binary in frontends.items():
            profile(name, binary, opts, Path(tmp), out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
