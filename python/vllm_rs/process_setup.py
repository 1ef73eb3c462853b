"""What a child process of the stack does first: its process title and its
log-line prefix, as vLLM's processes show them, and the entry point of one
API server process (`run_api_server_worker_proc`, re-exported by
`vllm_rs.utils`), which becomes the Rust frontend.
"""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace
from typing import Any

from vllm_rs.logger import init_logger


class ApiServerConfigError(ValueError):
    """`run_api_server_worker_proc` was asked for what the Rust frontend cannot do."""


def run_api_server_worker_proc(
    listen_address: str, sock: Any, args: Any, client_config: dict | None = None, **uvicorn_kwargs: Any
) -> None:
    """Entry point of one API server process: replaces this process (exec)
    with the Rust frontend serving the OpenAI API on `sock` for every engine
    (`args.data_parallel_size`, default 1), through the engine listeners of
    `client_config` (`input_listener`, `output_listener`, and the
    coordinator's `stats_update_address` when given). One Rust frontend
    serves every engine, so `client_count` must be 1, and uvicorn options
    have nothing to apply to: ApiServerConfigError otherwise."""
    from vllm_rs.frontend import frontend_binary
    from vllm_rs.process_managers import frontend_environment, rust_frontend_args, rust_frontend_command

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
    cmd.extend(["--args-json", json.dumps(rust_frontend_args(args), sort_keys=True)])
    env = frontend_environment(getattr(args, "api_key", None), getattr(args, "hf_token", None)) or dict(os.environ)
    for fd in fds:
        os.set_inheritable(fd, True)
    init_logger(__name__).info(
        "API server %s on %s: the Rust frontend", client_config.get("client_index", 0), listen_address
    )
    os.execve(cmd[0], cmd, env)


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
