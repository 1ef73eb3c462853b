"""Every script in bench/ imports: a name one of them takes from another
module that was renamed or removed fails here, in CI, instead of in the next
benchmark run (bench_multinode.py once imported a helper from bench_serve.py
that had moved away)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("name", sorted(path.stem for path in BENCH.glob("*.py")))
def test_bench_script_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


def test_stream_load_reports_how_events_reached_it(tmp_path):
    """The native streaming client (bench/clients/src/stream_load.rs)
    against this project's frontend on echo engines: every token counted,
    each read bringing at least one event, and the gaps between a stream's
    events ordered."""
    from bench.bench_frontend import build_stream_load, stream_round
    from bench.frontends import echo_engines, frontend_stack, our_frontend, write_model_dir

    model_dir = write_model_dir(tmp_path / "model")
    with (
        echo_engines(model_dir, 1) as engines,
        frontend_stack(our_frontend(), model_dir, engines, tmp_path / "fe.log") as stack,
    ):
        result = stream_round(build_stream_load(), stack.port, streams=4, tokens=16)
    assert result["tokens"] == 4 * 16
    # One event per engine output and token, plus the usage chunk and [DONE].
    assert result["events"] >= 4 * (16 + 2), result
    assert 4 <= result["reads"] <= result["events"], result
    assert 0 <= result["gap_p50_ms"] <= result["gap_p99_ms"] < result["seconds"] * 1000, result


def test_kernel_counter_counts_only_inside_its_block(tmp_path):
    """bench/profile_frontends.py's `KernelCounter` (perf stat on syscall
    tracepoints, started disabled, enabled and disabled through perf's
    control fds) counts a real process's `writev`s made inside the `with`
    block and none of those made once perf is attached but before it, or
    after it."""
    import shutil
    import subprocess
    import sys

    from bench.profile_frontends import KernelCounter, kernel_counts

    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (apt-get install linux-perf)")
    probe = subprocess.run(
        ["perf", "stat", "-x,", "-e", "syscalls:sys_enter_writev", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0 or "<not supported>" in probe.stderr:
        pytest.skip(f"perf cannot count syscall tracepoints here: {probe.stderr.strip()[:200]}")
    # The child makes n writev calls each time it reads a line naming n, then answers.
    child_code = (
        "import os, sys\n"
        "for line in sys.stdin:\n"
        "    for _ in range(int(line)):\n"
        "        os.writev(2, [b''])\n"
        "    sys.stdout.write('done\\n'); sys.stdout.flush()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )

    def writevs(n: int) -> None:
        child.stdin.write(f"{n}\n")
        assert child.stdout.readline() == "done\n"

    out = tmp_path / "counts.csv"
    try:
        counter = KernelCounter(child.pid, out)
        writevs(5)  # perf attached or attaching, its counters still disabled
        with counter:
            writevs(40)
        writevs(7)  # disabled again; perf has ended
    finally:
        child.stdin.close()
        child.wait(30)
    assert dict(kernel_counts(out, 1.0))["writev (HTTP writes)"] == 40, out.read_text()


def test_kernel_counter_reports_a_perf_that_could_not_attach(tmp_path):
    """A `KernelCounter` on a process that is gone raises with perf's own
    complaint instead of hanging on its acknowledgement, and leaves no pipe
    open behind it."""
    import os
    import shutil
    import subprocess
    import sys

    from bench.profile_frontends import KernelCounter

    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (apt-get install linux-perf)")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fds_before = set(os.listdir("/proc/self/fd"))
    counter = KernelCounter(gone.pid, tmp_path / "counts.csv")
    with pytest.raises(RuntimeError, match=r"perf stat did not acknowledge 'enable' \(exit [1-9]\d*\): \S"):
        counter.__enter__()
    assert set(os.listdir("/proc/self/fd")) <= fds_before


def test_moe_bench_serves_each_model_and_counts_active_parameters(tmp_path):
    """bench/bench_moe.py at a tiny size, one round: it serves the MoE and
    both dense models through `serve`, every level yields tokens, and the
    counts hold: the MoE's active parameters are dense-active's plus its
    routers, its total dense-total's plus its routers."""
    import json

    from bench.bench_moe import main

    layers, hidden, experts = 1, 64, 4
    argv = ["--rounds", "1", "--hidden", str(hidden), "--layers", str(layers), "--heads", "4", "--kv-heads", "2",
            "--experts", str(experts), "--top-k", "2", "--expert-intermediate", "32", "--prompt-tokens", "8",
            "--output-tokens", "4", "--one-stream-requests", "1", "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = json.loads((tmp_path / "moe.json").read_text())
    counts = out["parameters"]
    routers = layers * hidden * experts
    assert counts["moe"]["active"] == counts["dense-active"]["total"] + routers
    assert counts["moe"]["total"] == counts["dense-total"]["total"] + routers
    assert counts["moe"]["active"] < counts["moe"]["total"]
    for name in ("moe", "dense-active", "dense-total"):
        assert out["rounds"][0][name]["tok_s_16"] > 0 and out["rounds"][0][name]["tok_s_1"] > 0
    assert set(out["ratios"]) == {"moe/dense-active", "moe/dense-total"}


def test_moe_bench_names_a_bad_option(capsys):
    """An option out of range exits 2 naming it, before anything is written."""
    from bench.bench_moe import main

    assert main(["--top-k", "9", "--experts", "8"]) == 2
    assert "--top-k 9 is more than --experts 8" in capsys.readouterr().err
