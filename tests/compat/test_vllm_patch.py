"""`vllm_rs.vllm_patch` under vLLM 0.33's own process layer: processes that
vLLM's managers start die with their supervisor, vLLM's `kill_process_tree`
leaves no survivor, socket files go away."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from vllm_rs import vllm_patch  # noqa: E402

from tests.compat.vllm_supervisor import sleeping_api_server  # noqa: E402
from tests.support.trees import TREE_SCRIPT, is_running, read_pids, survivors, wait_built  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

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
    from vllm_rs.process import rust_frontend
    from vllm_rs.process.core import kill_process_tree
    from vllm_rs.process.shutdown import shutdown

    assert system_utils.kill_process_tree is kill_process_tree and v1_utils.kill_process_tree is kill_process_tree
    assert v1_utils.shutdown is shutdown and engine_utils.shutdown is shutdown
    assert v1_utils.RustFrontendProcessManager.__module__ == "vllm_rs.vllm_patch"
    assert issubclass(v1_utils.RustFrontendProcessManager, rust_frontend.RustFrontendProcessManager)  # one launch
    assert isinstance(engine_utils.get_mp_context(), vllm_patch.RustCoreContext)


@pytest.mark.parametrize("kind", ["forking", "daemons"])
def test_vllms_kill_process_tree_leaves_no_survivor(patched, tmp_path, kind):
    from vllm.utils.system_utils import kill_process_tree
    from vllm_rs.process.core import spawn_executable

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
    manager = APIServerProcessManager(
        "127.0.0.1:0", sock, None, 1, inputs, outputs, target_server_fn=sleeping_api_server
    )
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
        # 2 engines x (engine, child, daemon) + the guardian
        wait_until(lambda: len(read_pids(pidfile)) >= 7, "every process of the supervisor to start")
        pids = read_pids(pidfile)
        assert len(pids) == 7, pids
        assert all(is_running(pid) for pid in pids) and handshake.exists()
    finally:
        supervisor.kill()
        supervisor.wait()
        supervisor.stdout.close()
    # The guardian kills the tree and removes the socket once the supervisor is gone.
    wait_until(
        lambda: not [pid for pid in pids if is_running(pid)] and not handshake.exists(),
        "the guardian to kill the tree and remove the socket",
    )


@contextlib.contextmanager
def vllms_rust_frontend_serving_echo(tmp_path, argv=()):
    """vLLM's own parser (`vllm serve echo ... *argv`) and (patched)
    RustFrontendProcessManager start this project's frontend binary in front
    of the reference engine; yields (manager, port) once /health answers."""
    import http.client
    import socket

    import zmq
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.network_utils import make_zmq_listener
    from vllm.v1.utils import RustFrontendProcessManager
    from vllm_rs.engine import make_engine_config, run_engine_core
    from vllm_rs.engine.config import ClientAddresses
    from vllm_rs.serving.frontend_binary import frontend_binary
    from vllm_rs.utils import CoreEngineProcManager

    try:
        binary = frontend_binary()
    except FileNotFoundError as e:
        pytest.skip(f"no vllm-rs binary (set VLLM_RS_FRONTEND_PATH): {e}")
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(["echo", "--max-model-len", "64", *argv])
    args.model = args.model_tag
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    inp = make_zmq_listener(f"ipc://{tmp_path}/input", zmq.ROUTER)
    out = make_zmq_listener(f"ipc://{tmp_path}/output", zmq.PULL)
    config = make_engine_config("echo", max_model_len=64, clients=[ClientAddresses(inp.address, out.address)])
    engines = CoreEngineProcManager(run_engine_core, 1, 0, 0, config, True, inp.address, None, True)
    frontend = None
    try:
        frontend = RustFrontendProcessManager(binary, sock, args, inp, out, 0, 1, 1)

        def healthy() -> bool:  # /health answers once the engine has registered
            assert frontend.processes[0].is_alive(), "the frontend exited"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()

        wait_until(healthy, "the frontend to become healthy")
        yield frontend, port
    finally:
        if frontend is not None:
            frontend.shutdown(timeout=5)
        engines.shutdown(timeout=10)
        sock.close()


def test_vllms_rust_frontend_manager_serves_our_engine_through_the_core(patched, tmp_path):
    import openai
    from vllm_rs.process.core import Process

    with vllms_rust_frontend_serving_echo(tmp_path) as (frontend, port):
        assert isinstance(frontend.processes[0], Process) and frontend.processes[0].name == "RustFrontend"
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        completion = client.completions.create(model="echo", prompt="hello", max_tokens=7)
        assert completion.choices[0].text == "hellohe" and completion.choices[0].finish_reason == "length"
        client.close()
    assert frontend.processes[0].exitcode == 0
    assert not (tmp_path / "input").exists() and not (tmp_path / "output").exists()


def test_vllms_rust_frontend_manager_keeps_the_api_key_off_the_command_line(patched, tmp_path):
    """`vllm serve --api-key KEY`: the key reaches the frontend in its
    environment; its /proc/PID/cmdline holds no key, yet it enforces it."""
    import http.client

    key = "sk-compat-SECRET-7f3a"

    def status(headers):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/v1/models", headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    with vllms_rust_frontend_serving_echo(tmp_path, ["--api-key", key]) as (frontend, port):
        cmdline = Path(f"/proc/{frontend.processes[0].pid}/cmdline").read_bytes()
        assert b"--args-json" in cmdline and key.encode() not in cmdline
        assert status({}) == 401
        assert status({"Authorization": "Bearer wrong"}) == 401
        assert status({"Authorization": f"Bearer {key}"}) == 200


PLUGIN_PROBE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.utils
print("shutdown from", vllm.v1.utils.shutdown.__module__)
"""


