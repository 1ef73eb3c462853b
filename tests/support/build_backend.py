"""Runs a piece of the project's PEP 517 backend the way a build frontend does.

From the source tree, with `backend-path` (build_backend/) on sys.path and
the running interpreter's maturin on PATH; the snippet prints `<MARKER>=<file
name>` and this returns the file name. Nothing lands in the tree's caches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_backend(snippet: str, out_dir: Path, marker: str, *, bin_dir: Path | None = None, timeout: float = 300) -> str:
    """Runs snippet (which reads out_dir as sys.argv[1]) and returns what it printed after `marker=`."""
    path = os.environ.get("PATH", "")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir or Path(sys.executable).parent), path]),
        "PYTHONDONTWRITEBYTECODE": "1",  # no build_backend/__pycache__ left in the tree
    }
    result = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.path.insert(0, 'build_backend')\n" + snippet, str(out_dir)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"the build backend failed:\n{result.stdout}\n{result.stderr}"
    prefix = f"{marker}="
    return [line for line in result.stdout.splitlines() if line.startswith(prefix)][-1].removeprefix(prefix)
