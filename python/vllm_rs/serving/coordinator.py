"""The data-parallel coordinator: vLLM 0.33's `DPCoordinator` protocol, in
its own process, for `serve --data-parallel-size N` (N > 1).

Three sockets, all listeners that `serve` creates before any child starts
(`CoordinatorListeners`): in its private socket directory, except that the
two engine-facing ones listen on TCP at `--data-parallel-address` when
engines run on other hosts:

- front publish (XPUB): frontends connect an XSUB, subscribe with `\\x01`,
  and receive msgpack `[counts, current_wave, engines_running]`, `counts`
  being one `[waiting, running, kv_cache_usage]` per engine, or nil when
  only the wave changed. Published at most every 100 ms while counts change,
  else every 5 s. Anything else a frontend sends is logged and ignored
  (vLLM's elastic scaling message is not supported here).
- engine output (PULL): engines push `EngineCoreOutputs` carrying only
  `scheduler_stats` (their counts), `wave_complete` (rank 0: every engine
  went idle, wave W is over) or `start_wave` (an idle engine got a request:
  wave W must start everywhere).
- engine publish (XPUB): engines connect an XSUB and subscribe; once all
  have, the coordinator sends `READY`, and later `[START_DP_WAVE, (wave,
  exclude_engine_index)]` when an engine starts a wave, so the others join.

The wave state machine is vLLM's: `wave_complete(W)` with W >= current
moves to W + 1, paused; `start_wave(W)` with W > current, or W == current
while paused, makes W current, running, and tells the other engines.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from vllm_rs.engine.config import CoordinatorAddresses
from vllm_rs.engine.protocol import ENGINE_CORE_DEAD, REQUEST_START_DP_WAVE, ProtocolError, pack
from vllm_rs.logger import init_logger
from vllm_rs.multinode.topology import tcp_endpoint
from vllm_rs.network_utils import PrivateSocketDir, ZmqListener, make_zmq_listener, make_zmq_socket
from vllm_rs.process.signal_wakeup import drain, signal_wakeup

logger = init_logger(__name__)

#: The subscription messages an XPUB hands up (XPUB_VERBOSE): subscribe, unsubscribe.
SUBSCRIBE, UNSUBSCRIBE = b"\x01", b"\x00"
#: What the coordinator sends engines once all of them have subscribed.
READY = b"READY"
#: Counts are published at most this often while they change (vLLM's default).
MIN_STATS_UPDATE_INTERVAL_MS = 100
#: Unchanged counts are published again this often.
IDLE_PUBLISH_INTERVAL_MS = 5000


@dataclass
class CoordinatorListeners:
    """The coordinator's three listeners: `front_publish` is the address
    frontends subscribe to (vLLM's `stats_update_address`, the Rust
    frontend's `--coordinator-address`); engines connect to
    `engine_publish` (vLLM's `coordinator_input`) and `engine_output`
    (`coordinator_output`)."""

    front_publish: ZmqListener
    engine_publish: ZmqListener
    engine_output: ZmqListener

    @classmethod
    def create(cls, socket_dir: PrivateSocketDir, engine_host: str | None = None) -> CoordinatorListeners:
        """Binds all three in `socket_dir` (files of mode 0600 in a 0700
        directory), or, given `engine_host` (engines on other hosts), the two
        engine-facing ones on TCP at that address (a port the kernel picks);
        on failure none is left open."""
        made: list[ZmqListener] = []
        try:
            for name, kind in (("coord-front", zmq.XPUB), ("coord-in", zmq.XPUB), ("coord-out", zmq.PULL)):
                on_tcp = engine_host is not None and name != "coord-front"
                made.append(
                    make_zmq_listener(tcp_endpoint(engine_host, 0) if on_tcp else socket_dir.endpoint(name), kind)
                )
        except BaseException:
            for listener in made:
                listener.cleanup()
            raise
        return cls(*made)

    def addresses(self) -> CoordinatorAddresses:
        """Where engines and frontends reach these listeners."""
        return CoordinatorAddresses(
            engine_publish=self.engine_publish.address,
            engine_output=self.engine_output.address,
            front_publish=self.front_publish.address,
        )

    def all(self) -> list[ZmqListener]:
        """The three listeners."""
        return [self.front_publish, self.engine_publish, self.engine_output]


@dataclass
class EngineCounts:
    """One engine's counts, as last reported."""

    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0

    def to_wire(self) -> list[Any]:
        """`[waiting, running, kv_cache_usage]`, as vLLM publishes them."""
        return [self.waiting, self.running, self.kv_cache_usage]


@dataclass
class EngineNotice:
    """What an engine tells the coordinator (one `EngineCoreOutputs`)."""

    engine_index: int
    #: `num_waiting_reqs`, `num_running_reqs`, `kv_cache_usage`, when sent.
    stats: dict[str, Any] | None
    wave_complete: int | None
    start_wave: int | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _slot(items: list, index: int) -> Any:
    return items[index] if index < len(items) else None


def _decode_stats(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("scheduler_stats is not a map")
    for key in ("num_waiting_reqs", "num_running_reqs"):
        count = value.get(key) or 0
        if not _is_int(count) or not 0 <= count <= 2**31:
            raise ProtocolError(f"scheduler_stats.{key} is not a count")
    usage = value.get("kv_cache_usage") or 0.0
    if isinstance(usage, bool) or not isinstance(usage, (int, float)) or not 0.0 <= usage <= 1.0:
        raise ProtocolError("scheduler_stats.kv_cache_usage is not a fraction")
    return value


def decode_engine_notice(frames: list[bytes]) -> EngineNotice:
    """One message from an engine's output socket, which must carry only
    counts (`scheduler_stats`) or a wave field (`wave_complete`,
    `start_wave`); raises ProtocolError naming what is wrong otherwise."""
    if not frames or frames[0] == ENGINE_CORE_DEAD:
        raise ProtocolError("only scheduler stats and wave messages are sent to the coordinator")
    try:
        items = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError(f"undecodable MessagePack ({type(e).__name__})") from None
    if not isinstance(items, list) or not items:
        raise ProtocolError("EngineCoreOutputs must be a non-empty array")
    if _slot(items, 1) or _slot(items, 4) is not None or _slot(items, 5):  # outputs, utility reply, finished
        raise ProtocolError("only scheduler stats and wave messages are sent to the coordinator")
    engine_index, stats = items[0], _decode_stats(_slot(items, 2))
    if not _is_int(engine_index):
        raise ProtocolError("engine_index is not an engine index")
    wave_complete, start_wave = _slot(items, 6), _slot(items, 7)
    for name, wave in (("wave_complete", wave_complete), ("start_wave", start_wave)):
        if wave is not None and not _is_int(wave):
            raise ProtocolError(f"{name} is not an integer")
    if stats is None and wave_complete is None and start_wave is None:
        raise ProtocolError(f"empty outputs message from engine {engine_index}")
    return EngineNotice(engine_index, stats, wave_complete, start_wave)


class Coordinator:
    """The coordinator's state and its reactions to messages; the sockets
    are `run_coordinator`'s. Pure, so its rules are testable alone."""

    def __init__(self, engine_count: int):
        self.engines = [EngineCounts() for _ in range(engine_count)]
        self.current_wave = 0
        self.engines_running = False
        self.stats_changed = False

    def published(self, with_counts: bool = True) -> bytes:
        """The message for frontends: counts (or nil), wave, running."""
        counts = [e.to_wire() for e in self.engines] if with_counts else None
        return pack([counts, self.current_wave, self.engines_running])

    def on_engine_message(self, frames: list[bytes]) -> tuple[bool, tuple[int, int] | None]:
        """Applies one engine message; returns (the wave state changed, the
        `(wave, exclude_engine_index)` START_DP_WAVE to broadcast, if any).
        Raises ProtocolError (a ValueError) for a message that is not
        an engine's counts or wave notice."""
        message = decode_engine_notice(frames)
        index = message.engine_index
        if not 0 <= index < len(self.engines):
            raise ProtocolError(f"engine index {index} is outside 0..{len(self.engines) - 1}")
        stats = message.stats
        if stats is not None:
            counts = self.engines[index]
            counts.waiting = int(stats.get("num_waiting_reqs") or 0)
            counts.running = int(stats.get("num_running_reqs") or 0)
            counts.kv_cache_usage = float(stats.get("kv_cache_usage") or 0.0)
            self.stats_changed = True
        if message.wave_complete is not None:
            wave = int(message.wave_complete)
            if self.current_wave <= wave:
                logger.debug("Moving DP wave from %d to %d.", self.current_wave, wave + 1)
                self.current_wave, self.engines_running = wave + 1, False
                return True, None
        elif message.start_wave is not None:
            wave = int(message.start_wave)
            if wave > self.current_wave or (wave == self.current_wave and not self.engines_running):
                logger.debug("Starting wave %d on notification from engine %d.", wave, index)
                self.current_wave, self.engines_running = wave, True
                return True, (wave, index)
        return False, None


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_coordinator(engine_count: int, listeners: CoordinatorListeners) -> None:
    """Process target: adopts `listeners` and coordinates `engine_count`
    engines until SIGTERM (exit 0)."""
    from vllm_rs.process.child_setup import decorate_logs, set_process_title

    set_process_title("DPCoordinator", "0")
    decorate_logs("DPCoordinator")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # serve stops it after the frontends
    signal.signal(signal.SIGTERM, _raise_interrupt)
    ctx = zmq.Context()
    sockets: list[Any] = []
    try:  # from here on a SIGTERM, however early, ends in exit 0
        for listener, kind in (
            (listeners.front_publish, zmq.XPUB),
            (listeners.engine_publish, zmq.XPUB),
            (listeners.engine_output, zmq.PULL),
        ):
            sockets.append(make_zmq_socket(ctx, listener.address, kind, linger=0, listener=listener))
        front, back_publish, back_output = sockets
        # The wakeup socket ends a wait however the kernel routed SIGTERM
        # (`vllm_rs.process.signal_wakeup`); the handler then raises here.
        with signal_wakeup() as wakeup:
            _serve(Coordinator(engine_count), front, back_publish, back_output, wakeup)
    except KeyboardInterrupt:
        logger.info("DP Coordinator process exiting")
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.term()


def _serve(state: Coordinator, front: Any, back_publish: Any, back_output: Any, wakeup: Any = None) -> None:
    subscriptions = zmq.Poller()
    for sock in (back_publish, wakeup):
        if sock is not None:
            subscriptions.register(sock, zmq.POLLIN)
    subscribed = 0
    while subscribed < len(state.engines):
        for sock, _ in subscriptions.poll():
            if sock is wakeup:
                drain(wakeup)
            elif back_publish.recv() == SUBSCRIBE:
                subscribed += 1
    back_publish.send(READY)
    logger.info("All engine subscriptions received by DP coordinator")
    poller = zmq.Poller()
    for sock in (front, back_publish, back_output, wakeup):
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    last_publish_ms = 0
    while True:
        elapsed = int(time.time() * 1000) - last_publish_ms
        interval = MIN_STATS_UPDATE_INTERVAL_MS if state.stats_changed else IDLE_PUBLISH_INTERVAL_MS
        events = dict(poller.poll(timeout=max(0, interval - elapsed)))
        if wakeup is not None and events.pop(wakeup, None):
            drain(wakeup)
            if not events:
                continue
        if not events:
            front.send(state.published())
            state.stats_changed = False
            last_publish_ms = int(time.time() * 1000)
            continue
        if back_publish in events:
            if back_publish.recv() == SUBSCRIBE:
                back_publish.send(READY)  # an engine that (re)connected waits for it
        if front in events:
            message = front.recv()
            if message not in (SUBSCRIBE, UNSUBSCRIBE):
                logger.warning("ignoring a %d-byte message from a frontend (not supported)", len(message))
        if back_output in events:
            frames = back_output.recv_multipart()
            try:
                wave_changed, start = state.on_engine_message(frames)
            except (ValueError, msgpack.UnpackException) as e:
                logger.warning("ignoring an engine message: %s", e)
                continue
            if start is not None:
                back_publish.send_multipart([REQUEST_START_DP_WAVE, pack(list(start))])
            if wave_changed:
                front.send(state.published(with_counts=False))


class CoordinatorProcManager:
    """Starts the coordinator process (`DPCoordinator_0`) on `listeners` and
    stops it. `proc` is what `wait_for_completion_or_failure` watches."""

    def __init__(self, engine_count: int, listeners: CoordinatorListeners):
        from vllm_rs.process.core import PreparedTarget

        self.addresses = listeners.addresses()
        self.proc = PreparedTarget(run_coordinator, name="DPCoordinator", args=(engine_count, listeners)).start()
        for listener in listeners.all():
            listener.close()  # the child holds them now
        logger.info("Started DP Coordinator process (PID: %d)", self.proc.pid)

    def shutdown(self, timeout: float | None = None) -> None:
        """SIGTERM, then the kill-tree after `timeout` (idempotent)."""
        from vllm_rs.process.shutdown import shutdown

        shutdown([self.proc], timeout=timeout)
