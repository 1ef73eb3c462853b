"""The API server's protective limits, read from the `VLLM_RS_*` environment
variables every frontend shares (docs/serve.md lists them). A bad value is a
`LimitError` naming the variable, raised before anything is served."""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

#: `VLLM_RS_ENGINE_STALL_TIMEOUT_S` default: an engine with requests in flight
#: that sent nothing for this long is marked hung.
DEFAULT_ENGINE_STALL_TIMEOUT_S = 60.0
#: `VLLM_RS_MAX_ENGINE_MESSAGE_BYTES` default: the largest engine message accepted.
DEFAULT_MAX_ENGINE_MESSAGE_BYTES = 256 * 1024 * 1024
#: `VLLM_RS_HTTP_HEADER_TIMEOUT_S` default: time to receive a request's headers.
DEFAULT_HTTP_HEADER_TIMEOUT_S = 5.0
#: `VLLM_RS_HTTP_MAX_HEADER_BYTES` default: the largest header section.
DEFAULT_HTTP_MAX_HEADER_BYTES = 64 * 1024
#: `VLLM_RS_HTTP_BODY_TIMEOUT_S` default: time to receive a whole request body.
DEFAULT_HTTP_BODY_TIMEOUT_S = 30.0
#: `VLLM_RS_HTTP_MAX_CONNECTIONS` default (lowered to half the open-file limit).
DEFAULT_HTTP_MAX_CONNECTIONS = 4096


class LimitError(ValueError):
    """A `VLLM_RS_*` limit variable holds a value that is not allowed."""


def _positive_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LimitError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise LimitError(f"{name} must be a finite number of seconds greater than 0, got {raw!r}")
    return value


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 18 or int(text) == 0:
        raise LimitError(f"{name} must be a positive integer, got {raw!r}")
    return int(text)


def _default_max_connections() -> int:
    """Half the open-file limit keeps fds for engines, logs and libraries."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_HTTP_MAX_CONNECTIONS
    return max(16, min(DEFAULT_HTTP_MAX_CONNECTIONS, soft // 2))


@dataclass(frozen=True)
class ServerLimits:
    """Every limit the API server enforces on its engines and HTTP clients."""

    engine_stall_timeout_s: float = DEFAULT_ENGINE_STALL_TIMEOUT_S
    max_engine_message_bytes: int = DEFAULT_MAX_ENGINE_MESSAGE_BYTES
    http_header_timeout_s: float = DEFAULT_HTTP_HEADER_TIMEOUT_S
    http_max_header_bytes: int = DEFAULT_HTTP_MAX_HEADER_BYTES
    http_body_timeout_s: float = DEFAULT_HTTP_BODY_TIMEOUT_S
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS

    @classmethod
    def from_env(cls) -> ServerLimits:
        """The limits from the environment; raises LimitError naming the
        first variable with a bad value."""
        return cls(
            engine_stall_timeout_s=_positive_seconds("VLLM_RS_ENGINE_STALL_TIMEOUT_S", DEFAULT_ENGINE_STALL_TIMEOUT_S),
            max_engine_message_bytes=_positive_int(
                "VLLM_RS_MAX_ENGINE_MESSAGE_BYTES", DEFAULT_MAX_ENGINE_MESSAGE_BYTES
            ),
            http_header_timeout_s=_positive_seconds("VLLM_RS_HTTP_HEADER_TIMEOUT_S", DEFAULT_HTTP_HEADER_TIMEOUT_S),
            http_max_header_bytes=_positive_int("VLLM_RS_HTTP_MAX_HEADER_BYTES", DEFAULT_HTTP_MAX_HEADER_BYTES),
            http_body_timeout_s=_positive_seconds("VLLM_RS_HTTP_BODY_TIMEOUT_S", DEFAULT_HTTP_BODY_TIMEOUT_S),
            http_max_connections=_positive_int("VLLM_RS_HTTP_MAX_CONNECTIONS", _default_max_connections()),
        )
