"""vLLM 0.33's own Rust frontend, the `vllm-rs` binary its wheel bundles
(`site-packages/vllm/vllm-rs` in the vLLM venv of tests/compat/README.md), as
the baseline that tests comparing frontends compare ours with. `serve`
launches it exactly as it launches ours and as vLLM launches it (listener
fds and `--args-json`, through `RustFrontendProcessManager`) when
`VLLM_RS_FRONTEND_PATH` names it. No tests live here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
