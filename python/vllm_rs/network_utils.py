"""ZeroMQ endpoints without a window for port theft.

A `ZmqListener` is an OS socket that the supervising process creates, binds
and sets listening *before* any child starts; the child that owns the ZeroMQ
socket adopts the fd (libzmq's `ZMQ_USE_FD`) instead of binding anew. Port 0
is resolved to a concrete port at creation, so the address can be handed out
at once and nobody else can take the port in between.

Engine endpoints carry every prompt and every answer and have no
authentication of their own, so the Unix sockets made here are private to
this user: a socket file is chmod 0600 before it listens, and
`get_open_zmq_ipc_path` names paths inside a directory of mode 0700. Linux's
abstract sockets (`ipc://@NAME`) have no permission check at all: any local
user can connect to them. They are still accepted where an address is given
explicitly, but nothing in vllm_rs uses them by default.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import stat
import sys
import tempfile
import threading
import uuid
from typing import Any

from vllm_rs import envs
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Listen backlog of listener sockets (libzmq's own default, ZMQ_BACKLOG).
LISTEN_BACKLOG = 100
#: Mode of a listener's socket file: connecting needs write permission, so
#: only this user (and root) can connect.
PRIVATE_SOCKET_MODE = 0o600


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
    return make_zmq_path("tcp", host, port)


def make_zmq_path(scheme: str, host: str, port: int | str | None = None) -> str:
    """A ZeroMQ endpoint from its parts: `scheme://host` without a port (ipc
    paths, inproc names), else `scheme://host:port`, with the host in
    brackets when it is an IPv6 address (`tcp://[::1]:5555`)."""
    if port is None:
        return f"{scheme}://{host}"
    return f"{scheme}://{join_host_port(host, port)}"


def join_host_port(host: str, port: int | str) -> str:
    """`host:port`, or `[host]:port` when `host` is an IPv6 address."""
    if is_valid_ipv6_address(host):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class HostPortError(ValueError, IndexError):
    """A `host:port` string that `split_host_port` cannot split. A
    ValueError; also an IndexError, which is what vLLM raises for a
    bracketed IPv6 host with no `:` after the bracket, so code that catches
    either keeps working."""


def split_host_port(host_port: str) -> tuple[str, int]:
    """(host, port) from `host:port` or `[ipv6]:port` (the host comes back
    without brackets). Anything else raises HostPortError (a ValueError)
    naming the input and what is wrong: no `:` before the port, several
    colons outside brackets (an IPv6 host needs them), an empty host, or a
    port that is not a number from 0 to 65535."""
    if host_port.startswith("["):
        host, bracket, after = host_port[1:].partition("]")
        if not bracket or not after.startswith(":"):
            raise HostPortError(f"{host_port!r}: expected [IPV6]:PORT, with `:` right after the `]`")
        port = after[1:]
    else:
        host, colon, port = host_port.partition(":")
        if not colon:
            raise HostPortError(f"{host_port!r}: expected HOST:PORT, found no `:`")
        if ":" in port:
            raise HostPortError(f"{host_port!r}: expected HOST:PORT with one `:` (put an IPv6 host in brackets)")
    if not host:
        raise HostPortError(f"{host_port!r}: the host is empty")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise HostPortError(f"{host_port!r}: the port {port!r} is not a number from 0 to 65535")
    return host, int(port)


def default_socket_dir_base() -> str:
    """Where private socket directories go: `$XDG_RUNTIME_DIR` when it is set
    and usable (a directory this user owns, may write in, and nobody else
    may), else the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if (
            st is not None
            and stat.S_ISDIR(st.st_mode)
            and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and os.access(runtime, os.W_OK | os.X_OK)
        ):
            return runtime
        logger.debug("XDG_RUNTIME_DIR=%s is not usable for sockets; using the temp dir", runtime)
    return tempfile.gettempdir()


class PrivateSocketDir:
    """A fresh directory of mode 0700 (`tempfile.mkdtemp`) for Unix socket
    files: nobody but this user (and root) can reach a socket inside it,
    whatever the socket's own mode. The process core's guardian removes it
    (with the socket files registered in it) even after a SIGKILL of this
    process; `remove()` does it on a clean exit."""

    def __init__(self, base: str | None = None, prefix: str = "vllm-rs-"):
        self.path = tempfile.mkdtemp(prefix=prefix, dir=base or default_socket_dir_base())
        self._owner = os.getpid()
        if sys.platform.startswith("linux"):
            from vllm_rs.process.core import remove_on_exit

            try:
                remove_on_exit(self.path)
            except BaseException:
                os.rmdir(self.path)
                raise

    def endpoint(self, name: str) -> str:
        """`ipc://DIR/name`: a socket file in this directory (not created here)."""
        return f"ipc://{self.path}/{name}"

    def remove(self) -> None:
        """Removes the socket files left in the directory, then the directory.
        Anything else in it (never put there by vllm_rs) is left, and so is
        the directory then. Only the process that made it removes it (a
        forked child inherits the object, not the ownership)."""
        if os.getpid() != self._owner:
            return
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return
        for entry in entries:
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                _unlink_socket_file(entry.path)
        try:
            os.rmdir(self.path)
        except OSError as e:
            logger.warning("socket directory %s not removed: %s", self.path, e.strerror)
            return
        if sys.platform.startswith("linux"):
            from vllm_rs.process.core import cancel_remove_on_exit

            cancel_remove_on_exit(self.path)  # removed here: a later directory there is not ours


