"""ZeroMQ endpoints without a window for port theft.

A `ZmqListener` is an OS socket that the supervising process creates, binds
and sets listening *before* any child starts; the child that owns the ZeroMQ
socket adopts the fd (libzmq's `ZMQ_USE_FD`) instead of binding anew. Port 0
is resolved to a concrete port at creation, so the address can be handed out
at once and nobody else can take the port in between.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import uuid
from typing import Any

from vllm_rs import envs
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Listen backlog of listener sockets (libzmq's own default, ZMQ_BACKLOG).
LISTEN_BACKLOG = 100


def split_zmq_path(path: str) -> tuple[str, str, str]:
    """Splits `tcp://host:port` / `ipc://path` into (scheme, host-or-path, port).
    IPv6 hosts come back without brackets; ipc paths have an empty port."""
    scheme, sep, rest = path.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc"):
        raise ValueError(f"Invalid zmq path {path!r}: expected tcp://HOST:PORT or ipc://PATH")
    if scheme != "tcp":
        if not rest:
            raise ValueError(f"Invalid zmq path {path!r}: empty {scheme} path")
        return scheme, rest, ""
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ValueError(f"Invalid zmq path {path!r}: expected tcp://HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return scheme, host, port


def is_valid_ipv6_address(address: str) -> bool:
    """True when `address` is a literal IPv6 address."""
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def get_tcp_uri(host: str, port: int) -> str:
    """`tcp://host:port`, or `tcp://[host]:port` for an IPv6 host. Port 0 stays 0."""
    if is_valid_ipv6_address(host):
        return f"tcp://[{host}]:{port}"
    return f"tcp://{host}:{port}"


def get_open_zmq_ipc_path() -> str:
    """A fresh `ipc://{VLLM_RPC_BASE_PATH}/{uuid4}` endpoint (nothing created yet)."""
    return f"ipc://{envs.rpc_base_path()}/{uuid.uuid4()}"


def _try_bind(port: int) -> bool:
    for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
                return True
        except OSError:
            continue
    return False


def get_open_port() -> int:
    """A TCP port that was free a moment ago: from `VLLM_PORT` upward when set,
    else one the kernel picks. Prefer `make_zmq_listener`, which keeps the port."""
    start = envs.vllm_port()
    if start is not None:
        for port in range(start, 65536):
            if _try_bind(port):
                return port
            logger.info("Port %d is already in use, trying port %d", port, port + 1)
        raise OSError(f"no free port at or above VLLM_PORT={start}")
    for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                return s.getsockname()[1]
        except OSError:
            continue
    raise OSError("no free TCP port could be found")


class ZmqListener:
    """An OS socket bound and listening for a ZeroMQ endpoint.

    `.address` is the concrete endpoint (port resolved), `.socket` the
    `socket.socket`, `.socket_type` the ZeroMQ socket type meant to adopt it.
    Passed to a child started by vllm_rs, it arrives there as an inherited fd.
    """

    def __init__(self, address: str, sock: socket.socket, socket_type: int):
        self.address = address
        self.socket = sock
        self.socket_type = socket_type

    @property
    def ipc_path(self) -> str | None:
        """The socket file of an ipc:// listener, else None (also for an
        abstract `ipc://@NAME`, which has no file)."""
        if not self.address.startswith("ipc://") or self.address.startswith("ipc://@"):
            return None
        return self.address[len("ipc://"):]

    def fileno(self) -> int:
        """The listening fd (-1 once closed)."""
        return self.socket.fileno()

    def close(self) -> None:
        """Closes this process's copy of the socket (children keep theirs)."""
        self.socket.close()

    def cleanup(self) -> None:
        """Closes the socket and removes an ipc:// socket file."""
        self.close()
        path = self.ipc_path
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            if sys.platform.startswith("linux"):
                from vllm_rs.process import cancel_remove_on_exit

                cancel_remove_on_exit(path)  # removed here: the guardian must not touch a later file there

    def __repr__(self) -> str:
        return f"ZmqListener(address={self.address!r}, fd={self.socket.fileno()})"


def make_zmq_listener(addr: str, socket_type: int) -> ZmqListener:
    """Creates, binds and listens on an OS socket for `addr` (tcp://, ipc://PATH,
    or Linux's abstract `ipc://@NAME`, which leaves no file behind). Port 0 is
    resolved; the returned listener's `.address` is concrete."""
    scheme, host, port = split_zmq_path(addr)
    if scheme == "ipc":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract = host.startswith("@")
        try:
            sock.bind("\0" + host[1:] if abstract else host)
            sock.listen(LISTEN_BACKLOG)
            if sys.platform.startswith("linux") and not abstract:
                from vllm_rs.process import remove_on_exit

                remove_on_exit(host)  # no socket file left even if we are SIGKILLed
        except BaseException:
            sock.close()
            raise
        return ZmqListener(addr, sock, socket_type)
    if scheme != "tcp":
        raise ValueError(f"Cannot listen on {addr!r}: only tcp:// and ipc:// endpoints have listeners")
    bind_host = "" if host == "*" else host
    family = socket.AF_INET6 if is_valid_ipv6_address(bind_host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, int(port)))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return ZmqListener(get_tcp_uri(host, sock.getsockname()[1]), sock, socket_type)


def _buffer_size() -> int:
    """vLLM's choice: 0.5 GiB socket buffers on big machines, else the OS default."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return -1
    gib = 1024**3
    return int(0.5 * gib) if total > 32 * gib and available > 16 * gib else -1


def make_zmq_socket(
    ctx: Any,
    path: str,
    socket_type: Any,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
    listener: ZmqListener | None = None,
) -> Any:
    """A pyzmq socket for `path` with vLLM's buffer and high-water-mark
    settings. `bind` defaults to True except for PUSH/SUB/XSUB. With
    `listener`, the socket adopts the listener's fd (ZMQ_USE_FD) instead of
    binding anew; libzmq then owns that fd."""
    import zmq

    if listener is not None and listener.socket.fileno() == -1:
        raise ValueError(f"listener for {listener.address} is closed; it cannot be adopted")
    sock = ctx.socket(socket_type)
    try:
        buf_size = _buffer_size()
        if socket_type in (zmq.PULL, zmq.DEALER, zmq.ROUTER):
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.RCVBUF, buf_size)
        if socket_type in (zmq.PUSH, zmq.DEALER, zmq.ROUTER):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.SNDBUF, buf_size)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        if linger is not None:
            sock.setsockopt(zmq.LINGER, linger)
        if socket_type == zmq.XPUB:
            sock.setsockopt(zmq.XPUB_VERBOSE, True)
        scheme, host, _ = split_zmq_path(path)
        if scheme == "tcp" and is_valid_ipv6_address(host):
            sock.setsockopt(zmq.IPV6, 1)
        if bind is None:
            bind = socket_type not in (zmq.PUSH, zmq.SUB, zmq.XSUB)
        if listener is not None:
            sock.setsockopt(zmq.USE_FD, listener.socket.fileno())
            sock.bind(listener.address)
            listener.socket.detach()  # libzmq closes the fd with its socket
        elif bind:
            sock.bind(path)
        else:
            sock.connect(path)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock
