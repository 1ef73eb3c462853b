"""Small HTTP helpers the frontend's tests share: one request on a fresh
connection, a call in the background, and the OpenAI error shape."""

from __future__ import annotations

import http.client
import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tests.support.wait import DEADLINE_S


def request(method: str, port: int, path: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout_s: float = DEADLINE_S) -> tuple[int, dict[str, Any] | bytes]:  # fmt: skip
    """One HTTP request on a fresh connection; the status and the JSON body
    (raw bytes when it is not JSON)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw
    finally:
        connection.close()


def in_background(fn: Any, *args: Any) -> Future:
    """Runs `fn(*args)` on a thread (an HTTP call while the test plays the engine)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def assert_error_shape(status: int, body: Any, expected_status: int | None = None, param: str | None = None) -> None:
    """`body` is an OpenAI error with `status` (4xx unless given), naming `param` when given."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == status, (status, error)
    if expected_status is not None:
        assert status == expected_status, (status, error)
    else:
        assert 400 <= status < 500, (status, error)
    if param is not None:
        assert error["param"] == param, error
    assert "Traceback" not in error["message"] and "Error(" not in error["message"], error
