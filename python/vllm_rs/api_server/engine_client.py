"""The Python API server's side of the engine-core protocol, on asyncio: adopt
the input (ROUTER) and output (PULL) listeners, wait for the engines to
register, send ADD/ABORT/UTILITY, route outputs to the waiting requests,
least-loaded balancing, and failing everything when an engine dies.

Engines are not trusted blindly: every socket refuses messages larger than
`max_engine_message_bytes` (libzmq drops that connection), a malformed output
message is dropped and fails only the requests it names, a request never gets
more tokens than its `max_tokens`, and an engine with requests in flight that
stays silent for `engine_stall_timeout_s` is marked hung."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from vllm_rs.api_server.dp_coordinator import CoordinatorUpdate, follow_coordinator
from vllm_rs.api_server.engine_outputs import EngineOutputError, decode_engine_message
from vllm_rs.api_server.limits import ServerLimits
from vllm_rs.api_server.logprobs import LogprobRows
from vllm_rs.api_server.throttled_log import ThrottledWarning
from vllm_rs.engine.protocol import (
    REQUEST_ABORT,
    REQUEST_ADD,
    REQUEST_UTILITY,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    ProtocolError,
    Registration,
    RequestError,
    decode_registration,
    encode_abort,
    encode_add,
    encode_utility,
    engine_identity,
)
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener, make_zmq_socket

logger = init_logger(__name__)


class EngineUnavailableError(RuntimeError):
    """The engines are gone, or the client is shutting down."""


class RankOutOfRangeError(ValueError):
    """`X-data-parallel-rank` names an engine this server does not serve."""


class RegistrationError(RuntimeError):
    """Engines did not register as the protocol requires (names them)."""


@dataclass
class Output:
    """New tokens of a request; the last one carries the finish reason."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    #: The new tokens' logprobs, when the request asked for them.
    logprobs: LogprobRows | None = None
    #: The prompt's logprobs (with the first output), when asked for.
    prompt_logprobs: LogprobRows | None = None


@dataclass
class Failed:
    """The request failed outside the engine's control; `status` is the HTTP
    status it is answered with (503 when the engine is hung)."""

    reason: str
    status: int = 500


def request_error_status(error: RequestError) -> int:
    """The HTTP status of a request the engine finished with a RequestError,
    as vLLM's frontend maps it: 400 for a validation error, 503 for a
    retryable one, 500 otherwise."""
    if error.code == "validation_error":
        return 400
    return 503 if error.retryable else 500


@dataclass
class EngineLoad:
    """What one engine is known to be doing."""

    inflight: int = 0
    running: int = 0
    waiting: int = 0
    has_stats: bool = False

    def score(self) -> int:
        """Lower is better: in-flight count until stats arrive, then
        `max(inflight, running + waiting) + 3 * waiting`."""
        if not self.has_stats:
            return self.inflight
        return max(self.inflight, self.running + self.waiting) + 3 * self.waiting


@dataclass
class _InFlight:
    engine: int
    max_tokens: int | None
    delivered: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class RequestStream:
    """The outputs of one submitted request. `close()` before the request
    finished aborts it in its engine."""

    def __init__(self, client: EngineClient, request_id: str, engine: int, queue: asyncio.Queue):
        self.client = client
        self.request_id = request_id
        self.engine = engine
        self._queue = queue
        self.done = False

    async def next_event(self) -> Output | Failed:
        """The next event (the stream must not be done)."""
        return self._note(await self._queue.get())

    def next_queued(self) -> Output | Failed | None:
        """The next event if one is already queued."""
        if self.done or self._queue.empty():
            return None
        return self._note(self._queue.get_nowait())

    def _note(self, event: Output | Failed) -> Output | Failed:
        if isinstance(event, Failed) or event.finish_reason is not None:
            self.done = True
        return event

    def close(self) -> None:
        """Aborts the request unless it already finished."""
        if not self.done:
            self.done = True
            self.client.abort(self.request_id)


