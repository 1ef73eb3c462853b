"""Logging in vLLM's format for the `vllm_rs` package.

`init_logger(name)` returns a logger under the `vllm_rs` root, which (unless
`VLLM_CONFIGURE_LOGGING=0`) prints like vLLM does:
``INFO 11-29 21:40:40 [utils.py:123] message``.
"""

import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
_ROOT = "vllm_rs"


def _configure_root() -> None:
    root = logging.getLogger(_ROOT)
    if getattr(root, "_vllm_rs_configured", False):
        return
    root._vllm_rs_configured = True  # type: ignore[attr-defined]
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())


def init_logger(name: str) -> logging.Logger:
    """Returns the logger `name` (a `vllm_rs.*` module name), with the package's
    handler in vLLM's format installed once."""
    _configure_root()
    return logging.getLogger(name)
