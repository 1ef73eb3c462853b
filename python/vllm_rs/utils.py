"""Drop-in for vLLM's `vllm.v1.utils`: code written against vLLM's module
works after changing only the import (docs/utils-api.md says what each name promises).

Process names load eagerly (they are light); the torch-facing names and usage
reporting load on first access, so that importing this module does not
import torch.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener, get_open_zmq_ipc_path, get_tcp_uri
from vllm_rs.process import kill_process_tree
from vllm_rs.process_managers import (
    APIServerProcessManager,
    CoreEngineProcManager,
    RustFrontendProcessManager,
    shutdown,
    wait_for_completion_or_failure,
)

logger = init_logger(__name__)

T = TypeVar("T")

_LAZY = {
    "PIN_MEMORY": "vllm_rs.tensor_utils",
    "CpuGpuBuffer": "vllm_rs.tensor_utils",
    "copy_slice": "vllm_rs.tensor_utils",
    "tensor_data": "vllm_rs.tensor_utils",
    "bind_kv_cache": "vllm_rs.tensor_utils",
    "extract_layer_index": "vllm_rs.tensor_utils",
    "IterationDetails": "vllm_rs.tensor_utils",
    "compute_iteration_details": "vllm_rs.tensor_utils",
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


def run_api_server_worker_proc(
    listen_address: str, sock: Any, args: Any, client_config: dict | None = None, **uvicorn_kwargs: Any
) -> None:
    """Entry point of one Python API server process: sets the process title
    (`VLLM::APIServer_{index}`), prefixes log lines with
    `(APIServer_{index} pid=PID)` and serves the OpenAI API on `sock`."""
    client_config = client_config or {}
    index = client_config.get("client_index", 0)
    set_process_title("APIServer", str(index))
    decorate_logs(f"APIServer_{index}")
    from vllm_rs.api_server import run_server_worker

    run_server_worker(listen_address, sock, args, client_config, **uvicorn_kwargs)


def set_process_title(name: str, suffix: str) -> None:
    """Sets the title `{VLLM_PROCESS_NAME_PREFIX or 'VLLM'}::{name}_{suffix}`
    (via /proc/self/comm, which holds 15 bytes; best effort)."""
    prefix = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")
    title = f"{prefix}::{name}_{suffix}"
    try:
        import setproctitle  # type: ignore[import-not-found]

        setproctitle.setproctitle(title)
        return
    except ImportError:
        pass
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(title[:15])
    except OSError:
        pass


def decorate_logs(process_name: str) -> None:
    """Prefixes every log line of this process with `(process_name pid=PID)`."""
    import logging

    prefix = f"({process_name} pid={os.getpid()}) "
    for handler in logging.getLogger("vllm_rs").handlers + logging.getLogger().handlers:
        fmt = handler.formatter._fmt if handler.formatter else "%(message)s"  # type: ignore[union-attr]
        datefmt = handler.formatter.datefmt if handler.formatter else None
        handler.setFormatter(logging.Formatter(prefix + fmt, datefmt))
