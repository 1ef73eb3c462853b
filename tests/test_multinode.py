"""`serve` across hosts: a head node and `--headless` engine nodes, each in
its own Linux network namespace on a small subnet made by the test
(`tests/support/netns.py`), driven with the `openai` client from inside the
head's namespace. Serving across hosts, rank pinning to a remote engine, a
node refused by the head, and losing a host (SIGKILL of everything on it, or
its link cut) or the head."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import psutil
import pytest

from tests.support import netns
from tests.support.wait import wait_until
from tests.test_serve import READY_LINE, assert_all_gone, needs_frontend

UNAVAILABLE = netns.unavailable_reason()
needs_hosts = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no network namespaces: {UNAVAILABLE}")
if UNAVAILABLE is not None:
    print(f"tests/test_multinode.py skipped: {UNAVAILABLE}", file=sys.stderr)

READY_TIMEOUT_S = 120
RPC_PORT = 29650
#: A short heartbeat bound keeps the link-cut tests short.
HEARTBEAT_TIMEOUT_S = 3
ENGINE_TOTALS = re.compile(r"EngineCore_(\d+) stopped: (\d+) requests finished")


class HostProcess:
    """`python -m vllm_rs serve ARGS` inside host `i`, in its own session,
    its output collected line by line."""

    def __init__(self, hosts: netns.Hosts, i: int, *args: str):
        env = {
            **os.environ,
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            "VLLM_RS_HOST_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
        }
        self.proc = subprocess.Popen(
            hosts.command(i, [sys.executable, "-m", "vllm_rs", "serve", *args]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = READY_LINE.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> str:
        self._ready.wait(READY_TIMEOUT_S)
        assert self.url is not None, f"serve did not become ready:\n{self.output}"
        return self.url

    def wait_for_line(self, pattern: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        def seen() -> bool:
            assert self.proc.poll() is None, f"no {pattern!r} in:\n{self.output}"
            return any(re.search(pattern, line) for line in self.lines)

        wait_until(seen, f"a line matching {pattern!r}", timeout_s)

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def wait(self, timeout_s: float = 60) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        for p in reversed(self.processes()):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(30)
        self._reader.join(10)


@pytest.fixture
def hosts(request):
    made = netns.Hosts(request.param if hasattr(request, "param") else 2)
    yield made
    made.close()


def head_args(hosts: netns.Hosts, size: int, local: int, *extra: str) -> list[str]:
    return [
        "--model", "echo", "--port", "8000", "--host", hosts.address(0),
        "--data-parallel-size", str(size), "--data-parallel-size-local", str(local),
        "--data-parallel-address", hosts.address(0), "--data-parallel-rpc-port", str(RPC_PORT), *extra,
    ]  # fmt: skip


def node_args(hosts: netns.Hosts, size: int, local: int, start: int, *extra: str) -> list[str]:
    return [
        "--model", "echo", "--headless", "--data-parallel-size", str(size),
        "--data-parallel-size-local", str(local), "--data-parallel-start-rank", str(start),
        "--data-parallel-address", hosts.address(0), "--data-parallel-rpc-port", str(RPC_PORT), *extra,
    ]  # fmt: skip


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class HealthWatch:
    """Polls `/health` from inside host 0 on a thread of its own, from
    before a failure is caused until `head` exits: whether it ever answered
    503. Started before the failure, so that a head stopping quickly after
    it cannot hide the 503 window."""

    def __init__(self, hosts: netns.Hosts, url: str, head: HostProcess, within_s: float = 60):
        self.seen_503 = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(hosts, url, head, within_s), daemon=True)
        self._thread.start()

    def _watch(self, hosts: netns.Hosts, url: str, head: HostProcess, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        with hosts.inside(0):
            while not self._done.is_set() and head.proc.poll() is None and time.monotonic() < deadline:
                if health(url) == 503:
                    self.seen_503 = True
                    return
                self._done.wait(0.01)

    def result(self) -> bool:
        """Waits for the watch to end (503 seen, head gone, or the bound)."""
        self._thread.join()
        return self.seen_503


def stop_all(*procs: HostProcess) -> None:
    for proc in procs:
        if proc.proc.poll() is None:
            proc.kill()


@needs_hosts
@pytest.mark.parametrize("hosts", [3], indirect=True)
@needs_frontend
def test_head_and_two_headless_nodes_serve_together(hosts):
    """dp 4: ranks 0-1 on the head, 2 on node 1, 3 on node 2. Completions and
    streams succeed; `X-data-parallel-rank` reaches each remote engine (its
    own log counts the requests it finished); the DP coordinator on the
    head has every engine's subscription, the remote ones over TCP; a third
    node claiming a taken rank is refused (exit 2); Ctrl-C at the head stops
    every host (exit 0)."""
    head = HostProcess(hosts, 0, *head_args(hosts, 4, 2))
    nodes = [HostProcess(hosts, 1, *node_args(hosts, 4, 1, 2)), HostProcess(hosts, 2, *node_args(hosts, 4, 1, 3))]
    try:
        url = head.wait_ready()
        # Engines register only once the coordinator has all four
        # subscriptions; its log line comes from another process than the
        # frontend's ready line, so it may be read after it.
        head.wait_for_line("All engine subscriptions received by DP coordinator")
        tcp_endpoints = re.search(r"engine sockets on (\S+(?:, \S+)*): TCP", head.output)
        assert tcp_endpoints and len(tcp_endpoints.group(1).split(", ")) == 4, head.output  # 2 frontend + 2 coordinator
        with hosts.inside(0):
            api = client(url)
            for _ in range(8):
                answer = api.completions.create(model="echo", prompt="hello hosts", max_tokens=11)
                assert answer.choices[0].text == "hello hosts"
            for rank, count in ((2, 3), (3, 5)):
                for _ in range(count):
                    answer = api.completions.create(
                        model="echo", prompt="pinned", max_tokens=6, extra_headers={"X-data-parallel-rank": str(rank)}
                    )
                    assert answer.choices[0].text == "pinned"
            stream = api.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "streamed"}], max_tokens=40, stream=True,
                extra_headers={"X-data-parallel-rank": "3"},
            )  # fmt: skip
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            assert text
        intruder = HostProcess(hosts, 2, *node_args(hosts, 4, 1, 2))
        assert intruder.wait() == 2
        assert "refused this node: rank(s) [2] are already run by another node" in intruder.output
        processes = [p for proc in (head, *nodes) for p in proc.processes()]
        os.killpg(head.proc.pid, signal.SIGINT)
        assert head.wait() == 0, head.output
        for node in nodes:
            assert node.wait() == 0, node.output
        assert_all_gone(processes, within_s=10)
        totals = {int(r): int(n) for node in nodes for r, n in ENGINE_TOTALS.findall(node.output)}
        # Pinned requests, plus any of the 8 unpinned and the stream.
        assert totals[2] >= 3 and totals[3] >= 6, totals
    finally:
        stop_all(head, *nodes)


def start_stream_on(api: openai.OpenAI, rank: int):
    """A stream from the toy model pinned to `rank` that runs for seconds,
    after its first chunk."""
    stream = api.completions.create(
        model="toy", prompt="Tell me a long story.", max_tokens=1900, stream=True,
        extra_body={"ignore_eos": True}, extra_headers={"X-data-parallel-rank": str(rank)},
    )  # fmt: skip
    next(iter(stream))
    return stream


def drain_expecting_failure(stream) -> str:
    """Reads the rest of `stream`; what ended it (an error), which must come."""
    try:
        for _ in stream:
            pass
    except (openai.APIError, openai.APIConnectionError) as e:
        return str(e)
    raise AssertionError("the stream finished normally")


@needs_hosts
@pytest.mark.parametrize("how", ["sigkill", "link_down"])
@needs_frontend
def test_losing_an_engine_host(hosts, how):
    """A stream runs on the remote rank 1 when its host goes: every process
    there SIGKILLed, or its link taken down. The stream fails with an error,
    `/health` answers 503, the head exits 1 naming the host and rank 1, the
    headless node (when alive) exits on its own, and nothing is left running
    on either side."""
    toy = ("--model", "toy", "--max-model-len", "2048")
    head = HostProcess(hosts, 0, *head_args(hosts, 2, 1), *toy)
    node = HostProcess(hosts, 1, *node_args(hosts, 2, 1, 1), *toy)
    try:
        url = head.wait_ready()
        processes = [p for proc in (head, node) for p in proc.processes()]
        with hosts.inside(0):
            stream = start_stream_on(client(url), 1)
            watch = HealthWatch(hosts, url, head)
            if how == "sigkill":
                for p in node.processes():
                    p.kill()
            else:
                hosts.cut_link(1)
            error = drain_expecting_failure(stream)
        assert error
        assert watch.result(), head.output
        assert head.wait() == 1, head.output
        assert re.search(
            rf"error: lost engine host {re.escape(hosts.address(1))}:\d+ \(data-parallel rank 1\)", head.output
        ), head.output
        if how == "link_down":
            assert node.wait() == 1, node.output
            assert "error: lost the head node" in node.output
        assert_all_gone(processes, within_s=15)
    finally:
        stop_all(head, node)


def engine_processes(host: HostProcess) -> list[psutil.Process]:
    """The engine core processes `host` runs (titled `VLLM::EngineCore_N`)."""
    return [p for p in host.processes() if "EngineCor" in p.name()]


@needs_hosts
def test_the_rust_frontend_loses_a_silent_engine_within_its_heartbeat_ttl(hosts):
    """The remote engine is stopped (SIGSTOP): its host, its connections and
    the node channel stay up, but it sends nothing, not even its ZMTP PINGs.
    The Rust frontend alone notices, from the heartbeat TTL those PINGs
    announce (`VLLM_RS_HOST_HEARTBEAT_TIMEOUT_S`): the stream on it fails,
    `/health` answers 503, and the head stops, exit 1, naming the silence."""
    toy = ("--model", "toy", "--max-model-len", "2048")
    head = HostProcess(hosts, 0, *head_args(hosts, 2, 1), *toy)
    node = HostProcess(hosts, 1, *node_args(hosts, 2, 1, 1), *toy)
    engine = None
    try:
        url = head.wait_ready()
        (engine,) = engine_processes(node)
        # The bound is known from the engine's first PING on its input connection.
        head.wait_for_line(r"announces a heartbeat TTL of 3s.*identity=\[1, 0\]")
        with hosts.inside(0):
            stream = start_stream_on(client(url), 1)
            watch = HealthWatch(hosts, url, head)
            engine.suspend()
            error = drain_expecting_failure(stream)
        assert error
        assert watch.result(), head.output
        assert head.wait() == 1, head.output
        assert re.search(
            r"engine 1 is gone: its connection was dropped: the peer sent nothing for 3s, the heartbeat TTL",
            head.output,
        ), head.output
        assert node.proc.poll() is None or node.wait() == 0, node.output  # the head told it to stop
    finally:
        if engine is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                engine.resume()
        stop_all(head, node)


@needs_hosts
def test_a_headless_node_exits_when_its_head_is_killed(hosts):
    """SIGKILL of the head's serve: the process core takes its tree down, the
    node sees its connection end and exits 1, its engines with it."""
    head = HostProcess(hosts, 0, *head_args(hosts, 2, 1))
    node = HostProcess(hosts, 1, *node_args(hosts, 2, 1, 1))
    try:
        head.wait_ready()
        processes = [p for proc in (head, node) for p in proc.processes()]
        head.proc.kill()
        assert node.wait() == 1, node.output
        assert "error: lost the head node" in node.output
        assert_all_gone(processes, within_s=15)
    finally:
        stop_all(head, node)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--headless", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
          "--data-parallel-start-rank", "1"], "--headless: needs --data-parallel-address"),
        (["--data-parallel-size", "2", "--data-parallel-size-local", "1"], "need --data-parallel-address"),
        (["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "0.0.0.0"],
         "a wildcard address"),
        (["--data-parallel-size", "2", "--data-parallel-start-rank", "1"], "applies to --headless nodes"),
        (["--headless", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
          "--data-parallel-start-rank", "0", "--data-parallel-address", "127.0.0.1"], "rank 0 is the head's"),
        (["--data-parallel-size", "2", "--data-parallel-size-local", "3"], "--data-parallel-size-local 3"),
        (["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
          "--data-parallel-rpc-port", "70000"], "--data-parallel-rpc-port 70000"),
    ],
)  # fmt: skip
def test_data_parallel_flags_that_describe_no_deployment_are_usage_errors(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", "--model", "echo", "--port", "0", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
