"""The process managers of vllm_rs.utils against real processes, sockets and
ZeroMQ peers: engines, API servers, the Rust frontend launcher, failure
watching, shutdown bounds, die-with-parent and leak-freedom."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
from vllm_rs.network_utils import make_zmq_listener, make_zmq_socket
from vllm_rs.process.core import spawn_executable
from vllm_rs.utils import (
    APIServerProcessManager,
    CoreEngineProcManager,
    RustFrontendProcessManager,
    shutdown,
    wait_for_completion_or_failure,
)

from tests.support.trees import descendants, is_running, read_pids
from tests.support.wait import DEADLINE_S, wait_until
from tests.test_serve import needs_frontend

SUPPORT = Path(__file__).parent / "support"


# ---- targets (module level: pickled by reference, imported by the child) ----


def engine_records_kwargs(vllm_config, **kwargs):
    Path(vllm_config, f"engine{kwargs['dp_rank']}.json").write_text(
        json.dumps({k: v for k, v in kwargs.items() if k != "executor_class"} | {"pid": os.getpid()})
    )
    time.sleep(1000)


def exit_plan(tmp_path: Path, codes: dict[int, int]) -> dict:
    """`codes` (rank or index to exit code) for the targets below, which exit
    once the test gives the go (`go(plan)`: after the manager started them
    all); a child without a code runs until stopped."""
    return {**codes, "go": str(tmp_path / "go")}


def go(plan: dict) -> None:
    """Lets the children of `plan` exit."""
    Path(plan["go"]).touch()


def _exit_on_go(plan: dict, key: int) -> None:
    code = plan.get(key)
    if code is None:
        time.sleep(1000)  # runs until the test stops it
    wait_until(lambda: os.path.exists(plan["go"]), "the test's go")
    sys.exit(code)


def engine_exits_with(vllm_config, dp_rank, **kwargs):
    _exit_on_go(vllm_config, dp_rank)


def api_server_echo(listen_address, sock, args, client_config):
    """Adopts its listeners and answers on them through real ZeroMQ sockets."""
    ctx = zmq.Context()
    from vllm_rs.network_utils import ZmqListener

    inp = ZmqListener(client_config["input_address"], client_config["input_listener"], zmq.ROUTER)
    out = ZmqListener(client_config["output_address"], client_config["output_listener"], zmq.PULL)
    router = make_zmq_socket(ctx, inp.address, zmq.ROUTER, listener=inp)
    pull = make_zmq_socket(ctx, out.address, zmq.PULL, listener=out)
    identity, payload = router.recv_multipart()
    router.send_multipart([identity, payload + f"|{client_config['client_index']}".encode()])
    assert pull.recv() == b"done"
    conn, _ = sock.accept()
    conn.sendall(f"{listen_address}|{client_config['client_count']}".encode())
    conn.close()
    router.close(linger=0)
    pull.close(linger=0)
    ctx.term()


def api_server_exits_with(listen_address, sock, args, client_config):
    _exit_on_go(args.plan, client_config["client_index"])


# ---- CoreEngineProcManager ----


def test_engines_get_names_and_kwargs(tmp_path):
    manager = CoreEngineProcManager(
        engine_records_kwargs, 2, 4, 0, str(tmp_path), True, "tcp://127.0.0.1:5", object, True
    )
    try:
        assert [p.name for p in manager.processes] == ["EngineCore_4", "EngineCore_5"]
        wait_until(lambda: len(list(tmp_path.glob("engine*.json"))) == 2, "both engines to record their kwargs")
        rec = json.loads((tmp_path / "engine5.json").read_text())
        assert rec["dp_rank"] == 5 and rec["local_dp_rank"] == 1
        assert rec["on_head_node"] is True and rec["log_stats"] is True
        assert rec["input_address"] == "tcp://127.0.0.1:5"
        assert rec["pid"] == manager.processes[1].pid
        assert manager.sentinels() == [p.sentinel for p in manager.processes]
        assert manager.finished_procs() == {}
    finally:
        manager.close()
    assert all(p.exitcode == -signal.SIGTERM for p in manager.processes)
    manager.shutdown()  # idempotent


def test_engine_failure_is_named_and_close_removes_the_ipc_file(tmp_path):
    ipc_file = tmp_path / "engine.sock"
    ipc_file.touch()
    plan = exit_plan(tmp_path, {1: 3})
    manager = CoreEngineProcManager(engine_exits_with, 2, 0, 0, plan, True, f"ipc://{ipc_file}", None, False)
    go(plan)
    manager.monitor_engine_liveness()
    assert manager.failed_proc_name == "EngineCore_1"
    assert manager.finished_procs() == {"EngineCore_1": 3}
    manager.shutdown(timeout=2)
    assert not ipc_file.exists()
    assert not any(p.is_alive() for p in manager.processes)


def test_close_leaves_files_alone_for_an_abstract_input_address(tmp_path, monkeypatch):
    """`ipc://@NAME` has no file: a file named `@NAME` in the working
    directory is someone else's."""
    monkeypatch.chdir(tmp_path)
    Path("@engine-input").write_text("not a socket of ours")
    plan = exit_plan(tmp_path, {0: 0})
    manager = CoreEngineProcManager(engine_exits_with, 1, 0, 0, plan, True, "ipc://@engine-input", None, False)
    go(plan)
    manager.join_first()
    manager.close()
    assert Path("@engine-input").read_text() == "not a socket of ours"


