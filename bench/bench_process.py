"""Process-layer benchmarks: the Rust core against what vLLM does today, both
measured in this run, printed as ratios (baseline / ours for times, so
above 1.0 means we are faster; ours / baseline for throughput).

  * kill_process_tree on three trees (idle, forking every 50 ms, setsid
    daemons): survivors and time, vs a psutil children(recursive=True) walk
    on the same tree started with subprocess.Popen;
  * exit-detection latency p50/p99 (the child writes its clock just before
    exiting) vs subprocess.Popen + a monitor thread + a pipe as sentinel;
  * spawn-and-reap throughput of N short-lived executables vs subprocess.Popen;
  * start-to-running time of 8 Python targets vs multiprocessing spawn.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_process.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402  (baseline only)
from vllm_rs.process.core import (  # noqa: E402
    PreparedTarget,
    kill_process_tree,
    spawn_executable,
    spawn_executables,
    start_targets,
    wait,
)

from tests.support.trees import TREE_SCRIPT, survivors, wait_built  # noqa: E402


def psutil_kill_tree(pid: int) -> None:
    """vLLM's kill_process_tree today: walk children(recursive=True), SIGKILL each."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for child in parent.children(recursive=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def sweep(pidfile: Path) -> None:
    """Kills whatever a baseline left running, until nothing recorded runs."""
    for _ in range(100):
        left = survivors(pidfile)
        if not left:
            return
        for pid in left:
            kill_process_tree(pid)
    raise RuntimeError(f"could not clean up {pidfile}")


