"""vllm_rs.network_utils against real sockets and real ZeroMQ peers."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import zmq
from vllm_rs.network_utils import (
    HostPortError,
    PrivateSocketDir,
    default_socket_dir_base,
    get_open_port,
    get_open_zmq_ipc_path,
    get_tcp_uri,
    join_host_port,
    make_zmq_listener,
    make_zmq_path,
    make_zmq_socket,
    split_host_port,
    split_zmq_path,
)
from vllm_rs.utils import get_engine_client_zmq_addr

from tests.support.wait import WaitTimeout, wait_until


def test_tcp_uri_and_engine_client_addresses(monkeypatch, tmp_path):
    assert get_tcp_uri("127.0.0.1", 5555) == "tcp://127.0.0.1:5555"
    assert get_tcp_uri("::1", 0) == "tcp://[::1]:0"
    assert get_engine_client_zmq_addr(False, "10.0.0.1") == "tcp://10.0.0.1:0"
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    addr = get_engine_client_zmq_addr(True, "ignored")
    assert addr.startswith(f"ipc://{tmp_path}/")
    uuid.UUID(addr.rsplit("/", 1)[1])
    assert get_open_zmq_ipc_path() != addr


IPC_PATHS_SCRIPT = """
import os, sys, zmq
from vllm_rs.network_utils import get_open_zmq_ipc_path
os.umask(0)  # a socket libzmq binds is then connectable by anyone, by its own mode
a, b = get_open_zmq_ipc_path(), get_open_zmq_ipc_path()
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL)
pull.bind(a)
d = os.path.dirname(a[len("ipc://"):])
print(a, b, oct(os.stat(d).st_mode & 0o777), sorted(os.listdir(d)), flush=True)
if sys.argv[1] == "abrupt":
    os._exit(0)  # no atexit, no zmq cleanup: like a SIGKILL
"""


def wait_until_empty(directory, within_s: float) -> list:
    """The entries of `directory`, polled until none is left or the deadline."""
    try:
        wait_until(lambda: not list(directory.iterdir()), f"{directory} to empty", within_s)
    except WaitTimeout:
        pass
    return list(directory.iterdir())


@pytest.fixture
def short_tmp_path():
    """A fresh directory with a short path (socket paths are limited to 107
    bytes; pytest's tmp_path is long)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="t-"))
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("ending", ["clean", "abrupt"])
def test_ipc_paths_are_in_a_private_directory_removed_at_exit(short_tmp_path, ending):
    tmp_path = short_tmp_path
    """A process's ipc paths share one directory of mode 0700, so a socket
    libzmq binds there is out of other users' reach whatever the umask; the
    directory and a socket left in it are gone once the process is."""
    out = subprocess.run(
        [sys.executable, "-c", IPC_PATHS_SCRIPT, ending], check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "VLLM_RPC_BASE_PATH": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    a, b, mode, listed = out.stdout.split(" ", 3)
    directory = os.path.dirname(a[len("ipc://") :])
    assert os.path.dirname(b[len("ipc://") :]) == directory and os.path.dirname(directory) == str(tmp_path)
    assert mode == "0o700" and listed.strip() == repr([os.path.basename(a)])
    assert wait_until_empty(tmp_path, within_s=5) == []


def test_split_rejects_bad_paths_with_a_clear_error():
    assert split_zmq_path("tcp://[::1]:80") == ("tcp", "::1", "80")
    for bad in ("127.0.0.1:80", "tcp://host", "tcp://:80", "udp://x:1", "ipc://"):
        with pytest.raises(ValueError, match="Invalid zmq path"):
            split_zmq_path(bad)


def ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_available(), reason="no IPv6 loopback here")


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("ipc://some_path", ("ipc", "some_path", "")),
        ("inproc://some_identifier", ("inproc", "some_identifier", "")),
        ("tcp://127.0.0.1:5555", ("tcp", "127.0.0.1", "5555")),
        ("tcp://[::1]:5555", ("tcp", "::1", "5555")),
    ],
)
def test_split_zmq_path_and_make_zmq_path_are_inverse(path, parts):
    assert split_zmq_path(path) == parts
    scheme, host, port = parts
    assert make_zmq_path(scheme, host, port or None) == path
    if port:
        assert make_zmq_path(scheme, host, int(port)) == path


