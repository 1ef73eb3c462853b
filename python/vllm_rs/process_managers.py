"""Process managers of `vllm_rs.utils`: engine cores, API server processes
(vLLM's manager, each child by default the Rust frontend) and the Rust frontend, with vLLM's shutdown and failure-watching semantics.

All children are started by the Rust core (see `vllm_rs.process`), so they
die with this process and take their descendants along, their sentinels are
pid fds, and waiting never needs a thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from vllm_rs import envs
from vllm_rs.cli_args import jsonify_non_default_args, redact_sensitive_args
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener
from vllm_rs.process import PreparedTarget, Process, kill_process_tree, spawn_executable, start_targets, wait
from vllm_rs.process_setup import run_api_server_worker_proc
from vllm_rs.signal_wakeup import drain, signal_wakeup

logger = init_logger("vllm_rs.utils")

#: Least time `RustFrontendProcessManager.shutdown` gives before the kill.
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


def _shutdown_subprocesses(procs: list[Any], timeout: float | None = None) -> None:
    """`shutdown` for executables: never less than 5 s before the kill."""
    timeout = max(timeout or 0.0, SUBPROCESS_MIN_SHUTDOWN_S)
    logger.debug("[shutdown] Subprocess manager: start process_count=%d timeout=%ss", len(procs), timeout)
    _terminate_join_kill(procs, timeout, "Subprocess manager", announce_sigterm=False)
    logger.debug("[shutdown] Subprocess manager: complete")


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


def _shutdown_and_cleanup_listeners(
    procs: list[Any],
    listeners: list[ZmqListener],
    timeout: float | None = None,
    stop: Callable[[list[Any], float | None], None] = shutdown,
) -> None:
    try:
        stop(procs, timeout)
    finally:
        for listener in listeners:
            listener.cleanup()


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
            _shutdown_and_cleanup_listeners(self.processes, listeners)
            raise
        logger.info("Started %d API server processes", len(self.processes))
        self._finalizer = weakref.finalize(self, _shutdown_and_cleanup_listeners, self.processes, listeners)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the API servers (SIGTERM, `timeout`, kill-tree) and cleans up
        the listeners; idempotent."""
        if self._finalizer.detach() is not None:
            _shutdown_and_cleanup_listeners(self.processes, self._listeners, timeout=timeout)


#: The environment variable that carries the API key to a frontend (vLLM's name).
API_KEY_ENV = "VLLM_API_KEY"
#: The environment variable that carries a Hugging Face token (its hub's name).
HF_TOKEN_ENV = "HF_TOKEN"


def rust_frontend_command(
    binary_path: str | os.PathLike,
    sock: Any,
    input_listener: Any,
    output_listener: Any,
    engine_start_index: int,
    engine_count: int,
    data_parallel_size: int,
    stats_update_address: str | None,
    grpc_sock: Any | None,
) -> tuple[list[str], list[int]]:
    """The `vllm-rs frontend` command line up to `--args-json`, and the fds it
    must inherit (HTTP, input, output, and gRPC when given). The listeners
    are anything with a `.socket` (a `ZmqListener`, or vLLM's own)."""
    listen_fd = sock.fileno()
    input_fd = input_listener.socket.fileno()
    output_fd = output_listener.socket.fileno()
    inherited_fds = [listen_fd, input_fd, output_fd]
    cmd = [
        os.fspath(binary_path),
        "frontend",
        "--listen-fd", str(listen_fd),
        "--input-listener-fd", str(input_fd),
        "--output-listener-fd", str(output_fd),
        "--engine-start-index", str(engine_start_index),
        "--engine-count", str(engine_count),
        "--data-parallel-size", str(data_parallel_size),
    ]  # fmt: skip
    if grpc_sock is not None:
        cmd.extend(["--grpc-listen-fd", str(grpc_sock.fileno())])
        inherited_fds.append(grpc_sock.fileno())
    if stats_update_address is not None:
        cmd.extend(["--coordinator-address", stats_update_address])
    return cmd, inherited_fds


