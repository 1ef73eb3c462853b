"""The Python API server's subscription to the data-parallel coordinator
(`vllm_rs.coordinator`, or vLLM's `DPCoordinator`), as vLLM's
`DPAsyncMPClient` does it: an XSUB connected to the coordinator's front
publish address, subscribed to everything, reading msgpack
`[counts, current_wave, engines_running]` messages (`counts`: one
`[waiting, running, kv_cache_usage]` per engine of the deployment, or nil
for a wave change only). Only the latest message matters, so whatever is
queued is drained and the last one applied."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

from vllm_rs.logger import init_logger
from vllm_rs.network_utils import make_zmq_socket

logger = init_logger(__name__)


@dataclass
class CoordinatorUpdate:
    """One published message, checked."""

    #: `(waiting, running)` per engine, by engine index; None for a wave-only message.
    counts: list[tuple[int, int]] | None
    current_wave: int
    engines_running: bool


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is not a non-negative integer: {value!r:.50}")
    return value


def decode_update(buf: bytes) -> CoordinatorUpdate:
    """Decodes one message; raises ValueError naming what is wrong."""
    try:
        message = msgpack.unpackb(buf)
    except (msgpack.UnpackException, ValueError) as e:
        raise ValueError(f"undecodable coordinator message: {e}") from None
    if not isinstance(message, list) or len(message) != 3:
        raise ValueError("a coordinator message is [counts, current_wave, engines_running]")
    counts, wave, running = message
    if not isinstance(running, bool):
        raise ValueError("engines_running is not a boolean")
    decoded = None
    if counts is not None:
        if not isinstance(counts, list) or not all(isinstance(c, list) and 2 <= len(c) <= 3 for c in counts):
            raise ValueError("counts are not a list of [waiting, running, kv_cache_usage]")
        decoded = [(_count(c[0], "waiting"), _count(c[1], "running")) for c in counts]
    return CoordinatorUpdate(decoded, _count(wave, "current_wave"), running)


async def follow_coordinator(
    ctx: zmq.asyncio.Context, address: str, apply: Callable[[CoordinatorUpdate], None]
) -> None:
    """Subscribes to the coordinator at `address` and calls `apply` with the
    latest message each time some arrive, until cancelled. libzmq reconnects
    (and resubscribes) by itself; a malformed message is logged and skipped."""
    sock = make_zmq_socket(ctx, address, zmq.XSUB, bind=False, linger=0)
    try:
        await sock.send(b"\x01")
        logger.info("following the data-parallel coordinator at %s", address)
        while True:
            buf = await sock.recv()
            while True:  # only the latest counts matter
                try:
                    buf = sock.recv(zmq.NOBLOCK).result()
                except zmq.Again:
                    break
            try:
                update = decode_update(buf)
            except ValueError as e:
                logger.warning("%s; skipped", e)
                continue
            apply(update)
    finally:
        sock.close(linger=0)
