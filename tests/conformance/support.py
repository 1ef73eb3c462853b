"""What the conformance tests share: starting a stack, raw HTTP on a fresh
connection, and the OpenAI error shape. No tests live here."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.http import assert_error_shape
from tests.support.http import request as send
from tests.test_serve import API_KEY, Serve, assert_all_gone

__all__ = ["API_KEY", "AUTH", "assert_error_shape", "known_difference", "port_of", "raw_exchange", "send", "serving"]

#: The header that carries `API_KEY`.
AUTH = {"authorization": f"Bearer {API_KEY}"}


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[Serve]:
    """`serve --model echo --port 0 ARGS`, ready; on exit it is interrupted
    and must exit 0 leaving nothing running."""
    serve = Serve("--model", "echo", "--port", "0", *args, env=env)
    try:
        serve.wait_ready()
        yield serve
        processes = serve.descendants()
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=5)
    finally:
        serve.kill()


def known_difference(request: pytest.FixtureRequest, reason: str) -> None:
    """Marks the running test xfail(strict): a known way the frontend differs
    from vLLM, with `reason` saying how. Strict, so that a fix makes the test
    fail until the mark goes."""
    request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def port_of(serve: Serve) -> int:
    """The HTTP port `serve` listens on."""
    return urlsplit(serve.wait_ready()).port


def raw_exchange(serve: Serve, data: bytes, timeout_s: float = 60) -> bytes:
    """Sends `data` on a fresh TCP connection and returns everything the
    server sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port_of(serve)), timeout=timeout_s) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return answer
            if not chunk:
                return answer
            answer += chunk
