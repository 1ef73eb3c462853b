"""An engine core's side of the data-parallel coordinator, as vLLM 0.33's
engines behave with one (`docs/serve.md`, "Data parallelism").

- Start-up: an XSUB to the coordinator's engine publish socket subscribes
  and waits for `READY` before the engine registers with any frontend.
- Counts: whenever the engine's (waiting, running) counts change, it pushes
  `EngineCoreOutputs(scheduler_stats=...)` to the coordinator, which
  publishes every engine's counts to the frontends for balancing.
- Waves: a request carries the wave its frontend saw (`current_wave`), and
  an engine behind it catches up. An engine that has work while its wave
  loop is paused starts the wave (`start_wave` to the coordinator, which
  sends `START_DP_WAVE` to the other engines, and they join it). When the
  wave's work is done, rank 0 reports `wave_complete` and every engine
  moves to the next wave. vLLM's engines decide "done"
  with an all-reduce across ranks; the reference engine has no collective,
  so each rank's own idleness stands in for it (rank 0's decides the
  coordinator's wave).
"""

from __future__ import annotations

import zmq

from vllm_rs.engine.config import CoordinatorAddresses
from vllm_rs.engine.protocol import REQUEST_START_DP_WAVE, EngineCoreOutputs, encode_outputs, unpack
from vllm_rs.engine.stats import SchedulerStats
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import make_zmq_socket

logger = init_logger(__name__)

#: Sent by the coordinator once every engine subscribed.
READY = b"READY"
#: How often a wait for READY logs that it is still waiting.
READY_LOG_INTERVAL_MS = 10_000


class CoordinatorLink:
    """Engine `engine_index`'s sockets to the coordinator and its wave state."""

    def __init__(self, ctx: zmq.Context, addresses: CoordinatorAddresses, engine_index: int):
        self.engine_index = engine_index
        self.current_wave = 0
        #: Whether this engine takes part in a running wave.
        self.engines_running = False
        #: Waves this engine started or joined (a count, for its log).
        self.waves_run = 0
        #: The highest `current_wave` a request arrived with (for its log).
        self.highest_request_wave = 0
        self._last_counts: tuple[int, int] | None = (0, 0)
        self.push = make_zmq_socket(ctx, addresses.engine_output, zmq.PUSH, bind=False, linger=0)
        self.sub = make_zmq_socket(ctx, addresses.engine_publish, zmq.XSUB, bind=False, linger=0)
        self.sub.send(b"\x01")  # subscribe to everything

    def wait_ready(self) -> None:
        """Blocks until the coordinator says every engine has subscribed."""
        while True:
            if self.sub.poll(READY_LOG_INTERVAL_MS):
                frames = self.sub.recv_multipart()
                if frames == [READY]:
                    return
                self.on_message(frames)
            else:
                logger.info("Waiting for READY message from DP Coordinator...")

    def on_message(self, frames: list[bytes]) -> None:
        """Handles a message from the coordinator: `READY` (again, after a
        reconnect) or `[START_DP_WAVE, (wave, exclude_engine_index)]`."""
        if frames == [READY]:
            return
        if len(frames) != 2 or frames[0] != REQUEST_START_DP_WAVE:
            logger.warning("ignoring a message from the DP coordinator: %r", [f[:16] for f in frames])
            return
        try:
            wave, exclude = unpack(frames[1])
            wave = int(wave)
        except (ValueError, TypeError) as e:
            logger.warning("ignoring a malformed START_DP_WAVE: %s", e)
            return
        if exclude != self.engine_index and wave >= self.current_wave:
            self.current_wave = wave
            if not self.engines_running:
                logger.debug("EngineCore_%d joining wave %d.", self.engine_index, wave)
                self._begin_wave()

    def on_request(self, request_wave: int) -> None:
        """A request of wave `request_wave` arrived: catch up with its wave."""
        self.highest_request_wave = max(self.highest_request_wave, request_wave)
        if request_wave > self.current_wave:
            self.current_wave = request_wave

    def publish_counts(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        """Pushes the counts to the coordinator if they changed."""
        if (running, waiting) == self._last_counts:
            return
        self._last_counts = (running, waiting)
        stats = SchedulerStats(
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            current_wave=self.current_wave,
            kv_cache_usage=kv_cache_usage,
        )
        self._send(EngineCoreOutputs(engine_index=self.engine_index, scheduler_stats=stats.to_wire()))

    def track(self, has_work: bool) -> None:
        """Called once per loop turn: work while paused starts a wave
        everywhere (vLLM's engines do it when a request reaches an idle
        engine); no work while running ends it here."""
        if has_work and not self.engines_running:
            self._begin_wave()
            self._send(EngineCoreOutputs(engine_index=self.engine_index, start_wave=self.current_wave))
        elif not has_work and self.engines_running:
            self._end_wave()

    def _end_wave(self) -> None:
        self.engines_running = False
        if self.engine_index == 0:
            logger.debug("Wave %d finished, pausing engine loop.", self.current_wave)
            self._send(EngineCoreOutputs(engine_index=self.engine_index, wave_complete=self.current_wave))
        self.current_wave += 1

    def close(self, linger: int) -> None:
        """Closes both sockets."""
        self.push.close(linger=linger)
        self.sub.close(linger=0)

    def _begin_wave(self) -> None:
        self.engines_running = True
        self.waves_run += 1

    def _send(self, message: EngineCoreOutputs) -> None:
        self.push.send(encode_outputs(message))
