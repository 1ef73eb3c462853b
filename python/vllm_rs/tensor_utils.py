"""Torch-facing helpers of `vllm_rs.utils` (the "Tensor utilities" contract).

Everything here works on a CPU-only machine (`device="cpu"`, `PIN_MEMORY`
False) and uses pinned host memory and non-blocking copies on CUDA.
`compute_iteration_details` and the scheduler-output dataclasses it reads
live in the torch-free `vllm_rs.iteration_details` and are re-exported here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from typing import Any

import numpy as np
import torch

from vllm_rs.iteration_details import (
    CachedRequestData,
    EncoderInputStats,
    IterationDetails,
    NewRequestData,
    SchedulerOutput,
    compute_iteration_details,
)

logger = logging.getLogger(__name__)

__all__ = [
    "PIN_MEMORY",
    "CachedRequestData",
    "CpuGpuBuffer",
    "EncoderInputStats",
    "IterationDetails",
    "NewRequestData",
    "SchedulerOutput",
    "bind_kv_cache",
    "compute_iteration_details",
    "copy_slice",
    "extract_layer_index",
    "is_pin_memory_available",
    "record_function_or_nullcontext",
    "tensor_data",
]


# --------------------------------------------------------------------------
# Pinned memory
# --------------------------------------------------------------------------


def _pin_memory_unavailable_reason() -> str | None:
    """Why pinned host memory cannot be used here, or None when it can."""
    if "microsoft" in platform.uname().release.lower():
        return "WSL is detected (pinned memory is unreliable there)"
    if torch.version.cuda is None and torch.version.hip is None:
        return "torch is a CPU-only build"
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    return None


@functools.cache
def is_pin_memory_available() -> bool:
    """True when page-locked host memory can be used for host/device copies.

    Computed once per process; when False, the reason is logged once at
    debug level.
    """
    reason = _pin_memory_unavailable_reason()
    if reason is not None:
        logger.debug("Using pin_memory=False: %s", reason)
        return False
    return True


PIN_MEMORY: bool = is_pin_memory_available()
"""Whether host buffers are pinned by default (False on CPU-only machines)."""


# --------------------------------------------------------------------------
# Host/device buffers and copies
# --------------------------------------------------------------------------


class CpuGpuBuffer:
    """A host tensor `.cpu`, a same-shaped device tensor `.gpu` and, unless
    `with_numpy=False`, a numpy array `.np` sharing `.cpu`'s memory.

    `.cpu` is pinned when `pin_memory` is asked for and pinned memory is
    available. Works with `device="cpu"` (then `.gpu` is a second host tensor).
    """

    def __init__(
        self,
        *size: int | torch.SymInt,
        dtype: torch.dtype,
        device: torch.device | str,
        pin_memory: bool = PIN_MEMORY,
        with_numpy: bool = True,
    ) -> None:
        if with_numpy and dtype == torch.bfloat16:
            # Checked before allocating: no point in creating the buffers.
            raise ValueError(
                "Bfloat16 torch tensors cannot be directly cast to a "
                "numpy array, so call CpuGpuBuffer with with_numpy=False"
            )
        pin = bool(pin_memory) and is_pin_memory_available()
        # These buffers are mutable runtime state: allocate them as normal
        # tensors even when the caller runs under inference mode.
        with torch.inference_mode(False):
            self.cpu: torch.Tensor = torch.zeros(*size, dtype=dtype, device="cpu", pin_memory=pin)
            self.gpu: torch.Tensor = torch.zeros_like(self.cpu, device=device)
        self.np: np.ndarray
        # Like vLLM, `.np` only exists with with_numpy=True (AttributeError
        # otherwise), which keeps the type simple.
        if with_numpy:
            self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy `.cpu` (its first `n` rows when given) into `.gpu`,
        non-blocking; returns the written part of `.gpu`.

        From an unpinned `.cpu` to a CUDA device the rows are staged through
        pinned memory first, so the copy stays asynchronous for the host.
        """
        cpu, gpu = self.cpu, self.gpu
        if n is not None:
            cpu, gpu = cpu[:n], gpu[:n]
        if gpu.is_cuda and PIN_MEMORY and not cpu.is_pinned():
            cpu = cpu.pin_memory()
        return gpu.copy_(cpu, non_blocking=True)

    def copy_to_cpu(self, n: int | None = None) -> torch.Tensor:
        """Copy `.gpu` (its first `n` rows when given) into `.cpu`,
        non-blocking; returns the written part of `.cpu`.

        NOTE: Because this method is non-blocking, explicit synchronization
        (e.g. `torch.cuda.synchronize()`) is needed before reading `.cpu` or
        `.np` after a copy from a CUDA device.
        """
        if n is None:
            return self.cpu.copy_(self.gpu, non_blocking=True)
        return self.cpu[:n].copy_(self.gpu[:n], non_blocking=True)


