"""The head node's side of the node channel (`vllm_rs.multinode.node_channel`): accepts
`serve --headless` nodes on `--data-parallel-rpc-port`, hands each the
engine socket addresses (the frontends', and the DP coordinator's), and
watches them. A node that goes away (its
connection closes, it stops answering heartbeats, one of its engines dies,
or it stops) is a lost host: `failure` names it and its ranks, and
`on_lost` is called once (serve then stops the stack, exit 1)."""

from __future__ import annotations

import dataclasses
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_rs.engine.config import CoordinatorAddresses
from vllm_rs.logger import init_logger
from vllm_rs.multinode.node_channel import HEARTBEAT_INTERVAL_S, ChannelClosed, NodeChannel

logger = init_logger("vllm_rs.multinode.node_registry")

#: A connection that has not said hello within this is dropped.
HELLO_TIMEOUT_S = 10.0
#: Backlog of the node channel's listener.
BACKLOG = 64


@dataclass
class _Node:
    channel: NodeChannel
    ranks: list[int] = field(default_factory=list)
    connected_at: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        ranks = ", ".join(map(str, self.ranks))
        return f"engine host {self.channel.peer} (data-parallel rank{'s' if len(self.ranks) > 1 else ''} {ranks})"


class NodeRegistry:
    """Serves the node channel's listener (bound by `serve` before anything
    started) on a thread of its own, from `start()` until `stop()`."""

    def __init__(
        self,
        listener: socket.socket,
        remote_ranks: range,
        data_parallel_size: int,
        model: str,
        inputs: list[str],
        outputs: list[str],
        heartbeat_timeout_s: float,
        coordinator: CoordinatorAddresses | None = None,
    ):
        self.failure: str | None = None
        self.on_lost: Callable[[], None] = lambda: None
        self._listener = listener
        self._remote_ranks = remote_ranks
        self._size = data_parallel_size
        self._model = model
        self._welcome = {"type": "welcome", "inputs": inputs, "outputs": outputs}
        self._timeout_s = heartbeat_timeout_s
        self._welcome["heartbeat_timeout_s"] = heartbeat_timeout_s
        if coordinator is not None:
            self._welcome["coordinator"] = dataclasses.asdict(coordinator)
        self._nodes: dict[int, _Node] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="NodeRegistry")

    def start(self) -> None:
        """Starts accepting and watching nodes."""
        self._thread.start()

    def registered_ranks(self) -> list[int]:
        """The ranks of the nodes that said hello and are still there."""
        with self._lock:
            return sorted(r for node in self._nodes.values() for r in node.ranks)

    def stop(self) -> None:
        """Tells every node the head is stopping (they stop their engines and
        exit 0), closes everything; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            for node in self._nodes.values():
                if node.ranks:
                    try:
                        node.channel.send({"type": "shutdown"})
                    except ChannelClosed:
                        pass
                node.channel.close()
            self._nodes.clear()
        self._listener.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        self._listener.setblocking(False)
        selector.register(self._listener, selectors.EVENT_READ)
        next_ping = time.monotonic()
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                if key.fileobj is self._listener:
                    self._accept(selector)
                else:
                    self._read(selector, key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            ping = now >= next_ping
            if ping:
                next_ping = now + HEARTBEAT_INTERVAL_S
            self._check(selector, now, ping)
        selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            logger.warning("accepting a node connection failed: %s", e)
            return
        channel = NodeChannel(sock)
        with self._lock:
            self._nodes[channel.fileno()] = _Node(channel)
        selector.register(channel, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, channel: NodeChannel) -> None:
        node = self._nodes[channel.fileno()]
        try:
            for message in channel.receive():
                self._handle(node, message)
        except ChannelClosed as e:
            self._drop(selector, node, f"its connection to the head ended ({e})")

    def _handle(self, node: _Node, message: dict) -> None:
        kind = message["type"]
        if kind == "hello" and not node.ranks:
            reason = self._refusal(message)
            if reason is not None:
                logger.error("refused a headless node at %s: %s", node.channel.peer, reason)
                node.channel.send({"type": "refused", "reason": reason})
                raise ChannelClosed("refused")
            with self._lock:
                node.ranks = list(message["ranks"])
            node.channel.send(self._welcome)
            logger.info("%s joined", node.describe())
        elif kind == "engine_died" and node.ranks:
            self._lose(node, f"its engine {message.get('name')!s} died (exit code {message.get('exitcode')!s})")
        elif kind == "bye" and node.ranks:
            self._lose(node, "it was stopped")
        # "ping" and anything else: being heard from is all that counts.

    def _refusal(self, hello: dict) -> str | None:
        """Why a hello cannot be accepted, or None."""
        ranks = hello.get("ranks")
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) for r in ranks):
            return "its hello names no ranks"
        if hello.get("data_parallel_size") != self._size:
            return f"--data-parallel-size {hello.get('data_parallel_size')!s} there, {self._size} on the head"
        if hello.get("model") != self._model:
            return f"--model {hello.get('model')!s} there, {self._model} on the head"
        outside = [r for r in ranks if r not in self._remote_ranks]
        if outside:
            return (
                f"rank(s) {outside} are not for headless nodes "
                f"(they run {self._remote_ranks.start} .. {self._remote_ranks.stop - 1})"
            )
        taken = set(ranks) & set(self.registered_ranks())
        if taken:
            return f"rank(s) {sorted(taken)} are already run by another node"
        return None

    def _check(self, selector: selectors.BaseSelector, now: float, ping: bool) -> None:
        """Drops silent nodes; pings the others when `ping`."""
        for node in list(self._nodes.values()):
            silent = now - node.channel.last_heard
            if node.ranks and silent > self._timeout_s:
                self._drop(selector, node, f"no heartbeat for {silent:.1f}s (bound {self._timeout_s:g}s)")
            elif not node.ranks and now - node.connected_at > HELLO_TIMEOUT_S:
                self._drop(selector, node, "no hello")
            elif node.ranks and ping:
                try:
                    node.channel.send({"type": "ping"})
                except ChannelClosed as e:
                    self._drop(selector, node, str(e))

    def _drop(self, selector: selectors.BaseSelector, node: _Node, why: str) -> None:
        selector.unregister(node.channel)
        with self._lock:
            self._nodes.pop(node.channel.fileno(), None)
        node.channel.close()
        if node.ranks:
            self._lose(node, why)

    def _lose(self, node: _Node, why: str) -> None:
        if self.failure is not None or self._stop.is_set():
            return
        self.failure = f"lost {node.describe()}: {why}"
        logger.error("%s", self.failure)
        self.on_lost()