@pytest.mark.parametrize(("switch", "expected"), [("1", "vllm_rs.process.shutdown"), ("0", "vllm.v1.utils")])
def test_vllms_plugin_loader_applies_the_declared_entry_point(tmp_path, switch, expected):
    """vLLM's own `load_general_plugins` in a fresh interpreter, with the
    entry point from pyproject.toml installed as package metadata."""
    import os

    import tomllib

    declared = tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())["project"]["entry-points"]
    dist_info = tmp_path / "vllm_rs_entry_points-0.0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-rs-entry-points\nVersion: 0.0.0\n")
    lines = ["[vllm.general_plugins]", *(f"{k} = {v}" for k, v in declared["vllm.general_plugins"].items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    env = os.environ | {"VLLM_RS_PATCH": switch}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    probe = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert f"shutdown from {expected}" in probe.stdout, probe.stdout[-2000:]


@pytest.mark.parametrize("keys", [["sk-one"], ["sk-one", "sk-two"]])
def test_vllms_rust_frontend_manager_passes_one_key_in_the_environment(patched, monkeypatch, caplog, keys):
    """One key: `VLLM_API_KEY` in the child's environment, none in
    `--args-json`. Several: vLLM's `--args-json`, with a warning."""
    import json
    import socket

    import vllm_rs.process.rust_frontend
    import zmq
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.network_utils import make_zmq_listener
    from vllm.v1.utils import RustFrontendProcessManager

    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(["echo", "--api-key", *keys])
    spawned = {}

    class Exited:
        name, pid, exitcode = "RustFrontend", 4321, 0

        def is_alive(self):
            return False

    def fake_spawn_executable(cmd, *, name, env=None, pass_fds=()):
        spawned.update(cmd=list(cmd), env=env)
        return Exited()

    monkeypatch.setattr(vllm_rs.process.rust_frontend, "spawn_executable", fake_spawn_executable)
    sock = socket.socket()
    inp = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
    out = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    try:
        with caplog.at_level("WARNING"):
            RustFrontendProcessManager("/nonexistent/vllm-rs", sock, args, inp, out, 0, 1, 1).shutdown()
    finally:
        sock.close()
    args_json = json.loads(spawned["cmd"][spawned["cmd"].index("--args-json") + 1])
    if len(keys) == 1:
        assert "api_key" not in args_json and spawned["env"]["VLLM_API_KEY"] == "sk-one"
        assert not any("sk-one" in arg for arg in spawned["cmd"])
    else:
        assert args_json["api_key"] == keys and spawned["env"] is None
        assert "2 API keys" in caplog.text