def rust_frontend_args(args: argparse.Namespace) -> dict[str, Any]:
    """What `--args-json` holds: the arguments of `args` that differ from
    their defaults, less secrets and what only concerns the Python side,
    plus `model_tag`, `engine_ready_timeout_secs` and `http_timeout_keep_alive`."""
    args_dict = jsonify_non_default_args(
        args,
        exclude={
            "api_key",
            "hf_token",
            "api_server_count",
            "grpc_port",
            "data_parallel_rank",
            "data_parallel_external_lb",
            "data_parallel_hybrid_lb",
        },
    )
    model_tag = getattr(args, "model_tag", None) or getattr(args, "model", None)
    if model_tag is not None:
        args_dict["model_tag"] = model_tag
    args_dict["engine_ready_timeout_secs"] = envs.engine_ready_timeout_s()
    args_dict["http_timeout_keep_alive"] = envs.http_timeout_keep_alive()
    return args_dict


class RustFrontendProcessManager:
    """Runs the Rust frontend (`binary_path frontend ...`, the bundled
    `vllm-rs` when None) with exactly the HTTP socket and the two listener fds
    inherited; `.processes` is one handle named `RustFrontend`. Secrets reach
    the frontend in its environment (`args.api_key` as `VLLM_API_KEY`,
    `args.hf_token` as `HF_TOKEN`), never on its command line, which every
    local user can read."""

    def __init__(
        self,
        binary_path: str | None,
        sock: Any,
        args: argparse.Namespace,
        input_listener: ZmqListener,
        output_listener: ZmqListener,
        engine_start_index: int,
        engine_count: int,
        data_parallel_size: int,
        stats_update_address: str | None = None,
        grpc_sock: Any | None = None,
    ):
        self._listeners = [input_listener, output_listener]
        try:
            if binary_path is None:
                from vllm_rs.frontend import frontend_binary

                binary_path = frontend_binary()
            cmd, inherited_fds = rust_frontend_command(
                binary_path,
                sock,
                input_listener,
                output_listener,
                engine_start_index,
                engine_count,
                data_parallel_size,
                stats_update_address,
                grpc_sock,
            )
            args_dict = rust_frontend_args(args)
            env = frontend_environment(getattr(args, "api_key", None), getattr(args, "hf_token", None))
            cmd.extend(["--args-json", json.dumps(args_dict, sort_keys=True)])
            redacted = json.dumps(redact_sensitive_args(args_dict), sort_keys=True)
            logger.info("Launching Rust frontend: %s", " ".join(cmd[:-1] + [redacted]))
            proc = spawn_executable(cmd, name="RustFrontend", env=env, pass_fds=inherited_fds)
        except BaseException:
            for listener in self._listeners:
                listener.cleanup()
            raise
        input_listener.close()
        output_listener.close()
        self.processes: list[Process] = [proc]
        self._finalizer = weakref.finalize(
            self, _shutdown_and_cleanup_listeners, self.processes, self._listeners, None, _shutdown_subprocesses
        )

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the frontend (at least 5 s before the kill) and cleans up the
        listeners; idempotent."""
        if self._finalizer.detach() is not None:
            _shutdown_and_cleanup_listeners(self.processes, self._listeners, timeout, _shutdown_subprocesses)


def frontend_environment(api_key: Any, hf_token: Any) -> dict[str, str] | None:
    """This process's environment plus the secrets given (`VLLM_API_KEY`,
    `HF_TOKEN`), or None (inherit it as is) when there are none."""
    secrets: dict[str, str] = {}
    if api_key:
        if isinstance(api_key, (list, tuple)):  # vLLM's parser gives a list
            if len(api_key) != 1:
                # The environment holds one key; more would need the command line.
                raise ValueError(
                    f"api_key: the Rust frontend takes one key (through {API_KEY_ENV}), got {len(api_key)}"
                )
            api_key = api_key[0]
        if not isinstance(api_key, str) or not api_key:
            raise ValueError(f"api_key: expected a non-empty string, got {type(api_key).__name__}")
        secrets[API_KEY_ENV] = api_key
    if isinstance(hf_token, str) and hf_token:  # vLLM's `--hf-token` without a value means "use the login's"
        secrets[HF_TOKEN_ENV] = hf_token
    return {**os.environ, **secrets} if secrets else None


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
