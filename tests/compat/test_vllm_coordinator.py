"""Data parallelism against vLLM 0.33's own coordinator: vLLM's
`DPCoordinator` process (pure ZeroMQ, no GPU needed) coordinates two of
this project's reference engines, and vLLM's `RustFrontendProcessManager`
starts this project's `vllm-rs` binary with vLLM's `--coordinator-address`.
The `openai` client's requests reach both engines, and vLLM's coordinator
publishes both engines' counts and moves the request wave."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from tests.support.wait import wait_until  # noqa: E402
from tests.test_serve_dp import CoordinatorWatch  # noqa: E402

HEALTH_TIMEOUT_S = 60


def wait_healthy(port: int, frontend) -> None:
    def healthy() -> bool:  # /health answers once both engines registered
        assert frontend.processes[0].is_alive(), "the frontend exited"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    wait_until(healthy, "the frontend to become healthy", HEALTH_TIMEOUT_S)


def post(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path)
        return conn.getresponse().status
    finally:
        conn.close()


@contextlib.contextmanager
def vllms_coordinator_with_our_stack(tmp_path):
    """vLLM's DPCoordinator, two reference engines, and our binary started by
    vLLM's RustFrontendProcessManager; yields (front publish address, port)."""
    import zmq
    from vllm.config import ParallelConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.network_utils import make_zmq_listener
    from vllm.v1.engine.coordinator import DPCoordinator
    from vllm.v1.utils import RustFrontendProcessManager
    from vllm_rs.engine import make_engine_config, run_engine_core
    from vllm_rs.engine.config import ClientAddresses, CoordinatorAddresses
    from vllm_rs.serving.frontend_binary import frontend_binary
    from vllm_rs.utils import CoreEngineProcManager

    try:
        binary = frontend_binary()
    except FileNotFoundError as e:
        pytest.skip(f"no vllm-rs binary (set VLLM_RS_FRONTEND_PATH): {e}")
    coordinator = DPCoordinator(ParallelConfig(data_parallel_size=2), enable_wave_coordination=True)
    front = coordinator.get_stats_publish_address()
    engine_publish, engine_output = coordinator.get_engine_socket_addresses()
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(["echo", "--max-model-len", "64", "--data-parallel-size", "2"])
    args.model = args.model_tag
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    inp = make_zmq_listener(f"ipc://{tmp_path}/input", zmq.ROUTER)
    out = make_zmq_listener(f"ipc://{tmp_path}/output", zmq.PULL)
    config = make_engine_config(
        "echo", max_model_len=64, data_parallel_size=2, clients=[ClientAddresses(inp.address, out.address)]
    )
    config.coordinator = CoordinatorAddresses(engine_publish, engine_output, front)
    engines = frontend = None
    try:
        engines = CoreEngineProcManager(run_engine_core, 2, 0, 0, config, True, inp.address, None, True)
        frontend = RustFrontendProcessManager(binary, sock, args, inp, out, 0, 2, 2, stats_update_address=front)
        wait_healthy(port, frontend)
        yield front, port
        assert frontend.processes[0].is_alive(), "the frontend died"
    finally:
        if frontend is not None:
            frontend.shutdown(timeout=5)
        if engines is not None:
            engines.shutdown(timeout=10)
        coordinator.shutdown(timeout=5)
        # vLLM's coordinator binds ipc sockets at fresh paths in the temp dir
        # and leaves them behind when it stops: this test removes them.
        for address in (front, engine_publish, engine_output):
            if address.startswith("ipc://"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address.removeprefix("ipc://"))
        sock.close()


def test_our_frontend_and_engines_with_vllms_coordinator(tmp_path):
    import openai

    with vllms_coordinator_with_our_stack(tmp_path) as (front, port):
        assert front.startswith("ipc://")  # vLLM's format for a coordinator next to its frontends
        watch = CoordinatorWatch(front)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        try:
            watch.wait_for(lambda m: m[0] is not None and len(m[0]) == 2, "counts for both engines")
            # Queued while asleep: vLLM's coordinator publishes them, spread over both engines.
            assert post(port, "/sleep?level=1") == 200
            asleep = watch.mark()
            with ThreadPoolExecutor(6) as pool:
                replies = [
                    pool.submit(client.completions.create, model="echo", prompt=f"q{i}", max_tokens=2) for i in range(6)
                ]
                queued = watch.wait_for(
                    lambda m: m[0] is not None and sum(c[0] for c in m[0]) == 6, "6 waiting requests", since=asleep
                )
                assert all(c[0] >= 2 for c in queued[0]), f"not spread over both engines: {queued}"
                awake = watch.mark()
                assert post(port, "/wake_up") == 200
                assert sorted(r.result().choices[0].text for r in replies) == sorted(f"q{i}" for i in range(6))
            # Engines started a wave on vLLM's coordinator and rank 0 completed it.
            watch.wait_for(lambda m: m[2] is True, "a running wave", since=awake)
            watch.wait_for(lambda m: m[1] >= 1 and m[2] is False, "a completed wave", since=awake)
            assert client.completions.create(model="echo", prompt="ok", max_tokens=2).choices[0].text == "ok"
        finally:
            client.close()
            watch.close()
