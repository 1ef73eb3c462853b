"""`vllm_rs.vllm_patch` under vLLM 0.33's own process layer: processes that
vLLM's managers start die with their supervisor, vLLM's `kill_process_tree`
leaves no survivor, socket files go away."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from tests.compat.vllm_supervisor import sleeping_api_server  # noqa: E402
from tests.support.trees import TREE_SCRIPT, is_running, read_pids, survivors, wait_built  # noqa: E402
from vllm_rs import vllm_patch  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def patched():
    assert vllm_patch.apply() is True
    assert vllm_patch.apply() is True  # idempotent
    return vllm


def test_vllms_names_now_point_at_the_process_core(patched):
    import vllm.utils.system_utils as system_utils
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.utils as v1_utils

    from vllm_rs.process import kill_process_tree
    from vllm_rs.process_managers import shutdown

    assert system_utils.kill_process_tree is kill_process_tree and v1_utils.kill_process_tree is kill_process_tree
    assert v1_utils.shutdown is shutdown and engine_utils.shutdown is shutdown
    assert v1_utils.RustFrontendProcessManager.__module__ == "vllm_rs.vllm_patch"
    assert isinstance(engine_utils.get_mp_context(), vllm_patch.RustCoreContext)


@pytest.mark.parametrize("kind", ["forking", "daemons"])
def test_vllms_kill_process_tree_leaves_no_survivor(patched, tmp_path, kind):
    from vllm.utils.system_utils import kill_process_tree

    from vllm_rs.process import spawn_executable

    pidfile = tmp_path / "pids"
    root = spawn_executable(["sh", str(TREE_SCRIPT), kind, str(pidfile)], name=f"tree-{kind}")
    members = wait_built(pidfile, kind)
    assert all(is_running(pid) for pid in members)
    kill_process_tree(root.pid)
    root.join(10)
    assert root.exitcode == -signal.SIGKILL
    assert survivors(pidfile) == []


def test_vllms_api_server_manager_starts_through_the_core_and_shuts_down(patched, tmp_path):
    import socket

    import zmq
    from vllm.utils.network_utils import make_zmq_listener
    from vllm.v1.utils import APIServerProcessManager

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    inputs = [make_zmq_listener(f"ipc://{tmp_path}/in", zmq.ROUTER)]
    outputs = [make_zmq_listener(f"ipc://{tmp_path}/out", zmq.PULL)]
    manager = APIServerProcessManager("127.0.0.1:0", sock, None, 1, inputs, outputs, target_server_fn=sleeping_api_server)
    try:
        (proc,) = manager.processes
        assert isinstance(proc, vllm_patch.RustCoreProcess) and proc.is_alive() and proc.name == "ApiServer_0"
    finally:
        manager.shutdown(timeout=5)
        sock.close()
    assert proc.exitcode == -signal.SIGTERM
    assert not (tmp_path / "in").exists() and not (tmp_path / "out").exists()


def test_sigkill_of_a_vllm_supervisor_leaves_nothing(tmp_path):
    pidfile, handshake = tmp_path / "pids", tmp_path / "handshake.sock"
    supervisor = subprocess.Popen(
        [sys.executable, str(HERE / "vllm_supervisor.py"), str(pidfile), str(handshake)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Log lines come first; vLLM takes a while to import. EOF: it died.
        lines = iter(supervisor.stdout.readline, "")
        assert any(line.startswith("ready") for line in lines), "the supervisor exited before it was ready"
        deadline = time.monotonic() + 60
        # 2 engines x (engine, child, daemon) + the guardian
        while len(read_pids(pidfile)) < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = read_pids(pidfile)
        assert len(pids) == 7, pids
        assert all(is_running(pid) for pid in pids) and handshake.exists()
    finally:
        supervisor.kill()
        supervisor.wait()
        supervisor.stdout.close()
    time.sleep(1.0)
    assert [pid for pid in pids if is_running(pid)] == []
    assert not handshake.exists()