def test_join_first_returns_when_an_engine_exits(tmp_path):
    plan = exit_plan(tmp_path, {0: 0})
    manager = CoreEngineProcManager(engine_exits_with, 2, 0, 0, plan, True, "tcp://127.0.0.1:1", None, False)
    go(plan)
    manager.join_first()
    assert manager.finished_procs() == {"EngineCore_0": 0}
    assert manager.failed_proc_name is None
    manager.close()


def test_unpicklable_engine_target_starts_nothing():
    before = set(descendants(os.getpid()))
    with pytest.raises(Exception, match="pickle|local"):
        CoreEngineProcManager(lambda **kw: None, 2, 0, 0, None, True, "tcp://127.0.0.1:1", None, False)
    assert set(descendants(os.getpid())) == before


# ---- wait_for_completion_or_failure ----


def _api_servers(codes, tmp_path):
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    inputs = [make_zmq_listener(f"ipc://{tmp_path}/in{i}", zmq.ROUTER) for i in range(len(codes))]
    outputs = [make_zmq_listener(f"ipc://{tmp_path}/out{i}", zmq.PULL) for i in range(len(codes))]
    args = argparse.Namespace(plan=exit_plan(tmp_path, dict(enumerate(codes))))
    manager = APIServerProcessManager(
        "addr", sock, args, len(codes), inputs, outputs, target_server_fn=api_server_exits_with
    )
    go(args.plan)
    return manager, sock


def test_wait_raises_when_an_api_server_fails(tmp_path, caplog):
    manager, sock = _api_servers([0, 5], tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="vllm_rs"), pytest.raises(RuntimeError) as err:
            wait_for_completion_or_failure(manager)
        proc = manager.processes[1]
        assert str(err.value) == f"Process ApiServer_1 (PID: {proc.pid}) died with exit code 5"
        assert "Waiting for API servers to complete ..." in caplog.text
        assert "Exception occurred while running API servers" in caplog.text
    finally:
        manager.shutdown()
        sock.close()
    assert [path.name for path in tmp_path.iterdir()] == ["go"]  # ipc socket files removed


def test_wait_returns_when_all_api_servers_exit_cleanly(tmp_path):
    manager, sock = _api_servers([0, 0], tmp_path)
    engines = CoreEngineProcManager(engine_exits_with, 1, 0, 0, {}, True, "tcp://127.0.0.1:1", None, False)
    try:
        wait_for_completion_or_failure(manager, engines)
        assert all(p.exitcode == 0 for p in manager.processes)
    finally:
        manager.shutdown()
        engines.close()
        sock.close()


