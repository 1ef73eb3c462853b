"""`serve --data-parallel-size 2` end to end: the
coordinator process, its sockets in the private directory, the counts it
publishes (read here by our own XSUB subscriber on its front socket, as a
frontend reads them), requests spread over both engines, and request waves
reaching the engines (their logs on exit say which waves their requests
carried)."""

from __future__ import annotations

import os
import re
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import msgpack
import zmq

from tests.test_serve import API_KEY, Serve, assert_all_gone, needs_frontend

ENGINE_TOTALS = re.compile(r"EngineCore_(\d) stopped: (\d+) requests finished")
ENGINE_WAVES = re.compile(r"EngineCore_(\d) took part in (\d+) data-parallel wave\(s\); highest request wave (\d+)")
#: Upper bound for waiting on something the stack does by itself.
EVENT_TIMEOUT_S = 60


class CoordinatorWatch:
    """An XSUB on the coordinator's front publish socket, as a frontend has
    one: collects every `[counts, current_wave, engines_running]` message."""

    def __init__(self, address: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XSUB)
        self.sock.connect(address)
        self.sock.send(b"\x01")
        self.messages: list[list] = []
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(100):
                message = msgpack.unpackb(self.sock.recv())
                with self._lock:
                    self.messages.append(message)
                    self._lock.notify_all()

    def mark(self) -> int:
        """How many messages arrived so far (for `wait_for(since=...)`)."""
        with self._lock:
            return len(self.messages)

    def wait_for(self, check, what: str, since: int = 0) -> list:
        """The first message, from the `since`-th on, that satisfies `check`."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        with self._lock:
            while True:
                for message in self.messages[since:]:
                    if check(message):
                        return message
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"the coordinator never published {what}; got {self.messages[-5:]}"
                self._lock.wait(remaining)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


@needs_frontend
def test_data_parallel_stack_with_the_coordinator():
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2", "--max-model-len", "512",
                  env={"VLLM_API_KEY": API_KEY, "VLLM_LOG_STATS_INTERVAL": "0.5"})  # fmt: skip
    watch = None
    try:
        client = serve.client()
        assert "Started DP Coordinator process" in serve.output
        front = os.path.join(serve.socket_dir, "coord-front")
        for name in ("coord-front", "coord-in", "coord-out"):
            mode = os.stat(os.path.join(serve.socket_dir, name)).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, name
        assert stat.S_IMODE(os.stat(serve.socket_dir).st_mode) == 0o700
        watch = CoordinatorWatch(f"ipc://{front}")
        watch.wait_for(lambda m: m[0] is not None and len(m[0]) == 2, "counts for both engines")

        # Requests while the engines sleep stay waiting: the coordinator must
        # publish them, and both engines must have some (the frontend spread them).
        assert serve.http("POST", "/sleep?level=1", headers={"Authorization": f"Bearer {API_KEY}"})[0] == 200
        asleep = watch.mark()
        with ThreadPoolExecutor(8) as pool:
            replies = [
                pool.submit(client.completions.create, model="echo", prompt=f"r{i}", max_tokens=4) for i in range(8)
            ]
            queued = watch.wait_for(
                lambda m: m[0] is not None and sum(c[0] for c in m[0]) == 8, "8 waiting requests", since=asleep
            )
            assert all(c[0] >= 2 for c in queued[0]), f"requests not spread over both engines: {queued}"
            awake = watch.mark()
            assert serve.http("POST", "/wake_up", headers={"Authorization": f"Bearer {API_KEY}"})[0] == 200
            assert sorted(r.result().choices[0].text for r in replies) == sorted(f"r{i}r{i}"[:4] for i in range(8))

        # The wave those requests ran in ends once the engines are idle: the
        # coordinator moves to a later wave, paused, with nothing queued or running.
        done = watch.wait_for(lambda m: m[1] >= 1 and m[2] is False, "a completed wave", since=awake)
        wave_after_first_batch = done[1]
        idle = lambda m: m[0] is not None and all(c[:2] == [0, 0] for c in m[0])  # noqa: E731
        watch.wait_for(idle, "idle engines", since=awake)
        # Requests sent now carry the new wave to whichever engine gets them.
        for _ in range(4):
            assert client.completions.create(model="echo", prompt="w", max_tokens=2).choices[0].text == "ww"

        # /metrics keeps a series per engine, labelled as vLLM labels them, and
        # the throughput log line comes at the interval asked for.
        metrics = serve.http("GET", "/metrics")[1].decode()
        series = re.findall(r"^vllm:prompt_tokens_total\{(.*)\} (\S+)$", metrics, re.M)
        prompt_tokens = {int(re.search(r'engine="(\d+)"', labels)[1]): float(n) for labels, n in series}
        assert all('model_name="echo"' in labels for labels, _ in series), metrics
        assert set(prompt_tokens) == {0, 1} and all(n > 0 for n in prompt_tokens.values()), metrics
        serve.wait_for_line(r"Avg prompt throughput: [0-9.]+ tokens/s, Avg generation throughput: [0-9.]+ tokens/s")

        processes = serve.descendants()
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=1)
    finally:
        if watch is not None:
            watch.close()
        serve.kill()
    finished = {int(e): int(n) for e, n in ENGINE_TOTALS.findall(serve.output)}
    assert sum(finished.values()) == 12 and all(finished.get(e, 0) >= 2 for e in (0, 1)), finished
    waves = {int(e): (int(run), int(highest)) for e, run, highest in ENGINE_WAVES.findall(serve.output)}
    assert set(waves) == {0, 1}, serve.output
    assert all(run >= 1 for run, _ in waves.values()), waves
    assert max(highest for _, highest in waves.values()) >= wave_after_first_batch, (waves, wave_after_first_batch)
    assert not os.path.exists(front)


def test_a_dead_coordinator_stops_the_stack():
    serve = Serve("--model", "echo", "--port", "0", "--data-parallel-size", "2")
    try:
        serve.wait_ready()
        match = re.search(r"Started DP Coordinator process \(PID: (\d+)\)", serve.output)
        assert match, serve.output
        processes = serve.descendants()
        os.kill(int(match.group(1)), signal.SIGKILL)
        assert serve.wait(60) == 1, serve.output
        assert re.search(r"error: Process DPCoordinator \(PID: \d+\) died with exit code -9", serve.output), (
            serve.output
        )
        assert_all_gone(processes, within_s=1)
        assert not os.path.exists(serve.socket_dir)
    finally:
        serve.kill()