@pytest.mark.parametrize("bad", ["invalid_path", "tcp://127.0.0.1", "tcp://[::1]", "tcp://:5555"])
def test_split_zmq_path_rejects_vllms_bad_paths(bad):
    with pytest.raises(ValueError, match="Invalid zmq path"):
        split_zmq_path(bad)


def test_make_zmq_path_and_join_host_port_bracket_ipv6_hosts_only():
    assert make_zmq_path("tcp", "127.0.0.1", "5555") == "tcp://127.0.0.1:5555"
    assert make_zmq_path("tcp", "::1", 5555) == "tcp://[::1]:5555"
    assert make_zmq_path("tcp", "fe80::1%eth0", 1) == "tcp://[fe80::1%eth0]:1"
    assert make_zmq_path("tcp", "localhost", 0) == "tcp://localhost:0"
    assert make_zmq_path("ipc", "/run/x.sock") == "ipc:///run/x.sock"
    assert join_host_port("127.0.0.1", 5555) == "127.0.0.1:5555"
    assert join_host_port("::1", 5555) == "[::1]:5555"
    assert join_host_port("example.org", 80) == "example.org:80"
    assert get_tcp_uri("::1", 5555) == make_zmq_path("tcp", "::1", 5555)


def test_split_host_port_takes_ipv4_names_and_bracketed_ipv6():
    assert split_host_port("127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert split_host_port("localhost:0") == ("localhost", 0)
    assert split_host_port("[::1]:5555") == ("::1", 5555)
    assert split_host_port("[2001:db8::7]:65535") == ("2001:db8::7", 65535)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("127.0.0.1::5555", "one `:`"),
        ("127.0.0.1:5555:", "one `:`"),
        ("::1:5555", "brackets"),
        ("127.0.0.15555", "no `:`"),
        ("127.0.0.1:5555a", "not a number"),
        ("127.0.0.1:", "not a number"),
        ("127.0.0.1:65536", "from 0 to 65535"),
        ("127.0.0.1:-1", "not a number"),
        (":5555", "host is empty"),
        ("[::1]::5555", "not a number"),
        ("[::1]:5555a", "not a number"),
        ("[::1]5555", "`:` right after the `]`"),
        ("[::1:5555", "`:` right after the `]`"),
        ("[]:5555", "host is empty"),
    ],
)
def test_split_host_port_rejects_bad_input_naming_it(text, why):
    with pytest.raises(ValueError) as e:
        split_host_port(text)
    assert isinstance(e.value, HostPortError)
    assert repr(text) in str(e.value) and why in str(e.value)


def test_split_host_port_raises_index_error_where_vllm_does():
    # vLLM raises IndexError for a bracketed host without `:` after it;
    # callers written against vLLM may catch that.
    with pytest.raises(IndexError):
        split_host_port("[::1]5555")


