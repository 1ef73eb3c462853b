"""Drop-in for vLLM's `vllm.v1.utils`: code written against vLLM's module
works after changing only the import (docs/utils-api.md says what each name promises).

Process names load eagerly (they are light); the torch-facing names and usage
reporting load on first access, so that importing this module does not
import torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener, get_open_zmq_ipc_path, get_tcp_uri
from vllm_rs.process.core import kill_process_tree
from vllm_rs.process.managers import APIServerProcessManager, CoreEngineProcManager, wait_for_completion_or_failure
from vllm_rs.process.rust_frontend import RustFrontendProcessManager, run_api_server_worker_proc
from vllm_rs.process.shutdown import shutdown

logger = init_logger(__name__)

T = TypeVar("T")

_LAZY = {
    "PIN_MEMORY": "vllm_rs.tensor_utils",
    "CpuGpuBuffer": "vllm_rs.tensor_utils",
    "copy_slice": "vllm_rs.tensor_utils",
    "tensor_data": "vllm_rs.tensor_utils",
    "bind_kv_cache": "vllm_rs.tensor_utils",
    "extract_layer_index": "vllm_rs.tensor_utils",
    "IterationDetails": "vllm_rs.iteration_details",
    "compute_iteration_details": "vllm_rs.iteration_details",
    "record_function_or_nullcontext": "vllm_rs.tensor_utils",
    "report_usage_stats": "vllm_rs.usage",
    "UsageContext": "vllm_rs.usage",
    "is_usage_stats_enabled": "vllm_rs.usage",
}

__all__ = [
    "ConstantList",
    "ZmqListener",
    "kill_process_tree",
    "shutdown",
    "wait_for_completion_or_failure",
    "CoreEngineProcManager",
    "APIServerProcessManager",
    "RustFrontendProcessManager",
    "get_engine_client_zmq_addr",
    "run_api_server_worker_proc",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class ConstantList(Generic[T], Sequence):
    """A read-only view of a list (not a copy): reads pass through, every
    mutator raises TypeError."""

    def __init__(self, x: list[T]) -> None:
        self._x = x

    def append(self, item: T) -> None:
        raise TypeError("Cannot append to a constant list")

    def extend(self, item: Any) -> None:
        raise TypeError("Cannot extend a constant list")

    def insert(self, *args: Any) -> None:
        raise TypeError("Cannot insert into a constant list")

    def pop(self, *args: Any) -> T:
        raise TypeError("Cannot pop from a constant list")

    def remove(self, item: T) -> None:
        raise TypeError("Cannot remove from a constant list")

    def clear(self) -> None:
        raise TypeError("Cannot clear a constant list")

    def index(self, item: T, start: int = 0, stop: int | None = None) -> int:
        return self._x.index(item, start, stop if stop is not None else len(self._x))

    @overload
    def __getitem__(self, item: int) -> T: ...

    @overload
    def __getitem__(self, s: slice, /) -> list[T]: ...

    def __getitem__(self, item: int | slice) -> T | list[T]:
        return self._x[item]

    def __setitem__(self, item: int | slice, value: Any) -> None:
        raise TypeError("Cannot set item in a constant list")

    def __delitem__(self, item: int | slice) -> None:
        raise TypeError("Cannot delete item from a constant list")

    def __iter__(self) -> Iterator[T]:
        return iter(self._x)

    def __contains__(self, item: object) -> bool:
        return item in self._x

    def __len__(self) -> int:
        return len(self._x)

    def copy(self) -> list[T]:
        """A mutable copy of the underlying list."""
        return self._x.copy()

    def __repr__(self) -> str:
        return f"ConstantList({self._x})"


def get_engine_client_zmq_addr(local_only: bool, host: str, port: int = 0) -> str:
    """An IPC path (`local_only=True`) or `tcp://host:port` (port 0 stays 0:
    the kernel assigns it at bind time)."""
    if local_only:
        return get_open_zmq_ipc_path()
    return get_tcp_uri(host, port)
