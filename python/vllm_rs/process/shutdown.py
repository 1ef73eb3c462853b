"""Stopping processes as vLLM's process layer does: SIGTERM, one shared
deadline, then a kill of each survivor's whole tree (`core.kill_process_tree`),
for every manager of the process layer and vLLM's patched ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener
from vllm_rs.process.core import kill_process_tree

logger = init_logger("vllm_rs.utils")

#: Least time `shutdown_subprocesses` gives before the kill.
SUBPROCESS_MIN_SHUTDOWN_S = 5.0


def shutdown(procs: list[Any], timeout: float | None = None) -> None:
    """SIGTERMs every live process, joins them all against one shared deadline
    (`timeout`, default 5 s), then kill-trees the survivors. Total time is
    bounded by the timeout plus the kill, however many processes there are."""
    if timeout is None:
        timeout = 5.0
    logger.debug(
        "[shutdown] Process manager: start process_count=%d timeout=%ss names=%s",
        len(procs),
        timeout,
        ",".join(proc.name for proc in procs),
    )
    _terminate_join_kill(procs, timeout, "Process manager", announce_sigterm=True)
    logger.debug("[shutdown] Process manager: complete")


def _terminate_join_kill(procs: list[Any], timeout: float, who: str, announce_sigterm: bool) -> None:
    for proc in procs:
        if proc.is_alive():
            if announce_sigterm:
                logger.info("[shutdown] %s: send sigterm to process %s", who, proc.name)
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if proc.is_alive():
            proc.join(remaining)
    survivors = [proc for proc in procs if proc.is_alive() and proc.pid is not None]
    if survivors:
        logger.warning("[shutdown] %s: force killing remaining processes count=%d", who, len(survivors))
    for proc in survivors:
        logger.warning("[shutdown] %s: force killing remaining process %s pid %d", who, proc.name, proc.pid)
        kill_process_tree(proc.pid)


def shutdown_subprocesses(procs: list[Any], timeout: float | None = None) -> None:
    """`shutdown` for executables: never less than 5 s before the kill."""
    timeout = max(timeout or 0.0, SUBPROCESS_MIN_SHUTDOWN_S)
    logger.debug("[shutdown] Subprocess manager: start process_count=%d timeout=%ss", len(procs), timeout)
    _terminate_join_kill(procs, timeout, "Subprocess manager", announce_sigterm=False)
    logger.debug("[shutdown] Subprocess manager: complete")


def shutdown_and_cleanup_listeners(
    procs: list[Any],
    listeners: list[ZmqListener],
    timeout: float | None = None,
    stop: Callable[[list[Any], float | None], None] = shutdown,
) -> None:
    """`stop(procs, timeout)` (default `shutdown`), then the listeners'
    `cleanup()`, which runs even when stopping raised."""
    try:
        stop(procs, timeout)
    finally:
        for listener in listeners:
            listener.cleanup()
