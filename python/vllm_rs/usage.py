"""Usage statistics, as vLLM's `report_usage_stats` (the contract's "Tensor
utilities" section).

Off when any opt-out is set: `VLLM_NO_USAGE_STATS`, `VLLM_DO_NOT_TRACK`,
`DO_NOT_TRACK` (each "1"; "true"/"yes"/"on" count too) or a `do_not_track`
file in the config root. Otherwise `report_usage_stats` reads the config in
the caller (every key it cannot read is null) and hands the rest to a daemon
thread: platform facts, one JSON line appended to
`$VLLM_CONFIG_ROOT/usage_stats.json`, and a POST of the same record to
`$VLLM_USAGE_STATS_SERVER` only when that is set. Nothing here imports torch.
"""

from __future__ import annotations

import enum
import importlib.metadata
import json
import logging
import math
import os
import platform
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "USAGE_STATS_KEYS",
    "UsageContext",
    "get_config_root",
    "is_usage_stats_enabled",
    "report_usage_stats",
]

_TRUE = ("1", "true", "yes", "on")
_POST_TIMEOUT_S = 10.0
# One id per process, like vLLM's UsageMessage.uuid.
_SESSION_ID = uuid.uuid4().hex


class UsageContext(str, enum.Enum):
    """Where vLLM was started from; reported as the record's `context`."""

    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    API_SERVER = "API_SERVER"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
    OPENAI_BATCH_RUNNER = "OPENAI_BATCH_RUNNER"
    ENGINE_CONTEXT = "ENGINE_CONTEXT"


def get_config_root() -> Path:
    """`$VLLM_CONFIG_ROOT`, else `$XDG_CONFIG_HOME/vllm`, else
    `~/.config/vllm` (user-expanded, read on every call)."""
    root = os.environ.get("VLLM_CONFIG_ROOT")
    if not root:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
        root = os.path.join(base, "vllm")
    return Path(os.path.expanduser(root))


