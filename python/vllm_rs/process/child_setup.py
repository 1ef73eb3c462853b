"""What a child process of the stack does first: its process title and its
log-line prefix, as vLLM's processes show them. Imports nothing but the
logger, so an engine or the coordinator can call it without loading the
serving stack.
"""

from __future__ import annotations

import logging
import os

from vllm_rs.logger import init_logger


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
    init_logger("vllm_rs")  # the handler to decorate exists from here on
    prefix = f"({process_name} pid={os.getpid()}) "
    for handler in logging.getLogger("vllm_rs").handlers + logging.getLogger().handlers:
        fmt = handler.formatter._fmt if handler.formatter else "%(message)s"  # type: ignore[union-attr]
        datefmt = handler.formatter.datefmt if handler.formatter else None
        handler.setFormatter(logging.Formatter(prefix + fmt, datefmt))
