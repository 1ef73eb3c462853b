"""The one launch of the Rust frontend (`vllm-rs frontend`): its command line,
its `--args-json`, the rule for its secrets, and the two ways it starts:
`RustFrontendProcessManager` (a child; `vllm_rs.vllm_patch` runs vLLM's
manager on it too) and `run_api_server_worker_proc` (this process becomes it).
"""

from __future__ import annotations

import argparse
import json
import os
import weakref
from types import SimpleNamespace
from typing import Any

from vllm_rs import envs
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener
from vllm_rs.process.core import Process, spawn_executable
from vllm_rs.process.shutdown import shutdown_and_cleanup_listeners, shutdown_subprocesses
from vllm_rs.serving.cli_args import jsonify_non_default_args, redact_sensitive_args

logger = init_logger("vllm_rs.utils")

#: The environment variable that carries the API key to a frontend (vLLM's name).
API_KEY_ENV = "VLLM_API_KEY"
#: The environment variable that carries a Hugging Face token (its hub's name).
HF_TOKEN_ENV = "HF_TOKEN"


class ApiServerConfigError(ValueError):
    """`run_api_server_worker_proc` was asked for what the Rust frontend cannot do."""


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


#: Arguments that concern only the Python side, never the frontend.
SERVE_ONLY_ARGS = frozenset(
    {"api_server_count", "data_parallel_rank", "data_parallel_external_lb", "data_parallel_hybrid_lb"}
)


def rust_frontend_args(args: argparse.Namespace) -> dict[str, Any]:
    """What `--args-json` holds: the arguments of `args` that differ from
    their defaults, less secrets and what only concerns the Python side,
    plus `model_tag`, `engine_ready_timeout_secs` and `http_timeout_keep_alive`."""
    return args_json(
        jsonify_non_default_args(args, exclude=SERVE_ONLY_ARGS | {"api_key", "hf_token", "grpc_port"}),
        args,
        envs.engine_ready_timeout_s(),
        envs.http_timeout_keep_alive(),
    )


def args_json(
    args_dict: dict[str, Any], args: argparse.Namespace, ready_timeout_s: float, keep_alive_s: float
) -> dict[str, Any]:
    """`args_dict` (the non-default arguments, as a `jsonify_non_default_args`
    made them) completed as the frontend reads it: `model_tag` (the model
    when no tag was given), `engine_ready_timeout_secs` and
    `http_timeout_keep_alive`."""
    model_tag = getattr(args, "model_tag", None) or getattr(args, "model", None)
    if model_tag is not None:
        args_dict["model_tag"] = model_tag
    args_dict["engine_ready_timeout_secs"] = ready_timeout_s
    args_dict["http_timeout_keep_alive"] = keep_alive_s
    return args_dict


def api_keys(api_key: Any) -> list[str]:
    """vLLM's `args.api_key` (None, a string or a list of them) as the list of
    its keys; empty keys mean none, as in vLLM and the frontend. Anything but
    strings is a ValueError."""
    if not api_key:
        return []
    keys = [api_key] if isinstance(api_key, str) else api_key
    if not isinstance(keys, (list, tuple)) or not all(isinstance(key, str) for key in keys):
        raise ValueError(f"api_key: expected a non-empty string, got {type(api_key).__name__}")
    return [key for key in keys if key]


def frontend_secrets(args_dict: dict[str, Any], api_key: Any, hf_token: Any = None) -> dict[str, str] | None:
    """The one rule for a frontend's secrets, whoever launches it. A single
    API key leaves `args_dict` and goes in the frontend's environment as
    `VLLM_API_KEY`, which only this user and root can read, not on its
    command line, which every local user can (`ps`, `/proc`). Several keys do
    not fit one variable: they go in `args_dict["api_key"]`, as vLLM 0.33
    passes every key to its Rust frontend, with a warning. A string
    `hf_token` goes in the environment as `HF_TOKEN` (vLLM's `--hf-token`
    without a value means "use the login's"). Returns this process's
    environment plus those secrets, or None (inherit it as is) when there
    are none."""
    keys = api_keys(api_key)
    secrets: dict[str, str] = {}
    args_dict.pop("api_key", None)
    if len(keys) == 1:
        secrets[API_KEY_ENV] = keys[0]
    elif keys:
        logger.warning(
            "%d API keys: the environment (%s) holds one, so they go in --args-json, "
            "on the frontend's command line, which every local user can read",
            len(keys), API_KEY_ENV,
        )  # fmt: skip
        args_dict["api_key"] = keys
    if isinstance(hf_token, str) and hf_token:
        secrets[HF_TOKEN_ENV] = hf_token
    return {**os.environ, **secrets} if secrets else None


