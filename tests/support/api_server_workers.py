"""API server worker stand-ins for tests/compat/test_vllm_api_server_manager.py.

They live apart from the test module because the manager spawns its
workers: a spawned child imports the module that defines its target, and
the test module imports vLLM, which takes about 30 s on a loaded 2-core
machine, three children at once. This module imports only ZeroMQ and
vllm_rs."""

from __future__ import annotations

import time

import zmq
from vllm_rs.network_utils import make_zmq_socket


def sleeping_worker(listen_address, sock, args, client_config=None):
    """Stands in for `run_api_server_worker_proc`: sleeps `args` seconds."""
    print(f"worker {client_config and client_config.get('client_index')} sleeps {args} s", flush=True)
    time.sleep(float(args))


def adopting_worker(listen_address, sock, args, client_config):
    """Adopts the inherited input (ROUTER) and output (PULL) listeners, takes
    one message on each, answers on the first and exits."""
    ctx = zmq.Context()
    router = make_zmq_socket(
        ctx, client_config["input_address"], zmq.ROUTER, bind=True, listener=client_config["input_listener"]
    )
    pull = make_zmq_socket(
        ctx, client_config["output_address"], zmq.PULL, bind=True, listener=client_config["output_listener"]
    )
    try:
        identity, payload = router.recv_multipart()
        assert payload == b"input"
        assert pull.recv() == b"output"
        router.send_multipart([identity, b"ok"])
    finally:
        router.close(linger=0)
        pull.close(linger=0)
        ctx.term()
