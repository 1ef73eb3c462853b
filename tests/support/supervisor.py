"""A supervising process for the die-with-parent test: starts two engines
through CoreEngineProcManager; each engine starts children of its own (a
plain subprocess and a double-forked setsid daemon). Every pid goes to
PIDFILE, the guardian's too; then it sleeps until killed.

Usage: python supervisor.py PIDFILE
"""

import os
import subprocess
import sys
import time


def engine(vllm_config, **kwargs):
    """An engine with descendants; `vllm_config` carries the pid file path."""
    pidfile = vllm_config
    child = subprocess.Popen(["sleep", "1000"])
    subprocess.run(["sh", "-c", f"(setsid sleep 1000 & echo $! >> {pidfile})"], check=True)
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\n{child.pid}\n")
    time.sleep(1000)


if __name__ == "__main__":
    from vllm_rs import _core
    from vllm_rs.utils import CoreEngineProcManager

    pidfile = sys.argv[1]
    manager = CoreEngineProcManager(engine, 2, 0, 0, pidfile, True, "tcp://127.0.0.1:0", None, False)
    with open(pidfile, "a") as f:
        f.write(f"{_core.guardian_pid()}\n")
    time.sleep(1000)