def test_wait_raises_as_soon_as_an_engine_dies(tmp_path):
    api_manager, sock = _long_api_server(tmp_path)
    plan = exit_plan(tmp_path, {1: 9})
    engines = CoreEngineProcManager(engine_exits_with, 2, 0, 0, plan, True, "tcp://127.0.0.1:1", None, False)
    go(plan)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"^Engine core process EngineCore_1 died unexpectedly\.$"):
            wait_for_completion_or_failure(api_manager, engines)
        assert time.monotonic() - started < 30
    finally:
        api_manager.shutdown()
        engines.close()
        sock.close()


def api_server_sleeps(listen_address, sock, args, client_config):
    time.sleep(1000)


def _long_api_server(tmp_path):
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    inp = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
    out = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    manager = APIServerProcessManager(
        "addr", sock, argparse.Namespace(), 1, [inp], [out], target_server_fn=api_server_sleeps
    )
    return manager, sock


def test_keyboard_interrupt_while_waiting_is_logged_and_returns(tmp_path, caplog):
    manager, sock = _long_api_server(tmp_path)
    waiting = threading.Event()

    class OnWaiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "Waiting for API servers to complete ...":
                waiting.set()

    def interrupt_once_waiting() -> None:
        if waiting.wait(DEADLINE_S):
            os.kill(os.getpid(), signal.SIGINT)

    handler = OnWaiting()
    logging.getLogger("vllm_rs").addHandler(handler)
    interrupter = threading.Thread(target=interrupt_once_waiting, daemon=True)
    # Python's own SIGINT handler, also where this run started with SIGINT
    # ignored (a background job of a shell without job control): there the
    # signal would be dropped and the wait would last as long as the server.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter.start()
        with caplog.at_level(logging.INFO, logger="vllm_rs"):
            wait_for_completion_or_failure(manager)
        assert "Received KeyboardInterrupt, shutting down API servers..." in caplog.text
    finally:
        signal.signal(signal.SIGINT, inherited)
        logging.getLogger("vllm_rs").removeHandler(handler)  # nothing else sets `waiting`
        interrupter.join(DEADLINE_S)
        manager.shutdown()
        sock.close()


# ---- APIServerProcessManager ----


def test_api_servers_adopt_their_listeners_over_real_zeromq(tmp_path, caplog):
    import socket

    http = socket.socket()
    http.bind(("127.0.0.1", 0))
    http.listen()
    inputs = [
        make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER),
        make_zmq_listener(f"ipc://{tmp_path}/in1", zmq.ROUTER),
    ]
    outputs = [make_zmq_listener("tcp://[::1]:0", zmq.PULL), make_zmq_listener(f"ipc://{tmp_path}/out1", zmq.PULL)]
    addresses = [(i.address, o.address) for i, o in zip(inputs, outputs)]
    with caplog.at_level(logging.INFO, logger="vllm_rs"):
        manager = APIServerProcessManager(
            "http://addr", http, argparse.Namespace(), 2, inputs, outputs, target_server_fn=api_server_echo
        )
    assert "Started 2 API server processes" in caplog.text
    assert all(lst.socket.fileno() == -1 for lst in inputs + outputs)  # parent copies closed
    ctx = zmq.Context()
    try:
        for index, (in_addr, out_addr) in enumerate(addresses):
            dealer = make_zmq_socket(ctx, in_addr, zmq.DEALER, bind=False, identity=b"\x00\x00", linger=0)
            push = make_zmq_socket(ctx, out_addr, zmq.PUSH, linger=0)
            dealer.send(b"ping")
            assert dealer.poll(60_000), f"API server {index} did not answer"
            assert dealer.recv() == f"ping|{index}".encode()
            push.send(b"done")
            with socket.create_connection(http.getsockname(), timeout=60) as c:
                assert c.recv(100) == b"http://addr|2"
            dealer.close()
            push.close()
        for proc in manager.processes:
            proc.join(60)
            assert proc.exitcode == 0
    finally:
        manager.shutdown()
        ctx.term()
        http.close()
    assert not list(tmp_path.iterdir())


def _echo_behind_api_servers(num_servers: int):
    """The echo engine and `num_servers` API servers with the default target
    (`run_api_server_worker_proc`, the Rust frontend), on loopback TCP."""
    import socket

    from vllm_rs.engine import make_engine_config, run_engine_core
    from vllm_rs.engine.config import ClientAddresses

    http = socket.socket()
    http.bind(("127.0.0.1", 0))
    http.listen()
    inputs = [make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER) for _ in range(num_servers)]
    outputs = [make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL) for _ in range(num_servers)]
    config = make_engine_config(
        "echo", clients=[ClientAddresses(i.address, o.address) for i, o in zip(inputs, outputs)]
    )
    engines = CoreEngineProcManager(run_engine_core, 1, 0, 0, config, True, inputs[0].address, None, True)
    args = argparse.Namespace(model="echo", data_parallel_size=1)
    port = http.getsockname()[1]
    try:
        manager = APIServerProcessManager(f"http://127.0.0.1:{port}", http, args, num_servers, inputs, outputs)
    except BaseException:
        engines.shutdown()
        raise
    finally:
        http.close()
    return manager, engines, port


@needs_frontend
def test_the_default_api_server_is_the_rust_frontend_serving_the_engines():
    import psutil

    from tests.support.http import request

    manager, engines, port = _echo_behind_api_servers(1)
    try:
        (proc,) = manager.processes
        assert proc.name == "ApiServer_0"

        def healthy() -> bool:
            assert proc.is_alive(), "the API server exited"
            try:
                return request("GET", port, "/health", timeout_s=5)[0] == 200
            except OSError:
                return False

        wait_until(healthy, "the API server to serve")
        assert psutil.Process(proc.pid).name() == "vllm-rs"  # the child became the frontend (exec)
        status, body = request("POST", port, "/v1/completions", {"model": "echo", "prompt": "hi", "max_tokens": 3})
        assert (status, body["choices"][0]["text"]) == (200, "hih"), body
    finally:
        manager.shutdown()
        engines.shutdown()


@needs_frontend
def test_more_than_one_default_api_server_fails_naming_the_one_frontend(capfd):
    manager, engines, _port = _echo_behind_api_servers(2)
    try:
        with pytest.raises(RuntimeError, match=r"Process ApiServer_\d \(PID: \d+\) died with exit code 1"):
            wait_for_completion_or_failure(manager)
    finally:
        manager.shutdown()
        engines.shutdown()
    assert "client_count 2: one Rust frontend serves every engine" in capfd.readouterr().err


def test_api_server_start_failure_cleans_up_listeners(tmp_path):
    inputs = [make_zmq_listener(f"ipc://{tmp_path}/in0", zmq.ROUTER)]
    outputs = [make_zmq_listener(f"ipc://{tmp_path}/out0", zmq.PULL)]
    with pytest.raises(ValueError, match="num_servers=2"):
        APIServerProcessManager("a", None, argparse.Namespace(), 2, inputs, outputs, target_server_fn=api_server_sleeps)
    assert not list(tmp_path.iterdir())
    assert inputs[0].socket.fileno() == -1


# ---- RustFrontendProcessManager (with a stand-in executable) ----

STAND_IN = """#!{python}
import json, os, sys, time
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
listed = [fd for fd in range(1024) if is_open(fd)]
with open({out!r} + ".part", "w") as f:
    json.dump({{"argv": sys.argv, "fds": listed, "api_key": os.environ.get("VLLM_API_KEY"), "hf_token": os.environ.get("HF_TOKEN")}}, f)
os.rename({out!r} + ".part", {out!r})  # the reader sees all of it or nothing
time.sleep(1000)
"""


