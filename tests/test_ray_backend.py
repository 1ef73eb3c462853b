"""`serve --data-parallel-backend ray` on a real two-node Ray cluster: a Ray
head and a Ray worker, each started by the test (`ray start --block`) in its
own network namespace (`tests/support/netns.py`), and `serve` on the head
node placing one engine actor on each node. Serving on both ranks, an actor
killed mid-stream, and no actor left behind. Skipped, with the reason
printed, where Ray is not installed or cannot start."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from tests.support import netns
from tests.test_multinode import HostProcess, client, drain_expecting_failure, start_stream_on, stop_all
from tests.test_serve import assert_all_gone


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'vllm-rs[ray]')"
    if shutil.which("ray", path=os.path.dirname(sys.executable)) is None:
        return "the `ray` command is not next to this Python"
    return netns.unavailable_reason()


SKIP_REASON = _ray_missing()
if SKIP_REASON is not None:
    print(f"tests/test_ray_backend.py skipped: {SKIP_REASON}", file=sys.stderr)
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))

RAY_PORT = 6379
RAY_START_TIMEOUT_S = 120
ACTOR_LINE = re.compile(r"EngineCore_(\d+): Ray actor on node (\S+) \(pid (\d+)\)")


class RayCluster:
    """A Ray head in host 0 and a Ray worker in host 1, each a `ray start
    --block` process of the test (stopping it stops that node's processes)."""

    def __init__(self, hosts: netns.Hosts):
        self.hosts = hosts
        self.temp_dir = tempfile.mkdtemp(prefix="vrs-ray-")
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        common = [
            "--block", "--num-cpus", "2", "--object-store-memory", str(100 << 20),
            "--disable-usage-stats",
        ]  # fmt: skip
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes: list[subprocess.Popen] = []
        self.head_address = f"{hosts.address(0)}:{RAY_PORT}"
        try:
            self._start(hosts, ray, common, env)
        except BaseException:  # a skip included: stop what did start
            self.stop()
            raise

    def _start(self, hosts: netns.Hosts, ray: str, common: list[str], env: dict[str, str]) -> None:
        def start(host: int, args: list[str]) -> None:
            self.nodes.append(
                subprocess.Popen(
                    hosts.command(host, [ray, "start", *args, *common]),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                    start_new_session=True,
                )  # fmt: skip
            )

        head = hosts.address(0)
        start(0, ["--head", "--port", str(RAY_PORT), "--node-ip-address", head, "--temp-dir", self.temp_dir,
                  "--include-dashboard=false"])  # fmt: skip
        self._wait_nodes(1)
        start(1, ["--address", self.head_address, "--node-ip-address", hosts.address(1)])
        self._wait_nodes(2)

    def _wait_nodes(self, count: int) -> None:
        """Until the cluster has `count` alive nodes (asked from inside host 0)."""
        probe = (
            "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while True:
            for node in self.nodes:
                if node.poll() is not None:
                    pytest.skip(
                        f"Ray cannot start here: `ray start` exited {node.returncode}: {node.stdout.read()[-2000:]}"
                    )
            result = subprocess.run(
                self.hosts.command(0, [sys.executable, "-c", probe, self.head_address]),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if result.returncode == 0 and result.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            if time.monotonic() > deadline:
                pytest.skip(
                    f"Ray cannot start here: {count} node(s) not up in {RAY_START_TIMEOUT_S}s: {result.stderr[-2000:]}"
                )
            time.sleep(1)

    def processes(self) -> list[psutil.Process]:
        out = []
        for node in self.nodes:
            try:
                root = psutil.Process(node.pid)
                out += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return out

    def stop(self) -> None:
        processes = self.processes()
        for node in reversed(self.nodes):
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.wait(60)
            except subprocess.TimeoutExpired:
                node.kill()
        for p in processes:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    hosts = netns.Hosts(2, default_route=True)
    ray_cluster = None
    try:
        ray_cluster = RayCluster(hosts)
        yield ray_cluster
    finally:
        if ray_cluster is not None:
            ray_cluster.stop()
        hosts.close()


def ray_serve(cluster: RayCluster, *extra: str) -> HostProcess:
    hosts = cluster.hosts
    os.environ["RAY_ADDRESS"] = cluster.head_address
    try:
        return HostProcess(
            hosts, 0, "--port", "8000", "--host", hosts.address(0), "--data-parallel-backend", "ray",
            "--data-parallel-size", "2", "--data-parallel-size-local", "1",
            "--data-parallel-address", hosts.address(0), *extra,
        )  # fmt: skip
    finally:
        del os.environ["RAY_ADDRESS"]


def actor_pids(serve: HostProcess) -> dict[int, tuple[str, int]]:
    return {int(rank): (ip, int(pid)) for rank, ip, pid in ACTOR_LINE.findall(serve.output)}


def alive(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return out


def test_engines_as_ray_actors_on_two_nodes(cluster):
    """One actor per node (rank 0 on the head's node, rank 1 on the worker);
    requests pinned to either rank are answered; Ctrl-C stops serve (exit 0)
    and no actor process is left."""
    serve = ray_serve(cluster, "--model", "echo")
    try:
        url = serve.wait_ready()
        placed = actor_pids(serve)
        assert {rank: ip for rank, (ip, _) in placed.items()} == {
            0: cluster.hosts.address(0),
            1: cluster.hosts.address(1),
        }, serve.output
        with cluster.hosts.inside(0):
            api = client(url)
            for rank in (0, 1, 1, 0):
                answer = api.completions.create(
                    model="echo", prompt="ray", max_tokens=3, extra_headers={"X-data-parallel-rank": str(rank)}
                )
                assert answer.choices[0].text == "ray"
        actors = alive([pid for _, pid in placed.values()])
        os.killpg(serve.proc.pid, signal.SIGINT)
        assert serve.wait() == 0, serve.output
        assert_all_gone(actors, within_s=30)
    finally:
        stop_all(serve)


def test_an_engine_actor_killed_mid_stream(cluster):
    """SIGKILL of the worker node's actor while it streams: the stream fails,
    the frontend notices the engine gone, serve exits 1 naming EngineCore_1, and the other
    actor is gone too."""
    serve = ray_serve(cluster, "--model", "toy", "--max-model-len", "2048")
    try:
        url = serve.wait_ready()
        placed = actor_pids(serve)
        with cluster.hosts.inside(0):
            stream = start_stream_on(client(url), 1)
            os.kill(placed[1][1], signal.SIGKILL)
            error = drain_expecting_failure(stream)
        assert error, serve.output
        # serve stops the stack within milliseconds, as Ray reports the
        # actor's death at once (/health 503 meanwhile is tested with a window
        # to see it in test_multinode). Its output is whole once it has exited.
        assert serve.wait() == 1, serve.output
        assert "engine 1 is gone: its connection closed (handled as ENGINE_CORE_DEAD)" in serve.output, serve.output
        assert re.search(r"error: .*EngineCore_1", serve.output), serve.output
        assert_all_gone(alive([pid for _, pid in placed.values()]), within_s=30)
    finally:
        stop_all(serve)