def copy_slice(from_tensor: torch.Tensor, to_tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Copy the first `length` elements (rows) of `from_tensor` into
    `to_tensor`, non-blocking; returns the written slice of `to_tensor`.

    Used to copy pinned CPU tensor data to pre-allocated GPU tensors.
    """
    return to_tensor[:length].copy_(from_tensor[:length], non_blocking=True)


def tensor_data(tensor: torch.Tensor) -> memoryview:
    """The bytes of `tensor` (row-major, as if contiguous) as a flat uint8
    memoryview, useful for serializing and hashing.

    When `tensor` is already contiguous on the CPU the view aliases its own
    memory (same address, no copy). Otherwise (non-contiguous, on a device,
    conjugate/negative views) the bytes are materialized once, into a new
    buffer the view owns.
    """
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type == "cpu" and t.is_contiguous():
        # reshape(-1) of a contiguous tensor is a view (0-d included);
        # view(uint8) reinterprets without copying, which also covers dtypes
        # numpy lacks (bfloat16, float8).
        flat = t.reshape(-1)
        if flat.numel() <= 1 and flat.stride(0) != 1:
            # A contiguous 0/1-element tensor may keep any stride (e.g. the
            # `.imag` of one complex number); view(uint8) needs stride 1.
            flat = flat.as_strided((flat.numel(),), (1,))
        return flat.view(torch.uint8).numpy().data
    # One copy, straight into the returned buffer. numpy allocates it
    # (transparent huge pages for large arrays on Linux, which makes first
    # touch several times cheaper than torch's allocator); copy_ gathers the
    # strided source, and from a device makes it contiguous there first.
    out = np.empty(t.numel() * t.element_size(), dtype=np.uint8)
    torch.from_numpy(out).view(t.dtype).view(t.shape).copy_(t)
    return out.data


# --------------------------------------------------------------------------
# KV cache binding
# --------------------------------------------------------------------------


def extract_layer_index(layer_name: str, num_attn_module: int = 1) -> int:
    """The layer index in a module name: its one dot-separated integer part.

    Examples: "model.layers.0.self_attn" -> 0, "2.attn" -> 2.
    A name with no integer or several integers raises ValueError naming the
    layer. With `num_attn_module > 1` and "attn" in the name, two integers
    `i.j` mean index `i * num_attn_module + j` (as in vLLM).
    """
    int_vals = [int(part) for part in layer_name.split(".") if part.isascii() and part.isdigit()]
    if num_attn_module > 1 and "attn" in layer_name and len(int_vals) == 2:
        return int_vals[0] * num_attn_module + int_vals[1]
    if len(int_vals) != 1:
        found = "no integer" if not int_vals else f"{len(int_vals)} integers"
        raise ValueError(
            f"layer name {layer_name!r} should contain exactly one integer (the layer index), found {found}"
        )
    return int_vals[0]


#: Device types whose runners take several layers with one layer index (as
#: vLLM's CPU, CUDA/ROCm and XPU platforms do): nothing there reads
#: `runner_kv_caches` by layer index.
_MULTI_LAYER_INDEX_DEVICES = frozenset({"cpu", "cuda", "xpu"})


def _check_kv_cache_groups(kv_cache_groups: Sequence[Any]) -> None:
    for i, group in enumerate(kv_cache_groups):
        names = getattr(group, "layer_names", None)
        if isinstance(names, str) or not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"kv_cache_groups[{i}] must have `layer_names`, a list of layer names; got {group!r}")


def bind_kv_cache(
    kv_caches: Mapping[str, torch.Tensor],
    forward_context: Mapping[str, Any],
    runner_kv_caches: MutableSequence[torch.Tensor],
    num_attn_module: int = 1,
    kv_cache_groups: Sequence[Any] | None = None,
    layer_kv_caches: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Bind allocated KV caches to the model runner and the forward context
    (vLLM 0.33's signature and behaviour).

    Fills the empty `runner_kv_caches` with the tensors of `kv_caches` in
    layer-index order (`extract_layer_index(name, num_attn_module)`); layers
    that share one index (a draft model's `draft_model.layers.0.attn` beside
    `model.layers.0.attn`, cross and self attention of an encoder-decoder
    layer) follow each other in the order of `kv_caches`. Then binds each
    layer of `forward_context` to its tensor in `layer_kv_caches` (views such
    as kernel-block views; default, or when empty: `kv_caches`) through the
    layer's own `bind_kv_cache(tensor)` method; a layer object without that
    method gets the older form, `layer.kv_cache = [tensor]`.
    `kv_cache_groups` (objects with `layer_names`) is vLLM's grouping, which
    vLLM reads only to share Mamba ReplaySSM ring cursors within a group;
    this project has no such layers, so it is only checked for its shape.

    Everything is checked before anything is changed: a non-empty
    `runner_kv_caches` or `num_attn_module < 1` raises ValueError; a layer
    name without its layer index raises ValueError naming it; layers sharing
    an index on a device other than CPU, CUDA or XPU raise
    NotImplementedError naming them; `layer_kv_caches` naming other layers
    than `kv_caches` raises ValueError; a layer missing from
    `forward_context` raises KeyError naming it; a malformed group raises
    TypeError.
    """
    if len(runner_kv_caches) != 0:
        raise ValueError(f"runner_kv_caches must be empty before bind_kv_cache, it has {len(runner_kv_caches)} entries")
    if num_attn_module < 1:
        raise ValueError(f"num_attn_module must be at least 1, got {num_attn_module}")
    if kv_cache_groups is not None:
        _check_kv_cache_groups(kv_cache_groups)
    index_to_names: dict[int, list[str]] = {}
    for layer_name in kv_caches:
        index_to_names.setdefault(extract_layer_index(layer_name, num_attn_module), []).append(layer_name)
    for index, names in index_to_names.items():
        devices = {kv_caches[name].device.type for name in names}
        if len(names) > 1 and not devices <= _MULTI_LAYER_INDEX_DEVICES:
            raise NotImplementedError(
                f"layers {', '.join(map(repr, names))} share layer index {index}: several layers with one "
                f"layer index are supported on CPU, CUDA and XPU devices, not on {', '.join(sorted(devices))}"
            )
    bound = layer_kv_caches or kv_caches
    if bound.keys() != kv_caches.keys():
        missing, extra = sorted(kv_caches.keys() - bound.keys()), sorted(bound.keys() - kv_caches.keys())
        raise ValueError(
            f"layer_kv_caches must name the layers of kv_caches: missing {missing or 'none'}, extra {extra or 'none'}"
        )
    for layer_name in bound:
        if layer_name not in forward_context:
            raise KeyError(f"layer {layer_name!r} is not in the forward context")

    for index in sorted(index_to_names):
        runner_kv_caches.extend(kv_caches[name] for name in index_to_names[index])
    for layer_name, kv_cache in bound.items():
        layer = forward_context[layer_name]
        bind = getattr(layer, "bind_kv_cache", None)
        if callable(bind):
            bind(kv_cache)
        else:
            # Layers written for the older vLLM API read `kv_cache[0]` (one
            # entry per virtual engine in v0 pipeline parallelism).
            layer.kv_cache = [kv_cache]


# --------------------------------------------------------------------------
# Profiling scopes
# --------------------------------------------------------------------------


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def record_function_or_nullcontext(name: str) -> contextlib.AbstractContextManager:
    """A profiler scope named `name` when profiling scopes are switched on,
    else a no-op context manager.

    `VLLM_CUSTOM_SCOPES_FOR_PROFILING=1` gives `torch.profiler.record_function`
    (visible in torch profiler traces); `VLLM_NVTX_SCOPES_FOR_PROFILING=1`
    gives an NVTX range when CUDA is available. Read on every call.
    """
    if _env_flag("VLLM_CUSTOM_SCOPES_FOR_PROFILING"):
        return torch.profiler.record_function(name)
    if _env_flag("VLLM_NVTX_SCOPES_FOR_PROFILING") and torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
