"""Byte-compiles the Python packages `serve` imports (the supervisor's and a
GGUF engine's: vllm_rs, numpy, zmq, msgpack, ...), so that no start of
`serve` compiles them again. Python would cache them on first use, but not
where it is told not to write bytecode (PYTHONDONTWRITEBYTECODE, as on this
project's CI machines) or cannot (a read-only install), and setup.sh installs
with `pip --no-compile` (compiling torch and transformers would take minutes).
Compiling them at every start cost the engine about 0.3 s of its cold start
(docs/serve.md, "First contact, against llama-server"). Run by setup.sh; safe
to run again."""

from __future__ import annotations

import compileall
import importlib
import os
import sys

#: What a `serve` of a GGUF imports: the supervisor, the engine process and
#: its torch-free runner.
SERVING_MODULES = (
    "vllm_rs.__main__",
    "vllm_rs.serving.serve",
    "vllm_rs.process.child_entry",
    "vllm_rs.engine.core_proc",
    "vllm_rs.engine.worker.model_runner",
    "vllm_rs.engine.worker.native_executor",
)


def package_roots() -> list[str]:
    """The folders of the top-level packages those modules load (the
    standard library's own excluded: its bytecode ships with Python)."""
    for name in SERVING_MODULES:
        importlib.import_module(name)
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    roots = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py") or os.path.realpath(path).startswith(stdlib + os.sep):
            continue
        top = sys.modules.get(module.__name__.partition(".")[0])
        folders = getattr(top, "__path__", None)
        roots.update(folders if folders else [path])
    return sorted(roots)


def main() -> int:
    """Compiles every root quietly; exit 1 if any file failed to compile."""
    ok = True
    for root in package_roots():
        if os.path.isdir(root):
            ok &= bool(compileall.compile_dir(root, quiet=1, workers=0, rx=None))
        else:
            ok &= bool(compileall.compile_file(root, quiet=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
