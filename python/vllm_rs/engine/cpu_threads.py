"""The threads an engine process computes on, on the CPU: torch's intra-op
threads and the Rust kernels' (`vllm_rs._core.gguf_matmul`,
`paged_decode_attention`), whose workers stay up between calls. Imports
torch only where torch runs: the native runner's engine never loads it."""

from __future__ import annotations

import os
import sys

from vllm_rs.engine.config import EngineConfig

_kernel_threads: int | None = None


def kernel_threads() -> int:
    """Threads each Rust kernel call is split across: what
    `set_kernel_threads` or `limit_cpu_threads` set, else torch's intra-op
    thread count."""
    if _kernel_threads is not None:
        return _kernel_threads
    import torch

    return torch.get_num_threads()


def set_kernel_threads(threads: int) -> None:
    """Splits later kernel calls across `threads` (at least 1) threads;
    ValueError otherwise."""
    global _kernel_threads
    if threads < 1:
        raise ValueError(f"kernel threads must be at least 1, got {threads}")
    _kernel_threads = threads


def limit_cpu_threads(config: EngineConfig) -> None:
    """Gives each engine on the CPU its share of the cores (`OMP_NUM_THREADS`
    when set), for torch and the kernels alike. The toy model's ops are tiny,
    and oversubscribed intra-op threads spin against the frontend and each
    other, so it leaves a core's share to the frontend; a real model's (or
    an encoder's) matmuls are the work, so its engines share all the cores."""
    threads = omp_num_threads()
    if threads is None:
        engines = config.parallel_config.data_parallel_size
        spec = config.model_config.spec
        heavy = spec.is_real or spec.is_encoder
        threads = max(1, (os.cpu_count() or 1) // (engines if heavy else engines + 1))
    # torch's threads where this process runs torch (its runners import it
    # before calling this); importing it here would cost a torch-free
    # engine 6 s and 600 MiB.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    set_kernel_threads(threads)


def omp_num_threads() -> int | None:
    """`OMP_NUM_THREADS` as OpenMP reads it (the first of a list), or None
    when it is unset or not a positive count (OpenMP warns of that itself)."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        return None
    return threads if threads >= 1 else None


def keep_torch_on_one_thread() -> None:
    """For a model whose every matmul is a kernel call: torch's own operators
    (norms, RoPE, SiLU, the prefill's attention) run on one thread and the
    kernels keep their threads. Measured faster at batch 1 and 16 with 2
    threads than torch on both: torch's operators of a step are too small
    to split, and its idle OpenMP threads spin on the CPU that the kernel's
    second worker needs (docs/real-model-speed.md, "Threads")."""
    import torch

    torch.set_num_threads(1)
