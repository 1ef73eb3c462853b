"""Environment variables, under vLLM's names and defaults, read at call time."""

import os
import tempfile


class EnvError(ValueError):
    """An environment variable holds a value it cannot have; the message names it."""


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise EnvError(f"{name} must be an integer, got {value!r}") from None


def log_stats_interval_s() -> float:
    """`VLLM_LOG_STATS_INTERVAL`: seconds between throughput log lines (10);
    raises EnvError unless it is a number > 0."""
    value = os.environ.get("VLLM_LOG_STATS_INTERVAL") or "10"
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise EnvError(f"VLLM_LOG_STATS_INTERVAL must be a number of seconds > 0, got {value!r}")
    return seconds


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
        raise EnvError(f"VLLM_PORT must be a port number, got {value!r}")
    return int(value)
