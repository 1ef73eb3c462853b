"""uvicorn's httptools protocol with the limits a public HTTP server needs and
uvicorn lacks: a deadline for a request's headers and one for its body, a
cap on the header section's size, and a cap on open connections that makes
room by dropping the connection idle the longest. Refusals are answered in
the OpenAI error shape before the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from vllm_rs.api_server.errors import ApiError, dumps
from vllm_rs.api_server.limits import ServerLimits
from vllm_rs.api_server.throttled_log import ThrottledWarning
from vllm_rs.logger import init_logger

logger = init_logger(__name__)
_warn_refused = ThrottledWarning(logger)


class HeaderTooLargeError(Exception):
    """Raised inside a parser callback to stop parsing an oversized header."""


def error_response_bytes(error: ApiError) -> bytes:
    """A complete HTTP/1.1 response carrying `error`, closing the connection."""
    body = dumps(error.body()).encode()
    head = (
        b"content-type: application/json\r\nconnection: close\r\n"
        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )  # fmt: skip
    return STATUS_LINE[error.status] + head + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTP connection under `limits` (set by `guarded_protocol`)."""

    limits: ServerLimits = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        # Set while the connection waits for (the rest of) a request's
        # headers with no request of its own running: it may be evicted.
        self._idle_since: float | None = None
        self._reading_headers = False
        self._header_bytes = 0
        self._raw_header_bytes = 0
        self._header_too_large = False

    # ---- connection ----

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Registers the connection, making room by evicting the connection
        idle the longest when at the limit (or refusing this one when none is
        idle), and starts the header deadline."""
        if len(self.connections) >= self.limits.http_max_connections and not self._evict_idle():
            super().connection_made(transport)
            _warn_refused("refusing a connection: all %d connections are busy with requests", len(self.connections) - 1)
            transport.close()
            return
        super().connection_made(transport)
        self._expect_headers()
        self._arm(self.limits.http_header_timeout_s, self._headers_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stops the deadline, then lets uvicorn clean up."""
        self._disarm()
        self._idle_since = None
        super().connection_lost(exc)

    def _evict_idle(self) -> bool:
        oldest = None
        for other in self.connections:
            since = getattr(other, "_idle_since", None)
            if since is not None and (oldest is None or since < oldest._idle_since):
                oldest = other
        if oldest is None:
            return False
        logger.debug(
            "connection limit (%d) reached: closing the connection idle the longest", self.limits.http_max_connections
        )
        oldest._idle_since = None
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

    # ---- deadlines ----

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expect_headers(self) -> None:
        self._reading_headers = True
        self._idle_since = self.loop.time()
        self._header_bytes = 0
        self._raw_header_bytes = 0

    def _headers_timed_out(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            logger.debug(
                "closing a connection that sent no complete request headers within %gs",
                self.limits.http_header_timeout_s,
            )
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        seconds = self.limits.http_body_timeout_s
        logger.debug("closing a connection whose request body did not arrive within %gs", seconds)
        cycle = self.cycle
        # A pipelined request waits behind an earlier answer still being
        # written: no 408 in the middle of that one, the connection just closes.
        if cycle is not None and not cycle.response_started and not self.pipeline:
            self.transport.write(
                error_response_bytes(ApiError(408, f"the request body did not arrive within {seconds:g}s"))
            )
            # The handler still waiting for the body sees a disconnect, and
            # anything it sends afterwards is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _reject(self, error: ApiError) -> None:
        self._disarm()
        self._idle_since = None
        if not self.transport.is_closing():
            self.transport.write(error_response_bytes(error))
            self.transport.close()

    # ---- parsing ----

    def data_received(self, data: bytes) -> None:
        """Feeds the parser; malformed requests get a 400 and oversized
        headers a 431, both in the OpenAI shape."""
        self._unset_keepalive_if_required()
        if self._reading_headers:
            self._raw_header_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No upgrade is supported: the request is served as plain HTTP/1.1
            # (as uvicorn does); a body after it never arrives, so the body
            # deadline ends such a request.
            return
        except httptools.HttpParserError:
            if self._header_too_large:
                self._reject(self._too_large())
            else:
                self._reject(ApiError(400, "Invalid HTTP request received."))
            return
        if self._reading_headers and self._raw_header_bytes > self.limits.http_max_header_bytes:
            self._reject(self._too_large())

    def _too_large(self) -> ApiError:
        return ApiError(431, f"the request headers exceed {self.limits.http_max_header_bytes} bytes")

    def _count_header_bytes(self, count: int) -> None:
        self._header_bytes += count
        if self._header_bytes > self.limits.http_max_header_bytes:
            self._header_too_large = True
            raise HeaderTooLargeError

    def on_message_begin(self) -> None:
        """A new request: its headers must complete within the deadline."""
        super().on_message_begin()
        if not self._reading_headers:
            self._expect_headers()
        if self._deadline is None:
            self._arm(self.limits.http_header_timeout_s, self._headers_timed_out)

    def on_url(self, url: bytes) -> None:
        """Counts the URL toward the header size."""
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Counts the header line toward the header size."""
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """Headers done: the body deadline starts."""
        self._reading_headers = False
        self._idle_since = None
        self._arm(self.limits.http_body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The whole request arrived: no deadline while it is handled."""
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """Back to idle (evictable; uvicorn's keep-alive timeout applies)."""
        super().on_response_complete()
        # Not idle while a pipelined request runs or a body is still arriving.
        running = self.cycle is not None and not self.cycle.response_complete
        if not self.transport.is_closing() and self._deadline is None and not running:
            self._expect_headers()


def guarded_protocol(limits: ServerLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn should use (`http=`) to serve under `limits`."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
