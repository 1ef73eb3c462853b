"""Environment variables, under vLLM's names and defaults, read at call time."""

import os
import tempfile


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def engine_ready_timeout_s() -> int:
    """`VLLM_ENGINE_READY_TIMEOUT_S`: seconds to wait for engines (default 600)."""
    return _int("VLLM_ENGINE_READY_TIMEOUT_S", 600)


def http_timeout_keep_alive() -> int:
    """`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`: HTTP keep-alive seconds (default 5)."""
    return _int("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", 5)


def api_key() -> str | None:
    """`VLLM_API_KEY`: the bearer token the API servers require (None when
    unset or empty). Passed to frontends this way so that no command line,
    which every local user can read, holds it."""
    return os.environ.get("VLLM_API_KEY") or None


def rpc_base_path() -> str:
    """`VLLM_RPC_BASE_PATH`: folder for ipc:// socket files (default: the temp dir)."""
    return os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()


def vllm_port() -> int | None:
    """`VLLM_PORT`: first port `get_open_port` tries, or None."""
    value = os.environ.get("VLLM_PORT")
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"VLLM_PORT must be a port number, got {value!r}")
    return int(value)