class EngineClient:
    """This API server's connection to engines `start .. start+count-1`."""

    def __init__(
        self,
        input_listener: ZmqListener,
        output_listener: ZmqListener,
        start: int,
        count: int,
        client_index: int,
        limits: ServerLimits | None = None,
        coordinator_address: str | None = None,
    ):
        self.limits = limits or ServerLimits()
        self.ctx = zmq.asyncio.Context()
        # Context-level defaults apply to every socket made below, before it
        # binds, so no connection is ever accepted without the size limit.
        self.ctx.setsockopt(zmq.MAXMSGSIZE, self.limits.max_engine_message_bytes)
        self.router = make_zmq_socket(self.ctx, input_listener.address, zmq.ROUTER, linger=0, listener=input_listener)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Without handover a second connection claiming a connected engine's
        # identity is refused by libzmq instead of taking over its routing.
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 0)
        # Sends go through a blocking view of the same socket, so that a failed
        # send raises here instead of landing in a Future nobody awaits.
        self._router_sender = zmq.Socket.shadow(self.router.underlying)
        self.pull = make_zmq_socket(self.ctx, output_listener.address, zmq.PULL, linger=0, listener=output_listener)
        self.start = start
        self.count = count
        self.client_index = client_index
        #: The data-parallel coordinator's publish address, if any.
        self.coordinator_address = coordinator_address
        #: The request wave the coordinator last published (0 without one).
        self.current_wave = 0
        self.loads = [EngineLoad() for _ in range(count)]
        self.failure: str | None = None
        self.stopping = False
        self.hung: set[int] = set()
        self._quiet_since = [time.monotonic()] * count
        self._probing: set[int] = set()
        self._requests: dict[str, _InFlight] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count(1)
        self._tie_break = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._warn_malformed = ThrottledWarning(logger)
        self._warn_unexpected_input = ThrottledWarning(logger)

    # ---- start-up ----

    async def wait_for_engines(self, timeout: float) -> list[Registration]:
        """Waits until every engine has sent one registration; raises
        RegistrationError for a stranger, a duplicate, a bad payload, or on
        timeout (naming the missing engines)."""
        deadline = time.monotonic() + timeout
        registered: dict[int, Registration] = {}
        last = self.start + self.count - 1
        while len(registered) < self.count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self.router.poll(remaining * 1000, zmq.POLLIN):
                missing = ", ".join(str(i) for i in range(self.start, last + 1) if i not in registered)
                raise RegistrationError(
                    f"timed out after {timeout:.1f}s waiting for engines to register; missing engine(s): {missing}"
                )
            frames = await self.router.recv_multipart()
            identity = frames[0]
            if len(identity) != 2:
                raise RegistrationError(
                    f"registration from a peer whose identity {identity!r} is not a 2-byte engine index"
                )
            index = int.from_bytes(identity, "little")
            if not self.start <= index <= last:
                raise RegistrationError(
                    f"engine {index} registered, but this server serves engines {self.start}..={last}"
                )
            if index in registered:
                raise RegistrationError(f"engine {index} registered twice")
            try:
                registered[index] = decode_registration(frames[-1] if len(frames) > 1 else b"")
            except (ProtocolError, ValueError, msgpack.UnpackException) as e:
                raise RegistrationError(f"engine {index} sent a bad registration: {e}") from None
            logger.info("engine %d registered (%d/%d)", index, len(registered), self.count)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        self._quiet_since = [now] * self.count
        self._tasks = [
            loop.create_task(self._receive_outputs()),
            loop.create_task(self._discard_input_messages()),
            loop.create_task(self._watch_for_stalls()),
        ]
        if self.coordinator_address is not None:
            self._tasks.append(
                loop.create_task(follow_coordinator(self.ctx, self.coordinator_address, self.apply_coordinator_update))
            )
        return [registered[i] for i in sorted(registered)]

    # ---- requests ----

    @property
    def inflight(self) -> int:
        """Requests in flight over all engines."""
        return len(self._requests)

    def inflight_of(self, engine: int) -> int:
        """Requests in flight on `engine` (0 for one this server does not serve)."""
        slot = engine - self.start
        return self.loads[slot].inflight if 0 <= slot < self.count else 0

    def engine_indices(self) -> range:
        """The engines this server talks to."""
        return range(self.start, self.start + self.count)

    @property
    def unhealthy(self) -> str | None:
        """Why the engines are not usable (dead, or some hung), else None."""
        if self.failure is not None:
            return self.failure
        if self.hung:
            hung = ", ".join(str(i) for i in sorted(self.hung))
            return f"engine(s) {hung} not responding: nothing received for {self.limits.engine_stall_timeout_s:g}s"
        return None

    def submit(self, request: EngineCoreRequest, pinned_rank: int | None) -> RequestStream:
        """Sends `request` to engine `pinned_rank`, else the least loaded one
        (one that is not hung while there is one); raises
        EngineUnavailableError when the engines are dead or that one is hung."""
        if self.failure is not None:
            raise EngineUnavailableError(self.failure)
        if self.stopping:
            raise EngineUnavailableError("the server is shutting down")
        if pinned_rank is not None:
            if not self.start <= pinned_rank < self.start + self.count:
                raise RankOutOfRangeError(
                    f"data parallel rank {pinned_rank} is out of range: this frontend serves engines "
                    f"{self.start}..={self.start + self.count - 1}"
                )
            engine = pinned_rank
        else:
            engine = self.start + self._least_loaded()
        if engine in self.hung:
            # Only when every engine is hung, or this one was asked for: the
            # request would wait for the stall timeout just to fail.
            raise EngineUnavailableError(
                f"engine {engine} is not responding: nothing received for {self.limits.engine_stall_timeout_s:g}s"
            )
        request.data_parallel_rank = pinned_rank
        request.client_index = self.client_index
        request.current_wave = self.current_wave
        max_tokens = request.sampling_params.get("max_tokens")
        entry = _InFlight(engine, max_tokens if isinstance(max_tokens, int) else None)
        self._requests[request.request_id] = entry
        load = self.loads[engine - self.start]
        if load.inflight == 0:
            # The stall clock of an idle engine starts with its first request.
            self._quiet_since[engine - self.start] = time.monotonic()
        load.inflight += 1
        if not self._send(engine, REQUEST_ADD, encode_add(request)):
            self._finish(request.request_id, Failed(f"cannot send to engine {engine}"))
        return RequestStream(self, request.request_id, engine, entry.queue)

    def abort(self, request_id: str) -> None:
        """Forgets `request_id` and sends ABORT to its engine if still in flight."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self.loads[entry.engine - self.start].inflight -= 1
            self._send(entry.engine, REQUEST_ABORT, encode_abort([request_id]))

    def abort_all(self, reason: str, status: int = 500) -> None:
        """Fails every request in flight with `reason` (answered with HTTP
        `status`) and aborts it."""
        for request_id in list(self._requests):
            entry = self._requests.get(request_id)
            if entry is None:
                continue  # failed meanwhile: a refused send fails its engine's requests
            self._finish(request_id, Failed(reason, status))
            self._send(entry.engine, REQUEST_ABORT, encode_abort([request_id]))

    async def call_utility(self, engine: int, method: str, args: list[Any], timeout: float) -> Any:
        """Calls `method(*args)` on `engine`; raises EngineUnavailableError with
        the engine's failure message, or on timeout."""
        if self.failure is not None:
            raise EngineUnavailableError(self.failure)
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            if not self._send(engine, REQUEST_UTILITY, encode_utility(self.client_index, call_id, method, args)):
                raise EngineUnavailableError(f"cannot send to engine {engine}")
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailableError(
                f"utility call {method} to engine {engine} timed out after {timeout}s"
            ) from None
        finally:
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        """Stops receiving and closes the sockets."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.router.close(linger=0)
        self.pull.close(linger=0)
        self.ctx.term()

    def apply_coordinator_update(self, update: CoordinatorUpdate) -> None:
        """The coordinator's latest state: new requests join its wave, and
        the counts of this server's engines steer balancing."""
        self.current_wave = update.current_wave
        if update.counts is None:
            return
        for load, (waiting, running) in zip(self.loads, update.counts[self.start : self.start + self.count]):
            load.waiting, load.running, load.has_stats = waiting, running, True

    # ---- internals ----

    def _least_loaded(self) -> int:
        offset = next(self._tie_break) % self.count
        slots = [(i + offset) % self.count for i in range(self.count)]
        # A hung engine gets requests only when every engine is hung.
        return min(slots, key=lambda slot: (self.start + slot in self.hung, self.loads[slot].score()))

    def _send(self, engine: int, kind: bytes, payload: bytes) -> bool:
        try:
            self._router_sender.send_multipart([engine_identity(engine), kind, payload], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:
            logger.warning("cannot send to engine %d: %s", engine, e)
            if e.errno == zmq.EHOSTUNREACH:
                self._fail_engine_requests(engine, f"cannot send to engine {engine}: it is not connected")
            return False

    def _fail_engine_requests(self, engine: int, reason: str) -> None:
        """The engine's own connection is gone (ROUTER_MANDATORY refused a
        send): nothing it had in flight can be answered any more."""
        for request_id in [r for r, entry in self._requests.items() if entry.engine == engine]:
            self._finish(request_id, Failed(reason))

    def _finish(self, request_id: str, event: Output | Failed) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self.loads[entry.engine - self.start].inflight -= 1
            entry.queue.put_nowait(event)

    def fail_all(self, reason: str) -> None:
        """The engines are unusable: fails everything in flight and to come."""
        logger.error("%s", reason)
        if self.failure is None:
            self.failure = reason
        for request_id in list(self._requests):
            self._finish(request_id, Failed(self.failure))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineUnavailableError(self.failure))

    async def _receive_outputs(self) -> None:
        while True:
            # copy=False: the message is read straight from libzmq's buffer,
            # never copied whole into a bytes object first.
            frames = await self.pull.recv_multipart(copy=False)
            try:
                message = decode_engine_message([frame.buffer for frame in frames])
            except EngineOutputError as e:
                self._drop_malformed(e)
                continue
            finally:
                del frames
            if message is None:
                self.fail_all("engine core died (ENGINE_CORE_DEAD); requests in flight were failed")
                continue
            self._heard_from(message.engine_index)
            if message.utility_output is not None:
                self._dispatch_utility(message)
            else:
                self._dispatch_batch(message)
            # recv returns without suspending while messages wait: an engine
            # faster than this loop would otherwise starve every handler.
            await asyncio.sleep(0)

    def _drop_malformed(self, error: EngineOutputError) -> None:
        """Fails only the requests a malformed message named."""
        named = [r for r in error.request_ids if r in self._requests]
        self._warn_malformed(
            "dropping a malformed engine message (%s); failing %d request(s) it named", error, len(named)
        )
        for request_id in named:
            entry = self._requests.get(request_id)
            if entry is None:
                continue  # failed meanwhile: a refused send fails its engine's requests
            self._finish(request_id, Failed(f"engine {entry.engine} sent a malformed output for this request"))
            self._send(entry.engine, REQUEST_ABORT, encode_abort([request_id]))

    async def _discard_input_messages(self) -> None:
        """Engines send nothing on the input socket after registering; reading
        and dropping whatever comes keeps it from piling up in memory."""
        while True:
            frames = await self.router.recv_multipart(copy=False)
            self._warn_unexpected_input(
                "dropping an unexpected %d-frame message on the engine input socket", len(frames)
            )
            del frames

    def _heard_from(self, engine: int) -> None:
        slot = engine - self.start
        if not 0 <= slot < self.count:
            return
        self._quiet_since[slot] = time.monotonic()
        self._probing.discard(engine)
        if engine in self.hung:
            self.hung.discard(engine)
            logger.info("engine %d is answering again", engine)

    async def _watch_for_stalls(self) -> None:
        """Marks engines hung (and fails their requests with 503) when they
        have requests in flight and sent nothing for the stall timeout."""
        timeout = self.limits.engine_stall_timeout_s
        while True:
            await asyncio.sleep(min(timeout / 4, 1.0))
            now = time.monotonic()
            for slot, load in enumerate(self.loads):
                engine = self.start + slot
                if engine in self.hung:
                    self._probe(engine)
                elif load.inflight and now - self._quiet_since[slot] > timeout:
                    self._mark_hung(engine)

    def _mark_hung(self, engine: int) -> None:
        self.hung.add(engine)
        reason = f"engine {engine} is not responding: nothing received for {self.limits.engine_stall_timeout_s:g}s"
        stuck = [r for r, entry in self._requests.items() if entry.engine == engine]
        logger.error("%s; failing its %d request(s) in flight", reason, len(stuck))
        for request_id in stuck:
            self._finish(request_id, Failed(reason, status=503))
        if stuck:
            self._send(engine, REQUEST_ABORT, encode_abort(stuck))
        self._probe(engine)

    def _probe(self, engine: int) -> None:
        """One cheap utility call per hung episode: any answer clears it."""
        if engine not in self._probing and self.failure is None:
            call = encode_utility(self.client_index, next(self._call_ids), "is_sleeping", [])
            if self._send(engine, REQUEST_UTILITY, call):
                self._probing.add(engine)

    def _dispatch_utility(self, message: EngineCoreOutputs) -> None:
        reply = message.utility_output
        future = self._calls.get(reply.call_id)
        if future is None or future.done():
            logger.debug("dropping a utility reply nobody waits for (call %s)", reply.call_id)
        elif reply.failure_message is not None:
            future.set_exception(EngineUnavailableError(reply.failure_message))
        else:
            future.set_result(reply.result)

    def _dispatch_batch(self, message: EngineCoreOutputs) -> None:
        stats = message.scheduler_stats
        slot = message.engine_index - self.start
        if stats is not None and 0 <= slot < self.count:
            load = self.loads[slot]
            load.running = stats["num_running_reqs"]
            load.waiting = stats["num_waiting_reqs"]
            load.has_stats = True
        requests = self._requests
        for output in message.outputs:
            entry = requests.get(output.request_id)
            if entry is None:
                continue  # unknown, aborted or failed already
            if output.error is not None:
                # Refused or failed in the engine: nothing it generated counts (as in vLLM).
                self._finish(output.request_id, Failed(output.error.message, request_error_status(output.error)))
                continue
            event = Output(
                output.new_token_ids,
                output.finish_reason,
                output.stop_reason,
                None if output.new_logprobs is None else LogprobRows.of(output.new_logprobs),
                None if output.new_prompt_logprobs is None else LogprobRows.of(output.new_prompt_logprobs),
            )
            if entry.max_tokens is not None and entry.delivered + len(event.token_ids) >= entry.max_tokens:
                event = self._cap_at_max_tokens(output.request_id, entry, event)
            entry.delivered += len(event.token_ids)
            if event.finish_reason is not None:
                self._finish(output.request_id, event)
            else:
                entry.queue.put_nowait(event)
        # Finished in the engine without a final output: end them as aborted.
        for request_id in message.finished_requests or ():
            self._finish(request_id, Output([], FinishReason.ABORT))

    def _cap_at_max_tokens(self, request_id: str, entry: _InFlight, event: Output) -> Output:
        """The request reached `max_tokens`: it ends here with LENGTH whatever
        the engine says; an engine that would go on is told to abort."""
        room = entry.max_tokens - entry.delivered
        if len(event.token_ids) <= room and event.finish_reason is not None:
            return event
        if len(event.token_ids) > room:
            logger.warning(
                "engine %d sent %d token(s) past max_tokens=%d for %s: capped",
                entry.engine, entry.delivered + len(event.token_ids) - entry.max_tokens, entry.max_tokens, request_id,
            )  # fmt: skip
        self._send(entry.engine, REQUEST_ABORT, encode_abort([request_id]))
        logprobs = None if event.logprobs is None else event.logprobs.head(room)
        return Output(event.token_ids[:room], FinishReason.LENGTH, None, logprobs, event.prompt_logprobs)