@pytest.mark.parametrize("host", ["127.0.0.1", pytest.param("::1", marks=needs_ipv6)])
def test_joined_address_splits_back_and_reaches_a_real_server(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen()
        text = join_host_port(host, server.getsockname()[1])
        with socket.create_connection(split_host_port(text), timeout=10):
            peer, _ = server.accept()
            peer.close()


@needs_ipv6
def test_make_zmq_path_endpoint_carries_zeromq_traffic_over_ipv6():
    listener = make_zmq_listener(make_zmq_path("tcp", "::1", 0), zmq.PULL)
    scheme, host, port = split_zmq_path(listener.address)
    assert (scheme, host) == ("tcp", "::1") and int(port) > 0
    assert make_zmq_path(scheme, host, int(port)) == listener.address
    ctx = zmq.Context()
    pull = make_zmq_socket(ctx, listener.address, zmq.PULL, listener=listener)
    assert pull.getsockopt(zmq.IPV6) == 1
    push = make_zmq_socket(ctx, make_zmq_path("tcp", "::1", int(port)), zmq.PUSH, linger=0)
    push.send(b"over v6")
    assert pull.poll(10_000)
    assert pull.recv() == b"over v6"
    push.close()
    pull.close(linger=0)
    ctx.term()


def test_get_open_port_from_vllm_port_skips_ports_held_open(monkeypatch):
    held = []
    try:
        monkeypatch.setenv("VLLM_PORT", str(get_open_port()))
        for _ in range(3):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", get_open_port()))  # fails if a held port came back
        assert len({s.getsockname()[1] for s in held}) == 3
    finally:
        for s in held:
            s.close()


def test_listener_resolves_port_zero_and_holds_it():
    listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    port = int(listener.address.rsplit(":", 1)[1])
    assert port > 0
    with socket.socket() as thief, pytest.raises(OSError):
        thief.bind(("127.0.0.1", port))  # nobody can take it before the adopter starts
    listener.cleanup()


@pytest.mark.parametrize("kind", ["tcp4", "tcp6", "ipc", "ipc-abstract"])
def test_adopted_listener_carries_real_zeromq_traffic(kind, tmp_path):
    addr = {
        "tcp4": "tcp://127.0.0.1:0",
        "tcp6": "tcp://[::1]:0",
        "ipc": f"ipc://{tmp_path}/s",
        "ipc-abstract": f"ipc://@vllm-rs-test-{os.getpid()}-{tmp_path.name}",
    }[kind]
    listener = make_zmq_listener(addr, zmq.ROUTER)
    if kind == "ipc-abstract":
        assert listener.address == addr and listener.ipc_path is None  # no file anywhere
    ctx = zmq.Context()
    router = make_zmq_socket(ctx, listener.address, zmq.ROUTER, listener=listener)
    assert listener.socket.fileno() == -1  # libzmq owns the fd now
    dealer = make_zmq_socket(ctx, listener.address, zmq.DEALER, bind=False, identity=b"\x01\x00", linger=0)
    dealer.send(b"hello")
    assert router.poll(10_000)
    assert router.recv_multipart() == [b"\x01\x00", b"hello"]
    router.close(linger=0)
    dealer.close()
    ctx.term()
    listener.cleanup()
    assert not list(tmp_path.iterdir())


def test_ipc_listener_socket_file_is_private_even_with_an_open_umask(tmp_path):
    old = os.umask(0)
    try:
        listener = make_zmq_listener(f"ipc://{tmp_path}/in", zmq.ROUTER)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "in").st_mode) == 0o600
    listener.cleanup()
    assert not (tmp_path / "in").exists()


