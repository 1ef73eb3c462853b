"""vLLM 0.33's own Rust frontend, the `vllm-rs` binary its wheel bundles
(`site-packages/vllm/vllm-rs` in the vLLM venv of tests/compat/README.md), as
the baseline that tests comparing frontends compare ours with, both launched
as vLLM launches its frontend (`RustFrontendProcessManager`: inherited
listener fds and `--args-json`) in front of the echo engine (or the toy
model's, for what needs a KV cache). No tests live here."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_rs.engine import make_engine_config, run_engine_core
from vllm_rs.engine.config import ClientAddresses
from vllm_rs.utils import CoreEngineProcManager

from tests.support.frontend_stack import engine_listeners, rust_frontend
from tests.support.http import request
from tests.support.wait import wait_until

#: Where the vLLM 0.33 venv is (default `~/.cache/vllm033`).
VLLM_VENV_ENV = "VLLM_RS_VLLM033_VENV"


def bundled_frontend() -> Path | None:
    """The bundled binary of the vLLM venv, or None when there is none."""
    venv = Path(os.environ.get(VLLM_VENV_ENV) or "~/.cache/vllm033").expanduser()
    for binary in sorted(venv.glob("lib/python3*/site-packages/vllm/vllm-rs")):
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def bundled_frontend_or_skip() -> Path:
    """The bundled binary; skips the calling test, saying why, without one."""
    binary = bundled_frontend()
    if binary is None:
        pytest.skip(
            f"vLLM 0.33's bundled frontend is not installed (no vllm/vllm-rs under ${VLLM_VENV_ENV} or ~/.cache/vllm033)"
        )
    return binary


@contextlib.contextmanager
def frontend_before_echo(
    binary: str | Path,
    model_dir: Path,
    *,
    engine_model: str = "echo",
    engine_options: dict[str, Any] | None = None,
    **args: object,
) -> Iterator[int]:
    """`binary` (a `vllm-rs` frontend) serving one engine of `engine_model`
    (`make_engine_config` with `engine_options`), the model directory
    `model_dir` (a `config.json` and a Hugging Face tokenizer) as its model
    and tokenizer, `args` added to its `--args-json`; yields the HTTP port
    once `/health` answers 200."""
    listeners = engine_listeners()
    clients = [ClientAddresses(listeners.input.address, listeners.output.address)]
    config = make_engine_config(engine_model, clients=clients, **(engine_options or {}))
    engines = CoreEngineProcManager(run_engine_core, 1, 0, 0, config, True, listeners.input.address, None, False)
    try:
        namespace = argparse.Namespace(model=str(model_dir), model_tag=str(model_dir), tokenizer=str(model_dir), **args)
        with rust_frontend(namespace, listeners, binary=binary) as frontend:

            def healthy() -> bool:
                assert frontend.process.is_alive(), f"{binary} exited"
                try:
                    return request("GET", frontend.port, "/health", timeout_s=5)[0] == 200
                except OSError:
                    return False

            wait_until(healthy, f"{binary} to serve")
            yield frontend.port
    finally:
        engines.shutdown()
