"""Builds the native `vllm-rs` executable and stages it as a wheel script.

maturin packs `packaging/wheel-data` (the `data` directory of `[tool.maturin]`)
into the wheel's `*.data/`; installers copy `*.data/scripts/*`, executable,
into the environment's `bin/`. So staging the binary at
`packaging/wheel-data/scripts/vllm-rs` puts the native executable itself on PATH.

With the extension, one cargo invocation builds the binary and the extension
crate (`vllm-rs-python`) together, so the crates both use are compiled once
with one feature set; the editable install (`editable_wheel.py`) then takes
the extension from the target directory instead of maturin building it again.

Used by the build backend (`vllm_rs_build.py`) and run as a script by
`scripts/setup.sh`, which starts the build while pip installs the dependencies
(`--with-extension`; the same command as the editable build's, so that one
finds everything built).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY_NAME = "vllm-rs"
WHEEL_DATA = ROOT / "packaging" / "wheel-data"
STAGED_BINARY = WHEEL_DATA / "scripts" / BINARY_NAME
EXTENSION_PACKAGE = "vllm-rs-python"
# The extension crate's cdylib (its `[lib] name` is `_core`) and where Python imports it from.
EXTENSION_ARTIFACT = "lib_core.so"
EXTENSION_MODULE_DIR = ROOT / "python" / "vllm_rs"


def ensure_wheel_data() -> None:
    """Creates the wheel data directory (maturin refuses to run without it)."""
    STAGED_BINARY.parent.mkdir(parents=True, exist_ok=True)


def target_dir() -> Path:
    """Cargo's target directory: CARGO_TARGET_DIR (relative to the tree) or ROOT/target."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return target if target.is_absolute() else ROOT / target


def python_for_pyo3() -> str:
    """The interpreter pyo3's build script asks for the Python configuration.

    Spelled the same in every build of one environment (`<prefix>/bin/python`,
    whether this runs as `python` or `python3`): cargo rebuilds pyo3 whenever
    PYO3_PYTHON's value changes.
    """
    candidate = Path(sys.prefix) / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def cargo_build(*, with_extension: bool) -> Path:
    """Runs the release build of `vllm-rs` (and the extension with it); returns the release directory."""
    command = [os.environ.get("CARGO", "cargo"), "build", "--release", "-p", BINARY_NAME]
    if with_extension:
        # `--lib` as well: target flags apply to every package named, and the extension crate has no binary.
        command += ["-p", EXTENSION_PACKAGE, "--features", "pyo3/extension-module", "--lib"]
    command += ["--bin", BINARY_NAME]
    print(f"building: {' '.join(command)}", file=sys.stderr, flush=True)
    env = {**os.environ, "CARGO_TARGET_DIR": str(target_dir())}
    if with_extension:
        env["PYO3_PYTHON"] = python_for_pyo3()
    # Cargo's output goes to stderr: callers keep stdout for themselves.
    subprocess.run(command, cwd=ROOT, check=True, stdout=sys.stderr, env=env)
    return target_dir() / "release"


def stage_binary(release_dir: Path) -> Path:
    """Copies the built `vllm-rs` to the wheel's scripts."""
    ensure_wheel_data()
    shutil.copy2(release_dir / BINARY_NAME, STAGED_BINARY)
    STAGED_BINARY.chmod(0o755)
    return STAGED_BINARY


def stage_frontend_binary() -> Path:
    """Builds `vllm-rs` (release profile) and copies it to the wheel's scripts."""
    return stage_binary(cargo_build(with_extension=False))


def install_extension_in_place(release_dir: Path) -> Path:
    """Copies the built extension to `python/vllm_rs/_core<EXT_SUFFIX>`, where maturin develop puts it."""
    module = EXTENSION_MODULE_DIR / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    # A new inode, not an overwrite: a running Python keeps its mapping of the old file.
    staging = module.with_name(module.name + ".tmp")
    shutil.copy2(release_dir / EXTENSION_ARTIFACT, staging)
    os.replace(staging, module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--with-extension",
        action="store_true",
        help=f"build {EXTENSION_PACKAGE} in the same cargo invocation (what the editable install uses)",
    )
    args = parser.parse_args(argv)
    try:
        stage_binary(cargo_build(with_extension=args.with_extension))
    except subprocess.CalledProcessError as error:
        sys.exit(f"cargo build failed (exit status {error.returncode})")


if __name__ == "__main__":
    main()
