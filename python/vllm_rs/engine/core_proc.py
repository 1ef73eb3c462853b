"""The engine-core process: connects to every frontend (a DEALER with the
engine's 2-byte identity to its input socket, a PUSH to its output socket),
registers with vLLM 0.33's full ready response, then loops: take
ADD/ABORT/UTILITY messages, run a step, send each request's outputs (with
scheduler stats and the ids finished since the last message) to the
frontend named by its `client_index`.

SIGTERM ends it cleanly (exit 0). SIGINT is ignored: a Ctrl-C at the
terminal lets the frontends drain first, and the supervisor stops the
engines after them. Any failure sends `ENGINE_CORE_DEAD` to every frontend
and exits 1.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any

import zmq

from vllm_rs.engine.config import EngineConfig
from vllm_rs.engine.core import EngineCore, WhenIdle
from vllm_rs.engine.dp_coordination import CoordinatorLink
from vllm_rs.engine.protocol import (
    ENGINE_CORE_DEAD,
    REQUEST_ABORT,
    REQUEST_ADD,
    REQUEST_START_DP_WAVE,
    REQUEST_UTILITY,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityCall,
    UtilityOutput,
    encode_outputs,
    encode_ready_response,
    engine_identity,
    unpack,
)
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import make_zmq_socket
from vllm_rs.process.signal_wakeup import drain, signal_wakeup

logger = init_logger(__name__)

#: How long `ENGINE_CORE_DEAD` may wait to be delivered before the exit.
DEAD_MESSAGE_LINGER_MS = 1000
#: ZMTP heartbeat interval of the engine sockets when `heartbeat_ttl_s` is set.
HEARTBEAT_INTERVAL_MS = 1000


class EngineShutdown(BaseException):
    """Raised by the SIGTERM handler to leave the loop; a BaseException, like
    SystemExit, so that no `except Exception` on the way swallows it."""


def _raise_shutdown(signum: int, frame: Any) -> None:
    raise EngineShutdown(signal.Signals(signum).name)


def run_engine_core(
    vllm_config: EngineConfig,
    on_head_node: bool = True,
    input_address: str | None = None,
    executor_class: Any = None,
    log_stats: bool = True,
    dp_rank: int = 0,
    local_dp_rank: int = 0,
) -> None:
    """Target of `CoreEngineProcManager`: runs engine `dp_rank` until SIGTERM
    (exit 0) or a failure (ENGINE_CORE_DEAD, exit 1). The frontends' addresses
    come from `vllm_config.clients`; `input_address` is not used."""
    signal.signal(signal.SIGTERM, _raise_shutdown)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from vllm_rs.process.child_setup import set_process_title

    set_process_title("EngineCore", str(dp_rank))
    with signal_wakeup() as wakeup:
        proc = EngineCoreProc(vllm_config, dp_rank, wakeup=wakeup)
        try:
            proc.run()
        except EngineShutdown:
            proc.log_totals()
            proc.close(linger=0)
        except Exception:
            logger.exception("EngineCore_%d failed", dp_rank)
            proc.send_dead()
            proc.close(linger=DEAD_MESSAGE_LINGER_MS)
            sys.exit(1)


class EngineCoreProc:
    """An EngineCore behind its ZeroMQ sockets."""

    def __init__(self, config: EngineConfig, engine_index: int, wakeup: socket.socket | None = None):
        if not config.clients:
            raise ValueError("the engine config names no frontend (clients is empty)")
        self.config = config
        self.engine_index = engine_index
        self.ctx = zmq.Context()
        if config.heartbeat_ttl_s is not None:
            # Context defaults apply to every socket made below, before it connects.
            ttl_ms = int(config.heartbeat_ttl_s * 1000)
            self.ctx.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_INTERVAL_MS)
            self.ctx.setsockopt(zmq.HEARTBEAT_TTL, ttl_ms)
            self.ctx.setsockopt(zmq.HEARTBEAT_TIMEOUT, ttl_ms)
        self.core: EngineCore | None = None
        # Outputs first, so that a failure while loading can still be reported.
        self.pushes = [make_zmq_socket(self.ctx, c.output_address, zmq.PUSH, bind=False) for c in config.clients]
        self.dealers: list[Any] = []
        #: The data-parallel coordinator, when the stack has one.
        self.coordinator = (
            CoordinatorLink(self.ctx, config.coordinator, engine_index) if config.coordinator is not None else None
        )
        self._sent_stats_to: set[int] = set()
        #: Utility calls answered (None) once no request runs: (client, call id).
        self._replies_when_idle: list[tuple[int, int]] = []
        #: Polled with the engine sockets, so that SIGTERM ends a blocking poll
        #: whichever thread the kernel gave it to (`vllm_rs.process.signal_wakeup`).
        self.wakeup = wakeup

    def run(self) -> None:
        """Loads the model, registers with every frontend, then serves."""
        self.core = EngineCore(self.config, self.engine_index)
        identity = engine_identity(self.engine_index)
        if self.coordinator is not None:
            self.coordinator.wait_ready()  # as vLLM: no registration before the coordinator is ready
        registration = encode_ready_response(self.core.ready_response())
        for client in self.config.clients:
            dealer = make_zmq_socket(
                self.ctx, client.input_address, zmq.DEALER, bind=False, identity=identity, linger=0
            )
            # Kept before the send: a SIGTERM that ends a send still waiting for
            # its frontend must find the socket to close, or `close` waits forever.
            self.dealers.append(dealer)
            dealer.send(registration)
        logger.info(
            "EngineCore_%d ready (pid %d): model %s, max_model_len %d, %d client(s)",
            self.engine_index, os.getpid(), self.config.model_config.model, self.core.max_model_len, len(self.dealers),
        )  # fmt: skip
        poller = zmq.Poller()
        for dealer in self.dealers:
            poller.register(dealer, zmq.POLLIN)
        coordinator = self.coordinator
        if coordinator is not None:
            poller.register(coordinator.sub, zmq.POLLIN)
        wakeup = self.wakeup
        if wakeup is not None:
            poller.register(wakeup, zmq.POLLIN)
        core = self.core
        while True:
            busy = core.has_work()
            for sock, _ in poller.poll(0 if busy else None):
                if sock is wakeup:
                    drain(wakeup)  # the handler has run by now
                else:
                    self._drain(sock)
            self._publish_counts()
            if core.has_work():
                self._send_outputs(core.step())
                self._publish_counts()
            elif busy:
                self._send_idle_stats()
            if coordinator is not None:
                coordinator.track(core.has_work())
            if self._replies_when_idle and not core.scheduler.running:
                self._send_replies_when_idle()

    def _drain(self, sock: Any) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if self.coordinator is not None and sock is self.coordinator.sub:
                self.coordinator.on_message(frames)
            else:
                self._handle(frames)

    def _publish_counts(self) -> None:
        if self.coordinator is not None:
            scheduler = self.core.scheduler
            kv = scheduler.kv_cache_manager
            self.coordinator.publish_counts(scheduler.num_running, scheduler.num_waiting, kv.usage if kv else 0.0)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            logger.warning("ignoring a message of %d frame(s) on the input socket", len(frames))
            return
        kind, payload = frames[0], frames[-1]
        try:
            if kind == REQUEST_ADD:
                request = EngineCoreRequest.from_wire(unpack(payload))
                if not 0 <= request.client_index < len(self.pushes):
                    logger.warning("dropping request %s: no client %d", request.request_id, request.client_index)
                    return
                if self.coordinator is not None:
                    self.coordinator.on_request(request.current_wave)
                error = self.core.add_request(request)
                if error is not None:
                    self._send_outputs([(request.client_index, error)])
            elif kind == REQUEST_ABORT:
                self.core.abort_requests([str(i) for i in unpack(payload)])
            elif kind == REQUEST_UTILITY:
                self._call_utility(UtilityCall.from_wire(unpack(payload)))
            elif kind == REQUEST_START_DP_WAVE:
                logger.debug("ignoring START_DP_WAVE from a frontend (waves come from the coordinator)")
            else:
                logger.warning("ignoring a message of unknown type %r", kind[:4])
        except ValueError as e:  # undecodable or malformed payloads
            logger.warning("ignoring a malformed %r message: %s", kind[:4], e)

    def _call_utility(self, call: UtilityCall) -> None:
        if not 0 <= call.client_index < len(self.pushes):
            logger.warning("dropping utility call %s: no client %d", call.method, call.client_index)
            return
        try:
            result = self.core.call_utility(call.method, call.args)
        except Exception as e:  # a failing utility call fails the call, not the engine
            logger.warning("utility call %s failed: %s", call.method, e)
            # vLLM's wording, so its clients' messages read the same.
            self._send_reply(
                call.client_index, UtilityOutput(call.call_id, f"Call to {call.method} method failed: {e}")
            )
            return
        finally:
            self._send_outputs(self.core.take_pending_outputs())
        if isinstance(result, WhenIdle):
            self._replies_when_idle.append((call.client_index, call.call_id))
        else:
            self._send_reply(call.client_index, UtilityOutput(call.call_id, result=result))

    def _send_reply(self, client_index: int, reply: UtilityOutput) -> None:
        message = EngineCoreOutputs(engine_index=self.engine_index, utility_output=reply, timestamp=time.monotonic())
        self.pushes[client_index].send(encode_outputs(message))

    def _send_replies_when_idle(self) -> None:
        replies, self._replies_when_idle = self._replies_when_idle, []
        for client_index, call_id in replies:
            self._send_reply(client_index, UtilityOutput(call_id, result=None))

    def _send_outputs(self, outputs: list[tuple[int, EngineCoreOutput]]) -> None:
        if not outputs:
            return
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for client_index, output in outputs:
            by_client.setdefault(client_index, []).append(output)
        # Every frontend balances on these counts, so each one with outputs
        # gets them (vLLM sends them to one, and has a coordinator for the rest).
        stats = self.core.scheduler_stats().to_wire()
        now = time.monotonic()
        for client_index, client_outputs in by_client.items():
            finished = self.core.take_finished(client_index) or None
            message = EngineCoreOutputs(self.engine_index, client_outputs, stats, now, finished_requests=finished)
            self.pushes[client_index].send(encode_outputs(message))
            self._sent_stats_to.add(client_index)

    def _send_idle_stats(self) -> None:
        """Tells the frontends that had outputs that this engine is idle now,
        with the ids that finished (aborts) since their last message."""
        stats = self.core.scheduler_stats().to_wire()
        for client_index in self._sent_stats_to:
            finished = self.core.take_finished(client_index) or None
            message = EngineCoreOutputs(self.engine_index, [], stats, time.monotonic(), finished_requests=finished)
            self.pushes[client_index].send(encode_outputs(message))
        self._sent_stats_to.clear()

    def log_totals(self) -> None:
        """Logs what this engine did, as it stops."""
        if self.core is not None:
            t = self.core.totals
            logger.info(
                "EngineCore_%d stopped: %d requests finished, %d aborted, %d prompt tokens, %d generated tokens, %d steps",
                self.engine_index, t["requests_finished"], t["requests_aborted"], t["prompt_tokens_computed"],
                t["generation_tokens"], t["steps"],
            )  # fmt: skip
            if self.coordinator is not None:
                logger.info(
                    "EngineCore_%d took part in %d data-parallel wave(s); highest request wave %d, current wave %d",
                    self.engine_index, self.coordinator.waves_run, self.coordinator.highest_request_wave,
                    self.coordinator.current_wave,
                )  # fmt: skip

    def send_dead(self) -> None:
        """Sends `ENGINE_CORE_DEAD` to every frontend (best effort)."""
        for push in self.pushes:
            try:
                push.send(ENGINE_CORE_DEAD, zmq.NOBLOCK)
            except zmq.ZMQError as e:
                logger.warning("could not send ENGINE_CORE_DEAD: %s", e)

    def close(self, linger: int) -> None:
        """Closes the sockets, waiting at most `linger` ms for queued sends."""
        for sock in [*self.dealers, *self.pushes]:
            sock.close(linger=linger)
        if self.coordinator is not None:
            self.coordinator.close(linger)
        # Any socket not closed above (none is meant to be) would make a plain
        # `term` wait forever; `destroy` closes it at once.
        self.ctx.destroy(linger=0)
