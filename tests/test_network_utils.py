"""vllm_rs.network_utils against real sockets and real ZeroMQ peers."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
import zmq

from vllm_rs.network_utils import (
    get_open_port,
    get_open_zmq_ipc_path,
    get_tcp_uri,
    make_zmq_listener,
    make_zmq_socket,
    split_zmq_path,
)
from vllm_rs.utils import get_engine_client_zmq_addr


def test_tcp_uri_and_engine_client_addresses(monkeypatch, tmp_path):
    assert get_tcp_uri("127.0.0.1", 5555) == "tcp://127.0.0.1:5555"
    assert get_tcp_uri("::1", 0) == "tcp://[::1]:0"
    assert get_engine_client_zmq_addr(False, "10.0.0.1") == "tcp://10.0.0.1:0"
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    addr = get_engine_client_zmq_addr(True, "ignored")
    assert addr.startswith(f"ipc://{tmp_path}/")
    uuid.UUID(addr.rsplit("/", 1)[1])
    assert get_open_zmq_ipc_path() != addr


def test_split_rejects_bad_paths_with_a_clear_error():
    assert split_zmq_path("tcp://[::1]:80") == ("tcp", "::1", "80")
    for bad in ("127.0.0.1:80", "tcp://host", "tcp://:80", "udp://x:1", "ipc://"):
        with pytest.raises(ValueError, match="Invalid zmq path"):
            split_zmq_path(bad)


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
