"""Byte-compiles the Python packages `serve` imports (SERVING_PACKAGES: the
supervisor's and a GGUF engine's), so that no start of `serve` compiles
them again. Python would cache them on first use, but not where it is told
not to write bytecode (PYTHONDONTWRITEBYTECODE, as on this project's CI
machines) or cannot (a read-only install), and setup.sh installs with
`pip --no-compile` (compiling torch and transformers would take minutes).
Compiling them at every start cost about 0.3 s of `serve`'s cold start
(docs/serve.md, "First contact, against llama-server"). Imports nothing it
compiles (setup.sh runs it beside the build of `vllm_rs._core`);
tests/test_serve_footprint.py checks that the list covers what SERVING_MODULES
import. Safe to run again."""

from __future__ import annotations

import compileall
import importlib.util
import sys
from pathlib import Path

#: What a `serve` of a GGUF runs: the supervisor, the engine process and
#: its torch-free runner.
SERVING_MODULES = (
    "vllm_rs.__main__",
    "vllm_rs.serving.serve",
    "vllm_rs.process.child_entry",
    "vllm_rs.engine.core_proc",
    "vllm_rs.engine.worker.model_runner",
    "vllm_rs.engine.worker.native_executor",
)
#: The top-level packages outside the standard library that they import.
SERVING_PACKAGES = ("vllm_rs", "numpy", "zmq", "msgpack")
#: This checkout's own package, which the editable install serves: compiled
#: where it lies, as setup.sh runs this before that install (on a fresh venv
#: `vllm_rs` is not installed yet, or still points at another checkout).
SOURCE_PACKAGE = Path(__file__).resolve().parent.parent / "python" / "vllm_rs"


def main() -> int:
    """Compiles every package quietly; exit 1 if one is missing or any file
    failed to compile."""
    ok = True
    for name in SERVING_PACKAGES:
        if name == "vllm_rs":
            folders = [str(SOURCE_PACKAGE)]
        else:
            spec = importlib.util.find_spec(name)
            folders = spec.submodule_search_locations if spec is not None else None
        if not folders:
            print(f"compile_serving_path.py: package {name} is not installed", file=sys.stderr)
            ok = False
            continue
        for folder in folders:
            ok &= bool(compileall.compile_dir(folder, quiet=1, workers=0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
