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
    """The native streaming client (frontend-bin/examples/stream_load.rs)
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
