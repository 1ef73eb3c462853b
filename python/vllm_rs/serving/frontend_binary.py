"""Where the native `vllm-rs` executable (the Rust frontend) is.

`pip install .` and `scripts/setup.sh` (`pip install -e .`) install it into the
environment's scripts directory (`bin/`), next to the Python that runs this.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

FRONTEND_PATH_ENV = "VLLM_RS_FRONTEND_PATH"
"""Environment variable that overrides where the executable is."""

BINARY_NAME = "vllm-rs"

DISTRIBUTION = "vllm-rs"
"""The distribution whose recorded files hold the executable."""


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _installed_binary() -> Path | None:
    """The `vllm-rs` file the installed `vllm-rs` distribution recorded (its
    wheel puts it in the environment's scripts directory), if any."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == BINARY_NAME:
            return Path(os.path.normpath(file.locate()))
    return None


def frontend_binary() -> str:
    """The path of the `vllm-rs` executable that belongs to this package.

    `$VLLM_RS_FRONTEND_PATH` wins when set (it must name an executable file).
    Otherwise the executable the installed distribution recorded. Never
    another `vllm-rs` on `PATH`: that could be another version's binary,
    speaking another protocol. Raises `FileNotFoundError` saying where it
    looked.
    """
    override = os.environ.get(FRONTEND_PATH_ENV)
    if override:
        if _is_executable(Path(override)):
            return override
        raise FileNotFoundError(f"{FRONTEND_PATH_ENV}={override!r} is not an executable file")
    installed = _installed_binary()
    if installed is not None and _is_executable(installed):
        return str(installed)
    looked = f"the {DISTRIBUTION} distribution's files ({installed or 'none recorded'})"
    raise FileNotFoundError(
        f"the {BINARY_NAME} executable was not found: looked in {looked}; install the package "
        f"(pip install . or scripts/setup.sh) or set {FRONTEND_PATH_ENV}"
    )
