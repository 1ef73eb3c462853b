"""Process managers of `vllm_rs.utils`: engine cores and API server processes
(vLLM's manager, each child by default the Rust frontend), and the wait on
them all, with vLLM's shutdown and failure-watching semantics (the Rust
frontend's own manager is in `rust_frontend.py`, stopping in `shutdown.py`).

All children are started by the Rust core (see `vllm_rs.process.core`), so they
die with this process and take their descendants along, their sentinels are
pid fds, and waiting never needs a thread per process.
"""

from __future__ import annotations

import argparse
import os
import threading
import weakref
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener
from vllm_rs.process.core import PreparedTarget, Process, start_targets, wait
from vllm_rs.process.rust_frontend import RustFrontendProcessManager, run_api_server_worker_proc
from vllm_rs.process.shutdown import shutdown, shutdown_and_cleanup_listeners
from vllm_rs.process.signal_wakeup import drain, signal_wakeup

logger = init_logger("vllm_rs.utils")


def _remove_ipc_socket_file(address: str | None) -> None:
    # An abstract `ipc://@NAME` has no file; "@NAME" must not be taken for a path.
    if address and address.startswith("ipc://") and not address.startswith("ipc://@"):
        try:
            os.remove(address[len("ipc://") :])
        except FileNotFoundError:
            pass


def _shutdown_engines(
    procs: list[Any], input_address: str, stopping: threading.Event, timeout: float | None = None
) -> None:
    stopping.set()
    shutdown(procs, timeout)
    _remove_ipc_socket_file(input_address)


class CoreEngineProcManager:
    """Starts `local_engine_count` engine-core processes running
    `target_fn(**kwargs)`, named `EngineCore_{global_index}`, and stops them
    (SIGTERM, deadline, kill-tree) on `close()`/`shutdown()` or garbage
    collection, removing an `ipc://` socket file named by `input_address`."""

    def __init__(
        self,
        target_fn: Callable[..., Any],
        local_engine_count: int,
        start_index: int,
        local_start_index: int,
        vllm_config: Any,
        on_head_node: bool,
        input_address: str,
        executor_class: Any,
        log_stats: bool,
    ):
        common_kwargs = {
            "vllm_config": vllm_config,
            "on_head_node": on_head_node,
            "input_address": input_address,
            "executor_class": executor_class,
            "log_stats": log_stats,
        }
        # Pickle every target first: one that cannot be pickled fails before
        # any process starts.
        prepared = [
            PreparedTarget(
                target_fn,
                name=f"EngineCore_{start_index + index}",
                kwargs=common_kwargs | {"dp_rank": start_index + index, "local_dp_rank": local_start_index + index},
            )
            for index in range(local_engine_count)
        ]
        self.processes: list[Process] = []
        self.failed_proc_name: str | None = None
        self._input_address = input_address
        self.manager_stopped = threading.Event()
        self._finalizer = weakref.finalize(self, _shutdown_engines, self.processes, input_address, self.manager_stopped)
        try:
            self.processes.extend(start_targets(prepared))
        except BaseException:
            self.close()
            raise
        # Kill the others if any has already finished.
        if self.finished_procs():
            self.close()

    def close(self) -> None:
        """Shuts all engines down (idempotent)."""
        self._finalizer()

    def shutdown(self, timeout: float | None = None) -> None:
        """Shuts all engines down with `timeout` before the kill (idempotent)."""
        if self._finalizer.detach() is not None:
            _shutdown_engines(self.processes, self._input_address, self.manager_stopped, timeout)

    def join_first(self) -> None:
        """Waits until any engine exits."""
        wait([proc.sentinel for proc in self.processes])

    def sentinels(self) -> list[int]:
        """The engines' sentinels (pid fds)."""
        return [proc.sentinel for proc in self.processes]

    def finished_procs(self) -> dict[str, int]:
        """Name -> exit code of every engine that has exited."""
        return {proc.name: proc.exitcode for proc in self.processes if proc.exitcode is not None}

    def record_exit(self, proc: Process) -> bool:
        """Notes that `proc` (one of ours) has exited; True, with
        `failed_proc_name` set, when that is a failure (non-zero exit while
        the manager is not stopping)."""
        if self.manager_stopped.is_set() or proc.exitcode in (0, None):
            return False
        self.failed_proc_name = proc.name
        return True

    def monitor_engine_liveness(self) -> None:
        """Blocks until an engine fails (then `failed_proc_name` names it), all
        engines have exited, or the manager stops."""
        pending = {proc.sentinel: proc for proc in self.processes}
        while pending and not self.manager_stopped.is_set():
            for sentinel in wait(list(pending)):
                if self.record_exit(pending.pop(sentinel)):
                    return