def bench_kill_tree(kind: str, rounds: int) -> dict:
    result = {"ours_survivors": [], "base_survivors": [], "ours_s": [], "base_s": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            pidfile = Path(tmp, "ours")
            root = spawn_executable(["sh", str(TREE_SCRIPT), kind, str(pidfile)], name="tree")
            wait_built(pidfile, kind)
            time.sleep(0.3 if kind == "forking" else 0.05)
            t0 = time.perf_counter()
            kill_process_tree(root.pid)
            result["ours_s"].append(time.perf_counter() - t0)
            root.join(10)
            result["ours_survivors"].append(len(survivors(pidfile)))
            sweep(pidfile)

            pidfile = Path(tmp, "base")
            popen = subprocess.Popen(["sh", str(TREE_SCRIPT), kind, str(pidfile)])
            wait_built(pidfile, kind)
            time.sleep(0.3 if kind == "forking" else 0.05)
            t0 = time.perf_counter()
            psutil_kill_tree(popen.pid)
            result["base_s"].append(time.perf_counter() - t0)
            popen.wait()
            time.sleep(0.2)  # let stragglers show that they survived
            result["base_survivors"].append(len(survivors(pidfile)))
            sweep(pidfile)
    return result


CLOCK_CHILD = "import os, sys, time; os.write(int(sys.argv[1]), str(time.time_ns()).encode()); os._exit(0)"


def _read_clock(fd: int) -> int:
    return int(os.read(fd, 64))


def latency_ours(samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        r, w = os.pipe()
        proc = spawn_executable([sys.executable, "-S", "-c", CLOCK_CHILD, str(w)], name="clock", pass_fds=[w])
        os.close(w)
        wait([proc.sentinel])
        detected = time.time_ns()
        out.append((detected - _read_clock(r)) / 1e6)
        os.close(r)
        proc.join()
    return out


def latency_baseline(samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        r, w = os.pipe()
        proc = subprocess.Popen([sys.executable, "-S", "-c", CLOCK_CHILD, str(w)], pass_fds=[w])
        os.close(w)
        recv, send = connection.Pipe(duplex=False)

        def monitor(proc=proc, send=send) -> None:
            try:
                proc.wait()
            finally:
                send.close()

        threading.Thread(target=monitor, daemon=True).start()
        connection.wait([recv])
        detected = time.time_ns()
        out.append((detected - _read_clock(r)) / 1e6)
        os.close(r)
        recv.close()
    return out


TRUE = ["/bin/true"]


def _ours_one_call_each(n: int) -> list:
    return [spawn_executable(TRUE, name="t") for _ in range(n)]


def _ours_pipelined(n: int) -> list:
    return spawn_executables([TRUE] * n, names=["t"] * n)


def _popen(n: int) -> list:
    return [subprocess.Popen(TRUE) for _ in range(n)]


def spawn_throughput(start_all, n: int) -> float:
    """Children per second: start `n` /bin/true with `start_all`, then reap all."""
    t0 = time.perf_counter()
    procs = start_all(n)
    for proc in procs:
        proc.wait() if isinstance(proc, subprocess.Popen) else proc.join()
    elapsed = time.perf_counter() - t0
    codes = [p.returncode if isinstance(p, subprocess.Popen) else p.exitcode for p in procs]
    assert codes == [0] * n, codes
    return n / elapsed


def children_cpu_per_true(n: int) -> float:
    """CPU seconds one /bin/true costs (its exec, run and exit), measured on
    direct children: the floor under any spawner's per-child cost."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for proc in _popen(n):
        proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n


def report_running(conn) -> None:
    """A Python target that says it is running."""
    conn.send_bytes(b".")


def _start_ours(send, count: int) -> list:
    return start_targets([PreparedTarget(report_running, name=f"T{i}", args=(send,)) for i in range(count)])


def _start_multiprocessing(send, count: int) -> list:
    procs = [multiprocessing.get_context("spawn").Process(target=report_running, args=(send,)) for _ in range(count)]
    for proc in procs:
        proc.start()
    return procs


def time_to_running(start_all, count: int) -> float:
    """Seconds from asking for `count` Python targets until all say they run."""
    recv, send = multiprocessing.Pipe(duplex=False)
    t0 = time.perf_counter()
    procs = start_all(send, count)
    for _ in range(count):
        recv.recv_bytes()
    elapsed = time.perf_counter() - t0
    for proc in procs:
        proc.join()
    return elapsed


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    opts = parser.parse_args()
    rounds, samples, spawns = (1, 20, 200) if opts.quick else (3, 100, 1000)

    print("== kill_process_tree: survivors and time (ours vs psutil walk) ==")
    for kind in ("idle", "forking", "daemons"):
        r = bench_kill_tree(kind, rounds)
        ours_t, base_t = statistics.median(r["ours_s"]), statistics.median(r["base_s"])
        print(
            f"{kind:8s} survivors ours={max(r['ours_survivors'])} psutil={max(r['base_survivors'])}  "
            f"time ours={ours_t * 1e3:.1f} ms psutil={base_t * 1e3:.1f} ms  (ours kills and waits for exit)"
        )

    print("== exit-detection latency (ms; child writes its clock just before exit) ==")
    ours, base = latency_ours(samples), latency_baseline(samples)
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        o, b = pct(ours, q), pct(base, q)
        print(f"{label}: ours={o:.3f} baseline(Popen+thread+pipe)={b:.3f}  ratio baseline/ours={b / o:.2f}")

    print(f"== spawn-and-reap throughput of {spawns} /bin/true ==")
    base_tp = spawn_throughput(_popen, spawns)
    ours_tp = spawn_throughput(_ours_one_call_each, spawns)
    batch_tp = spawn_throughput(_ours_pipelined, spawns)
    print(
        f"one call each: ours={ours_tp:.0f}/s subprocess.Popen={base_tp:.0f}/s  ratio ours/Popen={ours_tp / base_tp:.2f}"
    )
    print(f"spawn_executables (pipelined): ours={batch_tp:.0f}/s  ratio ours/Popen={batch_tp / base_tp:.2f}")
    child_cpu = children_cpu_per_true(200)
    print(
        f"ceiling: each /bin/true costs {child_cpu * 1e6:.0f} us of CPU (exec + run + exit); "
        f"{os.cpu_count()} cores run at most {os.cpu_count() / child_cpu:.0f}/s whoever spawns them"
    )

    print("== start-to-running of 8 Python targets ==")
    mp_s = statistics.median(time_to_running(_start_multiprocessing, 8) for _ in range(rounds))
    ours_s = statistics.median(time_to_running(_start_ours, 8) for _ in range(rounds))
    print(f"ours={ours_s * 1e3:.0f} ms multiprocessing spawn={mp_s * 1e3:.0f} ms  ratio mp/ours={mp_s / ours_s:.2f}")


if __name__ == "__main__":
    main()
