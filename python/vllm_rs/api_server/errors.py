"""Errors in the OpenAI shape, `{"error": {"message", "type", "param",
"code"}}`, with the same types and statuses as the Rust frontend."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

#: OpenAI error type by HTTP status; anything else is InternalServerError.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    431: "RequestHeaderFieldsTooLargeError",
    503: "ServiceUnavailableError",
}


def dumps(value: Any) -> str:
    """Compact JSON with raw UTF-8, as the Rust frontend writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class ApiError(Exception):
    """An HTTP error answered in the OpenAI shape."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @classmethod
    def invalid_param(cls, param: str, message: str) -> ApiError:
        """400 for a bad `param`."""
        return cls(400, message, param)

    @property
    def error_type(self) -> str:
        """The OpenAI error type for this status."""
        return ERROR_TYPES.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status}}

    def response(self) -> Response:
        """The HTTP response (408 and 413 also close the connection: the rest
        of the body was never read)."""
        headers = {"connection": "close"} if self.status in (408, 413) else None
        return Response(dumps(self.body()), status_code=self.status, media_type="application/json", headers=headers)