def test_rust_frontend_manager_command_line_fds_and_redaction(tmp_path, caplog, monkeypatch):
    import socket

    out = tmp_path / "launch.json"
    binary = tmp_path / "vllm-rs"
    binary.write_text(STAND_IN.format(python=sys.executable, out=str(out)))
    binary.chmod(0o755)
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "42")
    http = socket.socket()
    http.bind(("127.0.0.1", 0))
    http.listen()
    inp = make_zmq_listener(f"ipc://{tmp_path}/in.sock", zmq.ROUTER)
    outp = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    fds = [http.fileno(), inp.socket.fileno(), outp.socket.fileno()]
    args = argparse.Namespace(
        model="toy", api_key="sk-secret", hf_token="hf-secret", api_server_count=4, port=8000, max_model_len=64
    )
    with caplog.at_level(logging.INFO, logger="vllm_rs"):
        manager = RustFrontendProcessManager(str(binary), http, args, inp, outp, 0, 2, 2)
    try:
        assert [p.name for p in manager.processes] == ["RustFrontend"]
        wait_until(out.exists, "the frontend stand-in to record its launch", 30)
        launch = json.loads(out.read_text())
        argv = launch["argv"]
        assert argv[1:15] == [
            "frontend",
            "--listen-fd", str(fds[0]),
            "--input-listener-fd", str(fds[1]),
            "--output-listener-fd", str(fds[2]),
            "--engine-start-index", "0",
            "--engine-count", "2",
            "--data-parallel-size", "2",
            "--args-json",
        ]  # fmt: skip
        payload = json.loads(argv[15])
        assert payload == {  # no api_key: command lines are world-readable
            "engine_ready_timeout_secs": 42,
            "http_timeout_keep_alive": 5,
            "max_model_len": 64,
            # `--model` has no default now (serve picks the packaged model), so it differs.
            "model": "toy",
            "model_tag": "toy",
        }
        assert argv[15] == json.dumps(payload, sort_keys=True)
        assert launch["fds"] == sorted({0, 1, 2, *fds})  # exactly stdio and the three
        assert (launch["api_key"], launch["hf_token"]) == ("sk-secret", "hf-secret")  # in its environment only
        cmdline = Path(f"/proc/{manager.processes[0].pid}/cmdline").read_bytes()
        assert b"sk-secret" not in cmdline and b"hf-secret" not in cmdline
        assert (
            "sk-secret" not in caplog.text
            and "hf-secret" not in caplog.text
            and "Launching Rust frontend:" in caplog.text
        )
        assert inp.socket.fileno() == -1 and outp.socket.fileno() == -1
    finally:
        started = time.monotonic()
        manager.shutdown(timeout=0.1)  # at least 5 s grace, but SIGTERM ends the stand-in at once
        assert time.monotonic() - started < 5
        http.close()
    assert manager.processes[0].exitcode == -signal.SIGTERM
    assert not (tmp_path / "in.sock").exists()


def test_rust_frontend_manager_missing_binary_cleans_up(tmp_path):
    import socket

    http = socket.socket()
    inp = make_zmq_listener(f"ipc://{tmp_path}/in.sock", zmq.ROUTER)
    outp = make_zmq_listener(f"ipc://{tmp_path}/out.sock", zmq.PULL)
    with pytest.raises(FileNotFoundError, match="no-such-binary"):
        RustFrontendProcessManager(
            str(tmp_path / "no-such-binary"), http, argparse.Namespace(model="m"), inp, outp, 0, 1, 1
        )
    assert not list(tmp_path.iterdir())
    http.close()


def _patched_vllm_manager(monkeypatch) -> type:
    """`vllm_patch`'s manager for vLLM, built on stand-ins for the three vLLM
    names it uses (vLLM itself is not installed here; tests/compat runs it
    against vLLM's own)."""
    import types

    from vllm_rs import vllm_patch
    from vllm_rs.process.shutdown import shutdown_and_cleanup_listeners, shutdown_subprocesses
    from vllm_rs.serving.cli_args import redact_sensitive_args

    startup = types.ModuleType("vllm.entrypoints.common.startup")
    startup.jsonify_non_default_args = lambda args, *, exclude=None: {
        key: value for key, value in vars(args).items() if key not in (exclude or ()) and value is not None
    }
    startup.redact_sensitive_args = redact_sensitive_args
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.common.startup", startup)
    vllm_utils = types.SimpleNamespace(
        logger=logging.getLogger("vllm_rs.tests.vllm"),
        _shutdown_subprocesses_and_cleanup_listeners=lambda procs, listeners, timeout=None: (
            shutdown_and_cleanup_listeners(procs, listeners, timeout, shutdown_subprocesses)
        ),
    )
    vllm_envs = types.SimpleNamespace(VLLM_ENGINE_READY_TIMEOUT_S=600, VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5)
    return vllm_patch._make_rust_frontend_manager(vllm_utils, vllm_envs)


