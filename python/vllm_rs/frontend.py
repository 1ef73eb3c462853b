"""Where the native `vllm-rs` executable (the Rust frontend) is.

`pip install .` and `scripts/setup.sh` (`maturin develop`) install it into the
environment's scripts directory (`bin/`), next to the Python that runs this.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

FRONTEND_PATH_ENV = "VLLM_RS_FRONTEND_PATH"
"""Environment variable that overrides where the executable is."""

BINARY_NAME = "vllm-rs"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def frontend_binary() -> str:
    """The path of the `vllm-rs` executable.

    `$VLLM_RS_FRONTEND_PATH` wins when set (it must name an executable file).
    Otherwise: the environment's scripts directory, the directory of
    `sys.executable`, then `PATH`. Raises `FileNotFoundError` naming every
    place it looked.
    """
    override = os.environ.get(FRONTEND_PATH_ENV)
    if override:
        if _is_executable(Path(override)):
            return override
        raise FileNotFoundError(f"{FRONTEND_PATH_ENV}={override!r} is not an executable file")
    candidates: list[Path] = []
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = Path(directory) / BINARY_NAME
        if candidate not in candidates:
            candidates.append(candidate)
    for candidate in candidates:
        if _is_executable(candidate):
            return str(candidate)
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        return on_path
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"the {BINARY_NAME} executable was not found: looked in {looked} and on PATH "
        f"({os.environ.get('PATH', '')!r}); install the package (pip install . or scripts/setup.sh) "
        f"or set {FRONTEND_PATH_ENV}"
    )
