"""`serve --headless`: an engine-only node. It connects to the head's node
channel (`--data-parallel-address:--data-parallel-rpc-port`, see
`vllm_rs.multinode.node_channel`), says which ranks it runs, starts those engine cores
with the frontends' engine socket addresses it gets back, and then watches
both sides:

- the head says it is stopping, or Ctrl-C/SIGTERM here: engines stop, exit 0;
- the head disappears (its connection closes, or no heartbeat within the
  timeout the head sent): engines stop, exit 1 naming the head;
- an engine dies: the head is told, engines stop, exit 1 naming the engine.

Waiting for the head to come up is bounded by `--engine-ready-timeout`
(default `VLLM_ENGINE_READY_TIMEOUT_S`, 600 s)."""

from __future__ import annotations

import argparse
import dataclasses
import selectors
import signal
import socket
import sys
import time
from typing import Any

from vllm_rs import envs
from vllm_rs.engine.config import ClientAddresses, CoordinatorAddresses, EngineConfig
from vllm_rs.logger import init_logger
from vllm_rs.multinode.node_channel import HEARTBEAT_INTERVAL_S, ChannelClosed, NodeChannel
from vllm_rs.multinode.topology import Topology

logger = init_logger("vllm_rs.multinode.headless")

#: How often a refused connection to the head is retried while it starts.
CONNECT_RETRY_S = 0.5


class HeadlessError(Exception):
    """The node cannot join or keep its head (exit 1 with this message)."""


class HeadRefused(Exception):
    """The head refused this node's hello (exit 2: a configuration mismatch)."""


def _connect(address: str, port: int, deadline: float) -> NodeChannel:
    where = f"{address}:{port}"
    logged = False
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            return NodeChannel(sock)
        except OSError as e:
            if time.monotonic() >= deadline:
                raise HeadlessError(f"no head node answered at {where} ({e.strerror or e})") from None
            if not logged:
                logger.info("waiting for the head node at %s (%s)", where, e.strerror or e)
                logged = True
            time.sleep(CONNECT_RETRY_S)


def _join(channel: NodeChannel, topology: Topology, model: str, deadline: float) -> dict[str, Any]:
    channel.send(
        {
            "type": "hello",
            "ranks": list(topology.local_ranks),
            "data_parallel_size": topology.data_parallel_size,
            "model": model,
        }
    )
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            for message in channel.receive():
                if message["type"] == "welcome":
                    return message
                if message["type"] == "refused":
                    raise HeadRefused(str(message.get("reason")))
    except ChannelClosed as e:
        raise HeadlessError(f"the head node closed the connection before welcoming this node ({e})") from None
    finally:
        selector.close()
    raise HeadlessError("the head node did not answer this node's hello in time")


def _valid_welcome(welcome: dict[str, Any]) -> tuple[list[ClientAddresses], float, CoordinatorAddresses | None]:
    """The frontends' addresses, the heartbeat bound and the coordinator's
    addresses (None without one) of a welcome; HeadlessError if malformed."""
    inputs, outputs, timeout = welcome.get("inputs"), welcome.get("outputs"), welcome.get("heartbeat_timeout_s")
    coordinator = welcome.get("coordinator")
    if (
        not isinstance(inputs, list)
        or not isinstance(outputs, list)
        or not inputs
        or len(inputs) != len(outputs)
        or not all(isinstance(a, str) and a.startswith("tcp://") for a in inputs + outputs)
        or not isinstance(timeout, (int, float))
        or not 2 <= timeout <= 3600
        or (coordinator is not None and not _valid_coordinator(coordinator))
    ):
        raise HeadlessError("the head node's welcome is malformed")
    clients = [ClientAddresses(i, o) for i, o in zip(inputs, outputs)]
    return clients, float(timeout), CoordinatorAddresses(**coordinator) if coordinator is not None else None


def _valid_coordinator(coordinator: Any) -> bool:
    # The engines connect to the two engine-facing sockets; the frontends'
    # one is only registered (as vLLM's dp_stats_address), never connected.
    return (
        isinstance(coordinator, dict)
        and set(coordinator) == {f.name for f in dataclasses.fields(CoordinatorAddresses)}
        and all(isinstance(a, str) for a in coordinator.values())
        and coordinator["engine_publish"].startswith("tcp://")
        and coordinator["engine_output"].startswith("tcp://")
    )