class APIServerProcessManager:
    """Starts `num_servers` API server processes named `ApiServer_{i}`
    running `(target_server_fn or run_api_server_worker_proc)(listen_address,
    sock, args, client_config)`; closes the parent's copies of the listeners
    once they start, and stops everything on `shutdown()` or collection."""

    def __init__(
        self,
        listen_address: str,
        sock: Any,
        args: argparse.Namespace,
        num_servers: int,
        input_listeners: list[ZmqListener],
        output_listeners: list[ZmqListener],
        target_server_fn: Callable[..., Any] | None = None,
        stats_update_address: str | None = None,
        tensor_queue: Any | None = None,
    ):
        self.listen_address = listen_address
        self.sock = sock
        self.args = args
        self.processes: list[Process] = []
        listeners = [*input_listeners, *output_listeners]
        self._listeners = listeners
        target_server_fn = target_server_fn or run_api_server_worker_proc
        try:
            if not len(input_listeners) == len(output_listeners) == num_servers:
                raise ValueError(
                    f"APIServerProcessManager: num_servers={num_servers} needs as many input and output "
                    f"listeners, got {len(input_listeners)} and {len(output_listeners)}"
                )
            prepared = []
            for i, (input_listener, output_listener) in enumerate(zip(input_listeners, output_listeners)):
                client_config: dict[str, Any] = {
                    "input_address": input_listener.address,
                    "output_address": output_listener.address,
                    "input_listener": input_listener.socket,
                    "output_listener": output_listener.socket,
                    "client_count": num_servers,
                    "client_index": i,
                }
                if stats_update_address is not None:
                    client_config["stats_update_address"] = stats_update_address
                if tensor_queue is not None:
                    client_config["tensor_queue"] = tensor_queue
                prepared.append(
                    PreparedTarget(
                        target_server_fn, name=f"ApiServer_{i}", args=(listen_address, sock, args, client_config)
                    )
                )
            self.processes.extend(start_targets(prepared))
            for listener in listeners:
                listener.close()
        except BaseException:
            shutdown_and_cleanup_listeners(self.processes, listeners)
            raise
        logger.info("Started %d API server processes", len(self.processes))
        self._finalizer = weakref.finalize(self, shutdown_and_cleanup_listeners, self.processes, listeners)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the API servers (SIGTERM, `timeout`, kill-tree) and cleans up
        the listeners; idempotent."""
        if self._finalizer.detach() is not None:
            shutdown_and_cleanup_listeners(self.processes, self._listeners, timeout=timeout)


def _wait_on_sentinels(
    sentinel_to_proc: dict[Any, Any],
    engine_sentinels: dict[Any, Any],
    engine_manager: Any | None,
    wakeup: Any | None,
) -> None:
    """The loop of `wait_for_completion_or_failure`; `wakeup` (readable after
    any signal) is waited on too, so a signal the kernel gave another thread
    still ends the wait and its handler runs here."""
    extra = [wakeup] if wakeup is not None else []
    while sentinel_to_proc:
        for sentinel in wait([*sentinel_to_proc, *engine_sentinels, *extra]):
            if sentinel is wakeup:
                drain(wakeup)
                continue
            if sentinel in engine_sentinels:
                engine_manager.record_exit(engine_sentinels.pop(sentinel))
            else:
                proc = sentinel_to_proc.pop(sentinel)
                if proc is not None and proc.exitcode != 0:
                    raise RuntimeError(f"Process {proc.name} (PID: {proc.pid}) died with exit code {proc.exitcode}")
            if engine_manager is not None and engine_manager.failed_proc_name is not None:
                raise RuntimeError(f"Engine core process {engine_manager.failed_proc_name} died unexpectedly.")


def wait_for_completion_or_failure(
    api_server_manager: APIServerProcessManager | RustFrontendProcessManager,
    engine_manager: Any | None = None,
    coordinator: Any | None = None,
) -> None:
    """Waits, in one wait on every sentinel, until all API servers exit 0
    (returns), one exits non-zero or an engine fails (raises RuntimeError),
    or a KeyboardInterrupt arrives (logged, returns)."""
    monitor_thread_pipe = None
    try:
        logger.info("Waiting for API servers to complete ...")
        sentinel_to_proc: dict[Any, Any] = {proc.sentinel: proc for proc in api_server_manager.processes}
        if coordinator:
            sentinel_to_proc[coordinator.proc.sentinel] = coordinator.proc
        engine_sentinels: dict[Any, Any] = {}
        if engine_manager is not None:
            if isinstance(engine_manager, CoreEngineProcManager):
                engine_sentinels = {proc.sentinel: proc for proc in engine_manager.processes}
            else:
                # A foreign manager: only its monitor_engine_liveness() knows.
                recv, send = connection.Pipe(duplex=False)
                monitor_thread_pipe = (recv, send)

                def monitor_engines() -> None:
                    try:
                        engine_manager.monitor_engine_liveness()
                    finally:
                        send.close()

                threading.Thread(target=monitor_engines, daemon=True, name="EngineLivenessMonitor").start()
                sentinel_to_proc[recv] = None

        with signal_wakeup() as wakeup:
            _wait_on_sentinels(sentinel_to_proc, engine_sentinels, engine_manager, wakeup)
    except KeyboardInterrupt:
        logger.info("Received KeyboardInterrupt, shutting down API servers...")
    except Exception as e:
        logger.exception("Exception occurred while running API servers: %s", str(e))
        raise
    finally:
        if monitor_thread_pipe is not None:
            monitor_thread_pipe[0].close()
