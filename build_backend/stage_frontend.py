"""Builds the native `vllm-rs` executable and stages it as a wheel script.

maturin packs `packaging/wheel-data` (the `data` directory of `[tool.maturin]`)
into the wheel's `*.data/`; installers copy `*.data/scripts/*`, executable,
into the environment's `bin/`. So staging the binary at
`packaging/wheel-data/scripts/vllm-rs` puts the native executable itself on PATH.

Used by the build backend (`vllm_rs_build.py`, for `pip install .`) and run
as a script by `scripts/setup.sh` before `maturin develop`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY_NAME = "vllm-rs"
WHEEL_DATA = ROOT / "packaging" / "wheel-data"
STAGED_BINARY = WHEEL_DATA / "scripts" / BINARY_NAME


def ensure_wheel_data() -> None:
    """Creates the wheel data directory (maturin refuses to run without it)."""
    STAGED_BINARY.parent.mkdir(parents=True, exist_ok=True)


def stage_frontend_binary() -> Path:
    """Builds `vllm-rs` (release profile) and copies it to the wheel's scripts."""
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    if not target_dir.is_absolute():
        target_dir = ROOT / target_dir
    command = [os.environ.get("CARGO", "cargo"), "build", "--release", "-p", "vllm-rs", "--bin", BINARY_NAME]
    print(f"staging the frontend binary: {' '.join(command)}", file=sys.stderr, flush=True)
    # Cargo's output goes to stderr: callers keep stdout for themselves.
    env = {**os.environ, "CARGO_TARGET_DIR": str(target_dir)}
    subprocess.run(command, cwd=ROOT, check=True, stdout=sys.stderr, env=env)
    ensure_wheel_data()
    shutil.copy2(target_dir / "release" / BINARY_NAME, STAGED_BINARY)
    STAGED_BINARY.chmod(0o755)
    return STAGED_BINARY


if __name__ == "__main__":
    stage_frontend_binary()