def test_failed_ipc_listener_leaves_someone_elses_file_alone(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not ours")
    with pytest.raises(OSError):
        make_zmq_listener(f"ipc://{taken}", zmq.PULL)
    assert taken.read_text() == "not ours"


def test_vllm_workers_adopt_a_bare_listening_socket(tmp_path):
    """vLLM's API-server workers pass `client_config["input_listener"]`, a
    plain socket.socket, as `listener=`."""
    listener = make_zmq_listener(f"ipc://{tmp_path}/in", zmq.ROUTER)
    ctx = zmq.Context()
    router = make_zmq_socket(ctx, listener.address, zmq.ROUTER, listener=listener.socket)
    assert listener.socket.fileno() == -1  # libzmq owns the fd now
    dealer = make_zmq_socket(ctx, listener.address, zmq.DEALER, bind=False, identity=b"\x00\x00", linger=0)
    dealer.send(b"over a bare socket")
    assert router.poll(10_000)
    assert router.recv_multipart() == [b"\x00\x00", b"over a bare socket"]
    with pytest.raises(
        TypeError,
        match=f"listener for ipc://{tmp_path}/x: expected a ZmqListener or a listening socket.socket, got int",
    ):
        make_zmq_socket(ctx, f"ipc://{tmp_path}/x", zmq.PULL, listener=7)
    closed = socket.socket(socket.AF_UNIX)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        make_zmq_socket(ctx, f"ipc://{tmp_path}/y", zmq.PULL, listener=closed)
    router.close(linger=0)
    dealer.close()
    ctx.term()
    listener.cleanup()
    assert not list(tmp_path.iterdir())


def test_private_socket_dir_is_0700_and_removes_only_sockets(tmp_path):
    directory = PrivateSocketDir(str(tmp_path))
    assert stat.S_IMODE(os.stat(directory.path).st_mode) == 0o700
    assert directory.endpoint("input-0") == f"ipc://{directory.path}/input-0"
    listener = make_zmq_listener(directory.endpoint("input-0"), zmq.ROUTER)
    listener.close()  # the socket file stays, as after a crash of its owner
    directory.remove()
    assert not list(tmp_path.iterdir())
    kept = PrivateSocketDir(str(tmp_path))
    Path(kept.path, "notes.txt").write_text("a user's file")
    kept.remove()  # never removes what vllm_rs did not put there
    assert Path(kept.path, "notes.txt").read_text() == "a user's file"


def test_socket_dirs_go_to_a_usable_xdg_runtime_dir_only(tmp_path, monkeypatch):
    import tempfile

    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_socket_dir_base() == str(runtime)
    runtime.chmod(0o777)  # others could swap our directory out
    assert default_socket_dir_base() == tempfile.gettempdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert default_socket_dir_base() == tempfile.gettempdir()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket_dir_base() == tempfile.gettempdir()


def test_adopting_a_closed_listener_is_a_clear_error():
    listener = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    listener.close()
    ctx = zmq.Context()
    with pytest.raises(ValueError, match="closed"):
        make_zmq_socket(ctx, listener.address, zmq.PULL, listener=listener)
    ctx.term()


def test_get_open_port_honours_vllm_port(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("", 0))
        taken = busy.getsockname()[1]
        monkeypatch.setenv("VLLM_PORT", str(taken))
        assert get_open_port() > taken
    monkeypatch.setenv("VLLM_PORT", "not-a-port")
    with pytest.raises(ValueError, match="VLLM_PORT"):
        get_open_port()
    monkeypatch.delenv("VLLM_PORT")
    assert 0 < get_open_port() < 65536


def test_constant_list_is_a_read_only_view():
    from vllm_rs.utils import ConstantList

    data = [1, 2, 3]
    view = ConstantList(data)
    data.append(4)
    assert len(view) == 4 and view[1:3] == [2, 3] and 4 in view and view.index(3) == 2
    assert list(view) == [1, 2, 3, 4] and repr(view) == "ConstantList([1, 2, 3, 4])"
    copy = view.copy()
    copy.append(5)
    assert len(view) == 4
    messages = {
        lambda: view.append(1): "Cannot append to a constant list",
        lambda: view.extend([1]): "Cannot extend a constant list",
        lambda: view.insert(0, 1): "Cannot insert into a constant list",
        lambda: view.pop(): "Cannot pop from a constant list",
        lambda: view.remove(1): "Cannot remove from a constant list",
        lambda: view.clear(): "Cannot clear a constant list",
        lambda: view.__setitem__(0, 1): "Cannot set item in a constant list",
        lambda: view.__delitem__(0): "Cannot delete item from a constant list",
    }
    for mutate, message in messages.items():
        with pytest.raises(TypeError) as err:
            mutate()
        assert str(err.value) == message
    assert data == [1, 2, 3, 4]
