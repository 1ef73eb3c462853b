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
