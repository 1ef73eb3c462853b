"""What `python -m vllm_rs serve` costs in memory with its defaults (the
packaged SmolLM2 GGUF, one engine): the supervisor, which only supervises,
maps neither torch nor numpy and stays small.

One server for the module; skipped, saying why, without the packaged model
or the frontend binary."""

from __future__ import annotations

import importlib.util
import os

import pytest
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

from tests.test_serve import Serve, rust_frontend_available

try:
    GGUF = packaged_model_path()
except ModelNotFoundError as e:
    pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}", allow_module_level=True)
if not rust_frontend_available():
    pytest.skip("the vllm-rs binary is not built", allow_module_level=True)

#: The issue's ceiling for the supervisor (it had 540 MiB with torch loaded).
SUPERVISOR_RSS_LIMIT = 64 << 20


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid`, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no VmRSS line")


def mapped_files(pid: int) -> set[str]:
    """The files `pid` has mapped (shared libraries included)."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        return {parts[5] for parts in (line.rstrip("\n").split(maxsplit=5) for line in f) if len(parts) == 6}


def package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return os.path.realpath(spec.submodule_search_locations[0]) + os.sep


@pytest.fixture(scope="module")
def server():
    serve = Serve("--port", "0", "--host", "127.0.0.1")
    try:
        serve.wait_ready(timeout_s=600)
        yield serve
    finally:
        serve.kill()


def test_the_supervisor_maps_neither_torch_nor_numpy_and_stays_small(server):
    files = mapped_files(server.proc.pid)
    for package in ("torch", "numpy"):
        folder = package_dir(package)
        loaded = sorted(f for f in files if os.path.realpath(f).startswith(folder))
        assert not loaded, f"serve's supervisor has {package} mapped: {loaded[:5]}"
    assert rss_bytes(server.proc.pid) < SUPERVISOR_RSS_LIMIT