@pytest.mark.parametrize("keys", [["sk-one"], ["sk-one", "sk-two"]])
@pytest.mark.parametrize("entry_point", ["vllm_rs.utils", "vllm_patch"])
def test_rust_frontend_manager_follows_the_one_api_key_rule(tmp_path, monkeypatch, caplog, keys, entry_point):
    """vLLM 0.33 passes every key to its Rust frontend in `--args-json`; one
    key goes in the environment instead (`VLLM_API_KEY`), several stay in
    `--args-json`, with a warning (`frontend_secrets`), whether the manager
    is this package's or vLLM's patched one."""
    import socket

    from vllm_rs.process import rust_frontend

    manager_class = RustFrontendProcessManager if entry_point == "vllm_rs.utils" else _patched_vllm_manager(monkeypatch)
    spawned = {}

    class Exited:
        name, pid, exitcode = "RustFrontend", 4321, 0

        def is_alive(self):
            return False

    def fake_spawn_executable(cmd, *, name, env=None, pass_fds=()):
        spawned.update(cmd=list(cmd), env=env)
        return Exited()

    monkeypatch.setattr(rust_frontend, "spawn_executable", fake_spawn_executable)
    http = socket.socket()
    inp = make_zmq_listener(f"ipc://{tmp_path}/in.sock", zmq.ROUTER)
    outp = make_zmq_listener(f"ipc://{tmp_path}/out.sock", zmq.PULL)
    args = argparse.Namespace(model="m", api_key=keys)
    try:
        with caplog.at_level(logging.WARNING, logger="vllm_rs"):
            manager_class(sys.executable, http, args, inp, outp, 0, 1, 1).shutdown()
    finally:
        http.close()
    args_json = json.loads(spawned["cmd"][spawned["cmd"].index("--args-json") + 1])
    if len(keys) == 1:
        assert "api_key" not in args_json and spawned["env"]["VLLM_API_KEY"] == "sk-one"
        assert not any("sk-one" in arg for arg in spawned["cmd"])
        assert "API keys" not in caplog.text
    else:
        assert args_json["api_key"] == keys and spawned["env"] is None
        assert "2 API keys: the environment (VLLM_API_KEY) holds one" in caplog.text
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("api_key", [12345, ["sk-one", 2]])
def test_rust_frontend_manager_refuses_an_api_key_that_is_not_a_string(tmp_path, api_key):
    import socket

    http = socket.socket()
    inp = make_zmq_listener(f"ipc://{tmp_path}/in.sock", zmq.ROUTER)
    outp = make_zmq_listener(f"ipc://{tmp_path}/out.sock", zmq.PULL)
    args = argparse.Namespace(model="m", api_key=api_key)
    with pytest.raises(ValueError, match=r"api_key: expected a non-empty string, got (int|list)"):
        RustFrontendProcessManager(sys.executable, http, args, inp, outp, 0, 1, 1)
    assert not list(tmp_path.iterdir())
    http.close()


# ---- shutdown bounds, die-with-parent, leak-freedom ----


