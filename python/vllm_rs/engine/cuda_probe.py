"""Whether torch would find a CUDA device, answered without importing torch:
`serve`'s supervisor resolves `--device auto` (and checks `--device cuda`)
with it, and stays free of torch, which costs it hundreds of MiB and
seconds to import. The engines, which import torch anyway, ask torch.

The answer is `torch.cuda.is_available()`'s for a CUDA build of torch: the
build has a CUDA version, and the driver (`libcuda.so.1`) initialises, sees
at least one device (`CUDA_VISIBLE_DEVICES` applies) and is of that CUDA
major version or later (CUDA's minor-version compatibility)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

#: Asks the driver for its device count and version, printed as two
#: integers (0 0 when it cannot be loaded or initialised). It runs in a
#: child so that the driver is never initialised in the supervisor, whose
#: children must not inherit a CUDA context.
_DRIVER_QUERY = """
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    print(0, 0)
else:
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    ok = cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    ok = ok and cuda.cuDriverGetVersion(ctypes.byref(version)) == 0
    print(count.value if ok else 0, version.value if ok else 0)
"""
#: How long the driver query may take (a driver's first initialisation can
#: take seconds on a machine with many devices).
DRIVER_QUERY_TIMEOUT_S = 60.0


def torch_cuda_version() -> str | None:
    """`torch.version.cuda` of the installed torch (e.g. "12.8"), read from
    its `version.py` without importing torch; None for a CPU or ROCm build,
    or when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or []:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
                return node.value.value if isinstance(node.value.value, str) else None
    return None


def driver_devices() -> tuple[int, int]:
    """(devices the CUDA driver sees, its CUDA version as 1000 * major + 10 *
    minor), (0, 0) without a usable driver. Raises RuntimeError, with the
    child's output, when the query itself fails."""
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _DRIVER_QUERY],
            capture_output=True, text=True, timeout=DRIVER_QUERY_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"asking the CUDA driver for its devices failed: {e}") from None
    try:
        count, version = (int(word) for word in result.stdout.split())
    except ValueError:
        raise RuntimeError(
            f"asking the CUDA driver for its devices failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()!r}"
        ) from None
    return count, version


def cuda_available() -> bool:
    """What `torch.cuda.is_available()` would answer, without importing
    torch (see the module's description)."""
    built_for = torch_cuda_version()
    if built_for is None:
        return False
    count, version = driver_devices()
    return count > 0 and version // 1000 >= int(built_for.split(".")[0])