def _opted_out(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def is_usage_stats_enabled() -> bool:
    """False when usage stats are switched off: `VLLM_NO_USAGE_STATS`,
    `VLLM_DO_NOT_TRACK` or `DO_NOT_TRACK` set to 1, or a `do_not_track` file
    in the config root. Read on every call."""
    if any(map(_opted_out, ("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK"))):
        return False
    return not (get_config_root() / "do_not_track").exists()


# --------------------------------------------------------------------------
# Config keys (the newer seed's extra_kvs)
# --------------------------------------------------------------------------


def _name(value: Any) -> Any:
    """An enum's name; None stays None; other values as they are."""
    return None if value is None else getattr(value, "name", value)


def _unless_none(obj: Any, attr: str) -> Any:
    return None if obj is None else getattr(obj, attr)


def _architecture(c: Any) -> Any:
    mc = c.model_config
    using_tf = getattr(mc, "using_transformers_backend", None)
    if callable(using_tf) and using_tf():
        # e.g. TransformersForCausalLM(Starcoder2ForCausalLM)
        return f"{mc._model_info.architecture}({mc.architectures[0]})"
    arch = getattr(mc, "architecture", None)
    return arch if arch is not None else mc.architectures[0]


# key -> how to read it from a vllm_config; any exception means null.
_CONFIG_KEYS: dict[str, Callable[[Any], Any]] = {
    # Common configuration
    "dtype": lambda c: str(c.model_config.dtype),
    "block_size": lambda c: c.cache_config.block_size,
    "gpu_memory_utilization": lambda c: c.cache_config.gpu_memory_utilization,
    "kv_cache_memory_bytes": lambda c: c.cache_config.kv_cache_memory_bytes,
    # Quantization
    "quantization": lambda c: c.model_config.quantization,
    "kv_cache_dtype": lambda c: str(c.cache_config.cache_dtype),
    # Feature flags
    "enable_lora": lambda c: bool(c.lora_config),
    "enable_prefix_caching": lambda c: c.cache_config.enable_prefix_caching,
    "enforce_eager": lambda c: c.model_config.enforce_eager,
    "disable_custom_all_reduce": lambda c: c.parallel_config.disable_custom_all_reduce,
    # Distributed parallelism
    "tensor_parallel_size": lambda c: c.parallel_config.tensor_parallel_size,
    "data_parallel_size": lambda c: c.parallel_config.data_parallel_size,
    "pipeline_parallel_size": lambda c: c.parallel_config.pipeline_parallel_size,
    "enable_expert_parallel": lambda c: c.parallel_config.enable_expert_parallel,
    "all2all_backend": lambda c: c.parallel_config.all2all_backend,
    "kv_connector": lambda c: _unless_none(c.kv_transfer_config, "kv_connector"),
    # Batching limits
    "max_model_len": lambda c: c.model_config.max_model_len,
    "max_num_seqs": lambda c: c.scheduler_config.max_num_seqs,
    "max_num_batched_tokens": lambda c: c.scheduler_config.max_num_batched_tokens,
    # Attention backend (None = auto-selected at runtime) and compile mode
    "attention_backend": lambda c: _name(c.attention_config.backend),
    "compilation_mode": lambda c: _name(c.compilation_config.mode),
    # Speculative decoding (None when disabled)
    "spec_decode_method": lambda c: _unless_none(c.speculative_config, "method"),
    "num_speculative_tokens": lambda c: _unless_none(c.speculative_config, "num_speculative_tokens"),
    # Wide expert parallel
    "enable_eplb": lambda c: c.parallel_config.enable_eplb,
    "num_redundant_experts": lambda c: c.parallel_config.eplb_config.num_redundant_experts,
    "num_experts": lambda c: c.model_config.get_num_experts(),
}

USAGE_STATS_KEYS: tuple[str, ...] = tuple(_CONFIG_KEYS)
"""The config keys every usage record carries (null when not readable)."""


def _jsonable(value: Any) -> Any:
    """JSON scalars as they are (non-finite floats -> None), else str()."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def _read(getter: Callable[[Any], Any], config: Any) -> Any:
    try:
        return _jsonable(getter(config))
    except Exception:  # a config lacking a part yields null, never an error
        return None


def _config_fields(vllm_config: Any) -> dict[str, Any]:
    fields = {"model_architecture": _read(_architecture, vllm_config)}
    for key, getter in _CONFIG_KEYS.items():
        fields[key] = _read(getter, vllm_config)
    return fields


# --------------------------------------------------------------------------
# Platform facts (in the background thread)
# --------------------------------------------------------------------------


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_facts() -> dict[str, Any]:
    """GPU count, name and memory, without ever initializing CUDA here (a
    thread that initializes CUDA would break a later fork): from torch when
    CUDA is already initialized in this process, else from the NVIDIA
    driver's /proc entries."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        count = torch.cuda.device_count()
        if count:
            props = torch.cuda.get_device_properties(0)
            return {
                "gpu_count": count,
                "gpu_type": props.name,
                "gpu_memory_per_device": props.total_memory,
                "cuda_runtime": torch.version.cuda,
            }
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return {
        "gpu_count": len(names),
        "gpu_type": names[0] if names else None,
        "gpu_memory_per_device": None,
        "cuda_runtime": None,
    }


def _platform_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "os": platform.system(),
        "platform": platform.platform(),
        "architecture": platform.machine(),
        "python_version": platform.python_version(),
        "num_cpu": os.cpu_count(),
        "cpu_type": _cpu_model(),
        "total_memory": _total_memory(),
        "torch_version": _package_version("torch"),
        "vllm_rs_version": _package_version("vllm-rs"),
    }
    try:
        facts.update(_gpu_facts())
    except Exception:
        logger.debug("Could not read GPU facts for usage stats", exc_info=True)
        facts.update(gpu_count=None, gpu_type=None, gpu_memory_per_device=None, cuda_runtime=None)
    return facts


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def _append_line(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record) + "\n"
    # One write on an O_APPEND file: concurrent reporters never interleave.
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def _post(server: str, record: dict[str, Any]) -> None:
    request = urllib.request.Request(
        server,
        data=json.dumps(record).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=_POST_TIMEOUT_S) as response:
        response.read()


def _report(record: dict[str, Any], path: Path, server: str | None) -> None:
    """The background thread's body: never raises."""
    try:
        record.update(_platform_facts())
        _append_line(path, record)
    except Exception:
        logger.debug("Could not write usage stats to %s", path, exc_info=True)
    if server:
        try:
            _post(server, record)
        except Exception as e:
            logger.debug("Could not send usage stats to %s: %s", server, e)


def report_usage_stats(
    vllm_config: Any, usage_context: UsageContext | str = UsageContext.ENGINE_CONTEXT
) -> threading.Thread | None:
    """Report usage statistics if enabled (see `is_usage_stats_enabled`).

    Reads the config keys of `USAGE_STATS_KEYS` (plus `model_architecture`)
    from `vllm_config`, null for each one it cannot read, then returns at once:
    a daemon thread adds platform facts, appends the record as one JSON line
    to `<config root>/usage_stats.json` and POSTs it to
    `$VLLM_USAGE_STATS_SERVER` only when that is set. Never raises and never
    waits on the file or the server. Returns that thread (join it to wait for
    the report), or None when disabled or it could not start.
    """
    try:
        if not is_usage_stats_enabled():
            return None
        record: dict[str, Any] = {
            "uuid": _SESSION_ID,
            "log_time": time.time_ns(),
            "source": os.environ.get("VLLM_USAGE_SOURCE", "production"),
            "context": _jsonable(getattr(usage_context, "value", usage_context)),
        }
        record.update(_config_fields(vllm_config))
        server = os.environ.get("VLLM_USAGE_STATS_SERVER") or None
        path = get_config_root() / "usage_stats.json"
        thread = threading.Thread(
            target=_report,
            args=(record, path, server),
            name="vllm-rs-usage-stats",
            daemon=True,
        )
        thread.start()
        return thread
    except Exception:
        logger.debug("Usage stats reporting failed", exc_info=True)
        return None
