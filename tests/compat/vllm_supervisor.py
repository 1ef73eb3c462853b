"""A supervisor for the die-with-parent compat test: applies
`vllm_rs.vllm_patch`, binds an `ipc://` handshake socket as vLLM's
`launch_core_engines` does, and starts two stand-in engines through vLLM's
own `CoreEngineProcManager` (no GPU: the stand-in replaces
`EngineCoreProc.run_engine_core`). Each stand-in starts a plain child and a
double-forked setsid daemon. Every pid goes to PIDFILE, the guardian's too,
then `ready` to stdout; then it sleeps until killed.

Usage: python vllm_supervisor.py PIDFILE HANDSHAKE_SOCKET_PATH
"""

import os
import subprocess
import sys
import time


def standin_engine(vllm_config, dp_rank, **kwargs):
    """An engine with descendants; `vllm_config.pidfile` names the pid file."""
    pidfile = vllm_config.pidfile
    child = subprocess.Popen(["sleep", "1000"])
    subprocess.run(["sh", "-c", f"(setsid sleep 1000 & echo $! >> {pidfile})"], check=True)
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\n{child.pid}\n")
    time.sleep(1000)


def sleeping_api_server(listen_address, sock, args, client_config):
    """A stand-in API server process: waits to be stopped."""
    time.sleep(1000)


if __name__ == "__main__":
    from types import SimpleNamespace

    import zmq
    from vllm_rs import _core, vllm_patch

    assert vllm_patch.apply(), "the patch did not apply"
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngineProcManager

    EngineCoreProc.run_engine_core = staticmethod(standin_engine)
    pidfile, handshake_path = sys.argv[1], sys.argv[2]
    handshake = zmq.Context().socket(zmq.ROUTER)
    handshake.bind(f"ipc://{handshake_path}")
    config = SimpleNamespace(
        pidfile=pidfile,
        shutdown_timeout=0,
        parallel_config=SimpleNamespace(
            data_parallel_size=1, assigned_physical_gpu_ids=None, numa_bind=False, use_ray=False
        ),
    )
    manager = CoreEngineProcManager(2, 0, 0, config, True, f"ipc://{handshake_path}", object, False)
    with open(pidfile, "a") as f:
        f.write(f"{_core.guardian_pid()}\n")
    print("ready", [p.name for p in manager.processes], flush=True)
    time.sleep(1000)