class _Stop(Exception):
    """SIGTERM/SIGINT arrived."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_headless(args: argparse.Namespace, topology: Topology, config: EngineConfig, prog: str) -> int:
    """Runs this node until the head stops it or something is lost; the exit
    code (0 on a stop asked for, 1 on a loss, 2 when the head refuses it)."""
    from vllm_rs.engine import run_engine_core
    from vllm_rs.utils import CoreEngineProcManager

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_stop)
    assert topology.address is not None
    ready_timeout = args.engine_ready_timeout or envs.engine_ready_timeout_s()
    deadline = time.monotonic() + ready_timeout
    channel = engines = None
    failure: str | None = None
    told_head = False
    try:
        channel = _connect(topology.address, topology.rpc_port, deadline)
        clients, heartbeat_timeout_s, coordinator = _valid_welcome(_join(channel, topology, args.model, deadline))
        config.clients = clients
        config.coordinator = coordinator
        config.heartbeat_ttl_s = heartbeat_timeout_s
        ranks = topology.local_ranks
        logger.info(
            "joined the head node at %s: starting data-parallel ranks %d .. %d",
            channel.peer, ranks.start, ranks.stop - 1,
        )  # fmt: skip
        engines = CoreEngineProcManager(
            run_engine_core, topology.local_count, topology.start_rank, 0, config, False,
            clients[0].input_address, None, not args.disable_log_stats,
        )  # fmt: skip
        failure, told_head = _watch(channel, engines, heartbeat_timeout_s)
    except _Stop:
        pass
    except HeadRefused as e:
        print(f"{prog}: error: the head node refused this node: {e}", file=sys.stderr, flush=True)
        return 2
    except HeadlessError as e:
        failure = str(e)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        if channel is not None:
            if failure is None and not told_head:
                try:
                    channel.send({"type": "bye"})
                except ChannelClosed:
                    pass
            channel.close()
        if engines is not None:
            engines.shutdown()
    if failure is not None:
        print(f"{prog}: error: {failure}", file=sys.stderr, flush=True)
        return 1
    logger.info("headless node stopped")
    return 0


def _watch(channel: NodeChannel, engines: Any, heartbeat_timeout_s: float) -> tuple[str | None, bool]:
    """Until the head stops this node, the head is lost or an engine dies:
    (failure or None, whether the head was told why)."""
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ, "head")
    for proc in engines.processes:
        selector.register(proc.sentinel, selectors.EVENT_READ, proc)
    next_ping = time.monotonic()
    try:
        while True:
            for key, _ in selector.select(timeout=HEARTBEAT_INTERVAL_S / 4):
                if key.data == "head":
                    try:
                        messages = channel.receive()
                    except ChannelClosed as e:
                        return f"lost the head node at {channel.peer}: {e}", True
                    if any(m["type"] == "shutdown" for m in messages):
                        logger.info("the head node is stopping; stopping this node's engines")
                        return None, True
                elif engines.record_exit(key.data):
                    proc = key.data
                    try:
                        channel.send(
                            {"type": "engine_died", "rank": int(proc.name.rsplit("_", 1)[-1]),
                             "name": proc.name, "exitcode": proc.exitcode}
                        )  # fmt: skip
                    except ChannelClosed:
                        pass
                    return f"engine core process {proc.name} died unexpectedly (exit code {proc.exitcode})", True
                else:
                    selector.unregister(key.fileobj)
            now = time.monotonic()
            silent = now - channel.last_heard
            if silent > heartbeat_timeout_s:
                return (
                    f"lost the head node at {channel.peer}: no heartbeat for {silent:.1f}s "
                    f"(bound {heartbeat_timeout_s:g}s)",
                    True,
                )
            if now >= next_ping:
                next_ping = now + HEARTBEAT_INTERVAL_S
                try:
                    channel.send({"type": "ping"})
                except ChannelClosed as e:
                    return f"lost the head node at {channel.peer}: {e}", True
    finally:
        selector.close()
