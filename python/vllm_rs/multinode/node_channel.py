"""The control channel between the head node and its `serve --headless`
engine nodes (topology in `topology.py`).

The channel is newline-delimited JSON objects over TCP, each with a
`"type"`: `hello` (node: ranks, model, data_parallel_size), `welcome`
(head: inputs, outputs, heartbeat_timeout_s) or `refused` (reason), `ping`,
`engine_died` (node: rank, name, exitcode), `bye` (node stopping on
purpose), `shutdown` (head stopping on purpose). Like the engine sockets it
has no authentication: bind it to a trusted network only.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

#: Both ends of the node channel send a ping this often.
HEARTBEAT_INTERVAL_S = 1.0
#: A line on the node channel may hold at most this many bytes.
MAX_LINE_BYTES = 1 << 20
#: A message that cannot be sent within this means the peer is lost.
SEND_TIMEOUT_S = 2.0


class ChannelClosed(Exception):
    """The peer closed the node channel, or broke its framing."""


class NodeChannel:
    """One end of the node channel: JSON objects, one a line, over a TCP
    socket; `last_heard` is when anything last arrived."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        # Sends are small and rare: a send that cannot go out within this is a lost peer.
        self.sock.settimeout(SEND_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self.last_heard = time.monotonic()
        self.peer = _peer_name(sock)

    def fileno(self) -> int:
        """The socket's fd (for select/poll)."""
        return self.sock.fileno()

    def send(self, message: dict[str, Any]) -> None:
        """Sends one message; ChannelClosed when the connection is gone.
        Messages are small, so a blocking send with a short timeout suffices."""
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as e:
            raise ChannelClosed(f"sending failed: {e.strerror or e}") from None

    def receive(self) -> list[dict[str, Any]]:
        """Reads what has arrived (call when the socket is readable) and
        returns the complete messages; ChannelClosed on end of stream, a
        reset, a line over `MAX_LINE_BYTES` or a line that is not a JSON object."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return []
        except OSError as e:
            raise ChannelClosed(f"connection error: {e.strerror or e}") from None
        if not chunk:
            raise ChannelClosed("connection closed")
        self.last_heard = time.monotonic()
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_LINE_BYTES:
            raise ChannelClosed(f"a line of more than {MAX_LINE_BYTES} bytes")
        messages = []
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                raise ChannelClosed("a line that is not JSON") from None
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ChannelClosed("a message that is not an object with a type")
            messages.append(message)
        return messages

    def close(self) -> None:
        """Closes the socket."""
        self.sock.close()


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
