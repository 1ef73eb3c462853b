"""Puts this project's process core under vLLM's own process layer.

`apply()` (also run by vLLM's plugin loader through the `vllm.general_plugins`
entry point `vllm_rs`) makes an installed vLLM of a checked version start and
stop its processes through the Rust core, keeping vLLM's classes, signatures
and behaviour otherwise:

- `CoreEngineProcManager`, the DP coordinator and `APIServerProcessManager`
  still build their processes with vLLM's code, but the multiprocessing
  context they get makes `Process` objects that start through the Rust core
  (a fresh interpreter with spawn semantics): the children die with their
  parent, SIGKILL included, and take their own descendants along.
- `RustFrontendProcessManager` is vLLM's command line and `--args-json`, run
  through the Rust core instead of `subprocess.Popen`, except that a single
  API key goes to the frontend in its environment (`VLLM_API_KEY`), not on
  its command line, which every local user can read (`ps`, `/proc`);
  several keys stay in `--args-json` as in vLLM, with a warning. It is the
  project's own launch of the frontend (`vllm_rs.process.rust_frontend`)
  with vLLM's `--args-json` and shutdown, so both follow one rule.
- `kill_process_tree` and `shutdown` are this project's: no survivor, even
  among descendants that fork meanwhile or detach with `setsid`.
- `ipc://` socket files of the handshake and of the frontends' listeners are
  removed by the process core's guardian when the supervisor ends, however
  it ends.

`VLLM_RS_PATCH=0` turns the plugin off. On a vLLM version that was not
checked, `apply()` logs a warning and patches nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: vLLM releases whose process layer this module was checked against.
CHECKED_VLLM_VERSIONS = ("0.33.0",)
#: Environment switch: "0" leaves vLLM alone.
PATCH_ENV = "VLLM_RS_PATCH"

_applied = False


class RustCoreProcess:
    """A `multiprocessing.Process` lookalike started by the Rust core:
    constructed like one, started by `start()` (the target and its arguments
    are pickled then, as the spawn method does), then the core's handle
    answers `pid`, `sentinel`, `exitcode`, `is_alive()`, `join()`,
    `terminate()`, `kill()`."""

    def __init__(
        self,
        group: None = None,
        target: Callable[..., Any] | None = None,
        name: str | None = None,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        daemon: bool | None = None,
    ):
        if group is not None:
            raise ValueError("group argument must be None for now")
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self.name = name or "RustCoreProcess"
        self.daemon = daemon
        self._proc: Any = None

    def start(self) -> None:
        """Starts the child through the Rust core."""
        from vllm_rs.process.core import start_target

        if self._proc is not None:
            raise AssertionError("cannot start a process twice")
        self._proc = start_target(self._target, name=self.name, args=self._args, kwargs=self._kwargs)

    def _started(self) -> Any:
        if self._proc is None:
            raise ValueError(f"process {self.name} not started")
        return self._proc

    @property
    def pid(self) -> int | None:
        """The child's pid (None before `start`)."""
        return None if self._proc is None else self._proc.pid

    ident = pid

    @property
    def sentinel(self) -> int:
        """An fd readable once the child has exited (its pid fd)."""
        return self._started().sentinel

    @property
    def exitcode(self) -> int | None:
        """None while running (or not started), else the exit code (negative: signal)."""
        return None if self._proc is None else self._proc.exitcode

    def is_alive(self) -> bool:
        """True between `start` and the exit."""
        return self._proc is not None and self._proc.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the exit, at most `timeout` seconds."""
        self._started().join(timeout)

    def terminate(self) -> None:
        """SIGTERM (through the pid fd)."""
        self._started().terminate()

    def kill(self) -> None:
        """SIGKILL (through the pid fd)."""
        self._started().kill()

    def close(self) -> None:
        """Nothing to release early: the handle closes its pid fd when collected."""

    def __repr__(self) -> str:
        state = "initial" if self._proc is None else ("started" if self.is_alive() else f"stopped[{self.exitcode}]")
        return f"<RustCoreProcess name={self.name!r} pid={self.pid} {state}>"


class RustCoreContext:
    """A multiprocessing context whose `Process` is `RustCoreProcess`;
    everything else (queues, shared arrays, locks) is the wrapped context's."""

    def __init__(self, base: Any):
        self._base = base

    def Process(self, *args: Any, **kwargs: Any) -> RustCoreProcess:  # noqa: N802 (multiprocessing's name)
        """A process started through the Rust core."""
        return RustCoreProcess(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _MultiprocessingWithRustCore:
    """Stands in for the `multiprocessing` module inside one vLLM module, so
    that its `get_context(...)` contexts start processes through the Rust core."""

    def __init__(self, module: Any):
        self._module = module

    def get_context(self, method: str | None = None) -> RustCoreContext:
        """The wrapped context of `method`."""
        return RustCoreContext(self._module.get_context(method))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _remove_ipc_file_on_exit(address: str | None) -> None:
    """Has the guardian unlink an `ipc://` socket file when we are gone."""
    from vllm_rs.process.core import remove_on_exit

    if not address or not address.startswith("ipc://") or address.startswith("ipc://@"):
        return
    path = address[len("ipc://") :]
    try:
        remove_on_exit(path)
    except FileNotFoundError:
        pass  # not bound (yet) by this process: nothing of ours to leave behind


def _rebind(original: Any, replacement: Any) -> None:
    """Points every global of vLLM's loaded modules that names `original` at
    `replacement` (vLLM modules import these names directly, so patching
    the defining module alone would miss them; modules imported later get
    the replacement from there)."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "vllm" or module_name.startswith("vllm.")):
            continue
        for name, value in list(vars(module).items()):
            if value is original:
                setattr(module, name, replacement)


def _make_rust_frontend_manager(vllm_utils: Any, envs: Any) -> type:
    """vLLM's `RustFrontendProcessManager` on this project's launch of the
    frontend (`vllm_rs.process.rust_frontend`): vLLM's `--args-json` and
    shutdown, the secrets rule and the Rust core's start."""
    from vllm.entrypoints.common.startup import jsonify_non_default_args, redact_sensitive_args

    from vllm_rs.process import rust_frontend

    class RustFrontendProcessManager(rust_frontend.RustFrontendProcessManager):
        """Runs vLLM's Rust frontend command (same arguments and
        `--args-json` as vLLM builds them, less a single `api_key`, which
        goes in the environment as `VLLM_API_KEY`: `frontend_secrets`)
        through the Rust core; the handle in `.processes` is named
        `RustFrontend`. The listeners' `ipc://` files are removed by the
        guardian once this process is gone."""

        _stop = staticmethod(vllm_utils._shutdown_subprocesses_and_cleanup_listeners)

        def __init__(
            self,
            binary_path: str,
            sock: Any,
            args: argparse.Namespace,
            input_listener: Any,
            output_listener: Any,
            engine_start_index: int,
            engine_count: int,
            data_parallel_size: int,
            stats_update_address: str | None = None,
            grpc_sock: Any | None = None,
        ):
            # vLLM's listeners do not hand their files to the guardian; ours do.
            for listener in (input_listener, output_listener):
                _remove_ipc_file_on_exit(listener.address)
            super().__init__(
                binary_path,
                sock,
                args,
                input_listener,
                output_listener,
                engine_start_index,
                engine_count,
                data_parallel_size,
                stats_update_address,
                grpc_sock,
            )

        def _frontend_args(self, args: argparse.Namespace) -> dict[str, Any]:
            """vLLM's `--args-json` (`api_key` included: `frontend_secrets` takes it out)."""
            return rust_frontend.args_json(
                jsonify_non_default_args(args, exclude=set(rust_frontend.SERVE_ONLY_ARGS)),
                args,
                envs.VLLM_ENGINE_READY_TIMEOUT_S,
                envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
            )

        def _hf_token(self, args: argparse.Namespace) -> None:
            """None: vLLM keeps `hf_token` in `--args-json`."""
            return None

        def _log_launch(self, cmd: list[str], args_dict: dict[str, Any]) -> None:
            """vLLM's log line, through vLLM's logger and redaction."""
            redacted = json.dumps(redact_sensitive_args(args_dict), sort_keys=True)
            vllm_utils.logger.info("Launching Rust frontend: %s", " ".join(cmd[:-1] + [redacted]))

    return RustFrontendProcessManager


def _wrap_init(cls: type, after: Callable[..., None]) -> None:
    """Runs `after(self, *args, **kwargs)` once `cls.__init__` has returned."""
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        after(self, *args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]


def _engine_manager_sockets(self: Any, *args: Any, **kwargs: Any) -> None:
    # handshake_address is the 6th parameter of vLLM 0.33's CoreEngineProcManager.
    address = kwargs.get("handshake_address", args[5] if len(args) > 5 else None)
    _remove_ipc_file_on_exit(address)


def _api_server_manager_sockets(self: Any, *args: Any, **kwargs: Any) -> None:
    for listener in getattr(self, "_listeners", ()):
        _remove_ipc_file_on_exit(getattr(listener, "address", None))


def apply() -> bool:
    """Patches an installed vLLM (see the module docstring); True when vLLM
    now runs on the Rust core. Idempotent. Returns False, patching nothing,
    when vLLM is not installed, `VLLM_RS_PATCH=0`, or the version was not
    checked (with a warning)."""
    global _applied
    if _applied:
        return True
    if os.environ.get(PATCH_ENV, "1").strip() == "0":
        logger.info("%s=0: vLLM's process layer left as it is", PATCH_ENV)
        return False
    try:
        import vllm
    except ImportError:
        return False
    version = getattr(vllm, "__version__", "unknown")
    if version not in CHECKED_VLLM_VERSIONS:
        logger.warning(
            "vllm_rs: vLLM %s was not checked with this patch (checked: %s); vLLM's process layer is left as it is",
            version, ", ".join(CHECKED_VLLM_VERSIONS),
        )  # fmt: skip
        return False

    import vllm.envs as vllm_envs
    import vllm.utils.system_utils as system_utils
    import vllm.v1.engine.coordinator as coordinator
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.utils as v1_utils

    from vllm_rs.process.core import kill_process_tree
    from vllm_rs.process.shutdown import shutdown

    original_get_mp_context = system_utils.get_mp_context

    def get_mp_context() -> RustCoreContext:
        """vLLM's context (its start-method choice and environment fixes),
        with processes started through the Rust core."""
        return RustCoreContext(original_get_mp_context())

    for module in (engine_utils, coordinator):
        module.get_mp_context = get_mp_context
    v1_utils.multiprocessing = _MultiprocessingWithRustCore(v1_utils.multiprocessing)

    _rebind(system_utils.kill_process_tree, kill_process_tree)
    _rebind(v1_utils.shutdown, shutdown)
    _rebind(v1_utils.RustFrontendProcessManager, _make_rust_frontend_manager(v1_utils, vllm_envs))
    _wrap_init(engine_utils.CoreEngineProcManager, _engine_manager_sockets)
    _wrap_init(v1_utils.APIServerProcessManager, _api_server_manager_sockets)
    _applied = True
    logger.info("vllm_rs: vLLM %s starts and stops its processes through the vllm-rs process core", version)
    return True


def register() -> None:
    """The `vllm.general_plugins` entry point: `apply()`."""
    apply()