def _shutdown_frontend(procs: list[Any], listeners: list[Any], timeout: float | None = None) -> None:
    """`shutdown_subprocesses` (at least 5 s before the kill), then the listeners' cleanup."""
    shutdown_and_cleanup_listeners(procs, listeners, timeout, shutdown_subprocesses)


class RustFrontendProcessManager:
    """Runs the Rust frontend (`binary_path frontend ...`, the bundled
    `vllm-rs` when None) with exactly the HTTP socket and the two listener fds
    inherited; `.processes` is one handle named `RustFrontend`. Secrets follow
    `frontend_secrets`: one API key (`args.api_key`) and `args.hf_token` reach
    the frontend in its environment, never on its command line.

    `vllm_rs.vllm_patch` runs vLLM's manager on this class, overriding what
    differs for vLLM: `_frontend_args`, `_hf_token`, `_log_launch` and `_stop`."""

    #: Stops the processes, then cleans up the listeners (vLLM's
    #: `_shutdown_subprocesses_and_cleanup_listeners` in the patched manager).
    _stop = staticmethod(_shutdown_frontend)

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
                from vllm_rs.serving.frontend_binary import frontend_binary

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
            args_dict = self._frontend_args(args)
            env = frontend_secrets(args_dict, getattr(args, "api_key", None), self._hf_token(args))
            cmd.extend(["--args-json", json.dumps(args_dict, sort_keys=True)])
            self._log_launch(cmd, args_dict)
            proc = spawn_executable(cmd, name="RustFrontend", env=env, pass_fds=inherited_fds)
        except BaseException:
            for listener in self._listeners:
                listener.cleanup()
            raise
        input_listener.close()
        output_listener.close()
        self.processes: list[Process] = [proc]
        self._finalizer = weakref.finalize(self, self._stop, self.processes, self._listeners)

    def _frontend_args(self, args: argparse.Namespace) -> dict[str, Any]:
        """`--args-json` before the secrets rule: `rust_frontend_args`."""
        return rust_frontend_args(args)

    def _hf_token(self, args: argparse.Namespace) -> Any:
        """The Hugging Face token that goes in the environment: `args.hf_token`."""
        return getattr(args, "hf_token", None)

    def _log_launch(self, cmd: list[str], args_dict: dict[str, Any]) -> None:
        """Logs the command line, credentials in `--args-json` redacted."""
        redacted = json.dumps(redact_sensitive_args(args_dict), sort_keys=True)
        logger.info("Launching Rust frontend: %s", " ".join(cmd[:-1] + [redacted]))

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the frontend (at least 5 s before the kill) and cleans up the
        listeners; idempotent."""
        if self._finalizer.detach() is not None:
            self._stop(self.processes, self._listeners, timeout)


def run_api_server_worker_proc(
    listen_address: str, sock: Any, args: Any, client_config: dict | None = None, **uvicorn_kwargs: Any
) -> None:
    """Entry point of one API server process: replaces this process (exec)
    with the Rust frontend serving the OpenAI API on `sock` for every engine
    (`args.data_parallel_size`, default 1), through the engine listeners of
    `client_config` (`input_listener`, `output_listener`, and the
    coordinator's `stats_update_address` when given), with the secrets as
    `frontend_secrets` places them. One Rust frontend serves every engine, so
    `client_count` must be 1, and uvicorn options have nothing to apply to:
    ApiServerConfigError otherwise."""
    from vllm_rs.serving.frontend_binary import frontend_binary

    client_config = client_config or {}
    if client_config.get("client_count", 1) != 1:
        raise ApiServerConfigError(
            f"client_count {client_config['client_count']}: one Rust frontend serves every engine; use 1"
        )
    if uvicorn_kwargs:
        raise ApiServerConfigError(f"uvicorn options do not apply to the Rust frontend: {', '.join(uvicorn_kwargs)}")
    dp = getattr(args, "data_parallel_size", 1) or 1
    cmd, fds = rust_frontend_command(
        frontend_binary(), sock,
        SimpleNamespace(socket=client_config["input_listener"]),
        SimpleNamespace(socket=client_config["output_listener"]),
        0, dp, dp, client_config.get("stats_update_address"), None,
    )  # fmt: skip
    args_dict = rust_frontend_args(args)
    env = frontend_secrets(args_dict, getattr(args, "api_key", None), getattr(args, "hf_token", None))
    cmd.extend(["--args-json", json.dumps(args_dict, sort_keys=True)])
    for fd in fds:
        os.set_inheritable(fd, True)
    init_logger(__name__).info(
        "API server %s on %s: the Rust frontend", client_config.get("client_index", 0), listen_address
    )
    os.execve(cmd[0], cmd, env or dict(os.environ))