def test_shutdown_of_16_sigterm_ignoring_children_is_bounded(caplog):
    procs, readers = [], []
    for i in range(16):
        r, w = os.pipe()
        procs.append(
            spawn_executable(
                ["bash", "-c", f"trap '' TERM; echo ready >&{w}; exec sleep 1000"], name=f"stubborn{i}", pass_fds=[w]
            )
        )
        os.close(w)
        readers.append(r)
    for r in readers:
        assert os.read(r, 10) == b"ready\n"
        os.close(r)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="vllm_rs"):
        shutdown(procs, timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 1 + 5, elapsed  # the timeout plus the kill, with a generous bound
    assert elapsed >= 0.9
    assert all(p.exitcode == -signal.SIGKILL for p in procs)
    assert "[shutdown] Process manager: send sigterm to process stubborn0" in caplog.text
    assert "[shutdown] Process manager: force killing remaining processes count=16" in caplog.text
    assert f"[shutdown] Process manager: force killing remaining process stubborn3 pid {procs[3].pid}" in caplog.text


def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _resources() -> tuple[int, int, list[int]]:
    """Open fds, OS threads, and the process table below us (after a GC)."""
    gc.collect()
    return len(os.listdir("/proc/self/fd")), _threads(), sorted(descendants(os.getpid()))


def test_200_spawn_and_shutdown_cycles_leave_no_trace():
    spawn_executable(["true"], name="warmup").join(10)  # the guardian starts once
    before = _resources()
    for i in range(200):
        proc = spawn_executable(["sleep", "100"], name=f"cycle{i}")
        shutdown([proc], timeout=5)
        assert proc.exitcode == -signal.SIGTERM
    del proc
    assert _resources() == before


def test_engine_manager_cycles_leave_no_trace(tmp_path):
    CoreEngineProcManager(engine_exits_with, 1, 0, 0, {}, True, "tcp://127.0.0.1:1", None, False).close()
    before = _resources()
    for _ in range(5):
        manager = CoreEngineProcManager(engine_exits_with, 2, 0, 0, {}, True, f"ipc://{tmp_path}/x", None, False)
        manager.shutdown(timeout=5)
    del manager
    assert _resources() == before


def _guardian_of(pid: int) -> int:
    """Pid of the one guardian of `pid`: its only child (every other process
    it starts is a child of the guardian)."""
    children = [
        int(c)
        for t in os.listdir(f"/proc/{pid}/task")
        for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()
    ]
    assert len(children) == 1, children
    return children[0]


def _wait_for_exit(pidfd: int, timeout: float = 60.0) -> None:
    """Waits until the process behind `pidfd` (opened while it ran, so never
    a reused pid) has exited, and closes the fd."""
    try:
        assert select.select([pidfd], [], [], timeout)[0] == [pidfd], f"still running after {timeout} s"
    finally:
        os.close(pidfd)


def test_sigkill_of_the_supervisor_takes_every_descendant_along(tmp_path):
    pidfile = tmp_path / "pids"
    supervisor = subprocess.Popen([sys.executable, str(SUPPORT / "supervisor.py"), str(pidfile)])
    try:
        # 2 engines x (engine, child, daemon) + the guardian
        wait_until(lambda: len(read_pids(pidfile)) >= 7, "every process of the supervisor to start")
        pids = read_pids(pidfile)
        assert len(pids) == 7, pids
        assert all(is_running(pid) for pid in pids)
        guardian = os.pidfd_open(_guardian_of(supervisor.pid))
    finally:
        supervisor.kill()
        supervisor.wait()
    # The guardian exits only once it has killed and reaped everything below it.
    _wait_for_exit(guardian)
    assert [pid for pid in pids if is_running(pid)] == []


SOCKET_FILES_THEN_WAIT = """
import socket, sys, time, zmq
from vllm_rs import _core
from vllm_rs.network_utils import make_zmq_listener
from vllm_rs.process.core import remove_on_exit
listener = make_zmq_listener(sys.argv[1], zmq.ROUTER)
uds = socket.socket(socket.AF_UNIX)
uds.bind(sys.argv[2])
remove_on_exit(sys.argv[2])
print(_core.guardian_pid(), flush=True)
time.sleep(1000)
"""


def _run_until_killed(code: str, *args: str) -> None:
    """Runs `code` in a fresh interpreter until it prints its guardian's pid,
    SIGKILLs it, and waits until that guardian has finished its exit work."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        guardian = os.pidfd_open(int(proc.stdout.readline()))
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    _wait_for_exit(guardian)


def test_socket_files_go_even_when_their_creator_is_sigkilled(tmp_path):
    ipc_file, uds_file = tmp_path / "engine-input", tmp_path / "http.sock"
    _run_until_killed(SOCKET_FILES_THEN_WAIT, f"ipc://{ipc_file}", str(uds_file))
    assert not ipc_file.exists() and not uds_file.exists()


REGISTER_THEN_SIGKILL_SELF = """
import os, signal, socket, sys
from vllm_rs import _core
from vllm_rs.process.core import remove_on_exit
paths = [os.path.join(sys.argv[1], f"s{i}.sock") for i in range(20)]
socks = [socket.socket(socket.AF_UNIX) for _ in paths]
for sock, path in zip(socks, paths):
    sock.bind(path)
remove_on_exit(paths[0])
print(_core.guardian_pid(), flush=True)
sys.stdin.readline()
for path in paths[1:]:
    remove_on_exit(path)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_registration_holds_as_soon_as_remove_on_exit_returns(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", REGISTER_THEN_SIGKILL_SELF, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        guardian = os.pidfd_open(int(proc.stdout.readline()))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    _wait_for_exit(guardian)
    assert list(tmp_path.iterdir()) == []


PRIVATE_DIRECTORIES_THEN_WAIT = """
import os, socket, sys, time
from vllm_rs import _core
from vllm_rs.process.core import remove_on_exit
socks = []
for name in ("private", "kept"):
    directory = os.path.join(sys.argv[1], name)
    os.mkdir(directory, 0o700)
    remove_on_exit(directory)
    for sock_name in ("registered.sock", "unregistered.sock"):
        socks.append(socket.socket(socket.AF_UNIX))
        socks[-1].bind(os.path.join(directory, sock_name))
    remove_on_exit(os.path.join(directory, "registered.sock"))
with open(os.path.join(sys.argv[1], "kept", "notes.txt"), "w") as f:
    f.write("the user's")
print(_core.guardian_pid(), flush=True)
time.sleep(1000)
"""


def test_a_registered_directory_goes_with_its_sockets_but_never_with_other_files(tmp_path):
    _run_until_killed(PRIVATE_DIRECTORIES_THEN_WAIT, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    # Registered files go in any case; a directory holding a regular file stays as it is.
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt", "unregistered.sock"]
    assert (tmp_path / "kept" / "notes.txt").read_text() == "the user's"


CANCELLED_THEN_WAIT = """
import socket, sys, time
from vllm_rs import _core
from vllm_rs.process.core import cancel_remove_on_exit, remove_on_exit
uds = socket.socket(socket.AF_UNIX)
uds.bind(sys.argv[1])
remove_on_exit(sys.argv[1])
cancel_remove_on_exit(sys.argv[1])
print(_core.guardian_pid(), flush=True)
time.sleep(1000)
"""


def test_a_cancelled_registration_leaves_the_path_alone(tmp_path):
    path = tmp_path / "cancelled.sock"
    _run_until_killed(CANCELLED_THEN_WAIT, str(path))
    assert path.exists()


REPLACE_AFTER_REGISTERING = """
import os, socket, sys
from vllm_rs import _core
from vllm_rs.process.core import remove_on_exit
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
remove_on_exit(sys.argv[1])
print(_core.guardian_pid(), flush=True)
sys.stdin.readline()
os.unlink(sys.argv[1])
with open(sys.argv[1], "w") as f:
    f.write("someone else")
"""


def test_remove_on_exit_spares_a_new_file_at_the_same_path(tmp_path):
    path = tmp_path / "reused.sock"
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLACE_AFTER_REGISTERING, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        guardian = os.pidfd_open(int(proc.stdout.readline()))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    _wait_for_exit(guardian)  # it has run its exit work
    assert path.read_text() == "someone else"