_private_ipc_dirs: dict[tuple[int, str], PrivateSocketDir] = {}
_private_ipc_dirs_lock = threading.Lock()


def private_ipc_dir(base: str) -> str:
    """This process's private socket directory under `base` (a
    `PrivateSocketDir` made on first use, removed at exit)."""
    key = (os.getpid(), base)  # a forked child makes its own
    with _private_ipc_dirs_lock:
        directory = _private_ipc_dirs.get(key)
        if directory is None or not os.path.isdir(directory.path):
            directory = PrivateSocketDir(base)
            atexit.register(directory.remove)
            _private_ipc_dirs[key] = directory
    return directory.path


def get_open_zmq_ipc_path() -> str:
    """A fresh `ipc://{VLLM_RPC_BASE_PATH}/vllm-rs-XXXXXXXX/{uuid4}` endpoint:
    the socket file does not exist yet, and the directory it will be in is
    this process's private one (mode 0700, see `private_ipc_dir`)."""
    return f"ipc://{private_ipc_dir(envs.rpc_base_path())}/{uuid.uuid4()}"


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


def _unlink_socket_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
        return self.address[len("ipc://") :]

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
            _unlink_socket_file(path)
            if sys.platform.startswith("linux"):
                from vllm_rs.process.core import cancel_remove_on_exit

                cancel_remove_on_exit(path)  # removed here: the guardian must not touch a later file there

    def __repr__(self) -> str:
        return f"ZmqListener(address={self.address!r}, fd={self.socket.fileno()})"


def make_zmq_listener(addr: str, socket_type: int) -> ZmqListener:
    """Creates, binds and listens on an OS socket for `addr` (tcp://, ipc://PATH,
    or Linux's abstract `ipc://@NAME`). Port 0 is resolved; the returned
    listener's `.address` is concrete.

    An ipc:// socket file gets mode 0600 before it listens (until then a
    connect is refused anyway), so only this user can connect; it is removed
    by `cleanup()`, and by the guardian if this process is SIGKILLed. An
    abstract socket has no file and no permission check: any local user can
    connect to it, so give one only where that is acceptable."""
    scheme, host, port = split_zmq_path(addr)
    if scheme == "ipc":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract = host.startswith("@")
        bound = False
        try:
            sock.bind("\0" + host[1:] if abstract else host)
            bound = True
            if not abstract:
                os.chmod(host, PRIVATE_SOCKET_MODE)
            sock.listen(LISTEN_BACKLOG)
            if sys.platform.startswith("linux") and not abstract:
                from vllm_rs.process.core import remove_on_exit

                remove_on_exit(host)  # no socket file left even if we are SIGKILLed
        except BaseException:
            sock.close()
            if bound and not abstract:
                _unlink_socket_file(host)  # ours: bind made it
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


def _as_listener(listener: Any, path: str, socket_type: int) -> ZmqListener:
    """`listener` as an open ZmqListener (a bare socket is wrapped for `path`)."""
    if isinstance(listener, socket.socket):
        listener = ZmqListener(path, listener, socket_type)
    elif not isinstance(listener, ZmqListener):
        raise TypeError(
            f"listener for {path}: expected a ZmqListener or a listening socket.socket, got {type(listener).__name__}"
        )
    if listener.socket.fileno() == -1:
        raise ValueError(f"listener for {listener.address} is closed; it cannot be adopted")
    return listener


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
    listener: ZmqListener | socket.socket | None = None,
) -> Any:
    """A pyzmq socket for `path` with vLLM's buffer and high-water-mark
    settings. `bind` defaults to True except for PUSH/SUB/XSUB. With
    `listener` (a `ZmqListener`, or the bare listening `socket.socket` that
    vLLM's API-server workers pass from `client_config["input_listener"]`,
    which is then taken to listen on `path`), the socket adopts the
    listener's fd (ZMQ_USE_FD) instead of binding anew; libzmq then owns
    that fd. A closed listener or another kind of object is a ValueError /
    TypeError naming the endpoint, before any ZeroMQ socket exists."""
    import zmq

    if listener is not None:
        listener = _as_listener(listener, path, socket_type)
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
