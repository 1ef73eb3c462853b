"""An engine's end of the frontend-engine sockets, for a test or benchmark
that plays the engine itself (sending outputs the reference engine never
sends: malformed, forged, or at a chosen moment). Everything else uses the
reference engine (`vllm_rs.engine.run_engine_core`, the `echo` model)."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq

from tests.support.wait import DEADLINE_S

ADD, ABORT = b"\x00", b"\x01"
FINISH_LENGTH = 1


def connect_as_engine(input_address: str, output_address: str, rank: int, max_model_len: int):
    """Connects an engine's DEALER (identity = `rank`, 2 bytes LE) and PUSH
    (unbounded queue) and sends its registration. Returns (ctx, dealer, push)."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, rank.to_bytes(2, "little"))
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(input_address)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(output_address)
    registration = {"max_model_len": max_model_len, "num_gpu_blocks": 64, "dp_stats_address": None}
    dealer.send(msgpack.packb(registration))
    return ctx, dealer, push


class ScriptedEngine:
    """Engine 0 played by the test: a real DEALER/PUSH pair registered with
    the frontend at `server.input_address` / `server.output_address`; the
    test reads ADDs and pushes whatever outputs it wants."""

    def __init__(self, server: Any, max_model_len: int = 512):
        self.ctx, self.dealer, self.push = connect_as_engine(
            server.input_address, server.output_address, 0, max_model_len
        )
        self.aborted: list[str] = []

    def next_add(self, timeout_s: float = DEADLINE_S) -> tuple[str, list[int], dict[str, Any]]:
        """The next ADD (request id, prompt, sampling params); ABORTs met on
        the way are recorded in `aborted`."""
        message = msgpack.unpackb(self.next_add_payload(timeout_s), strict_map_key=False)
        return message[0], message[1], message[3]

    def next_add_payload(self, timeout_s: float = DEADLINE_S) -> bytes:
        """The msgpack payload of the next ADD, as it came; ABORTs met on the
        way are recorded in `aborted`."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.dealer.poll(remaining * 1000), "no ADD arrived"
            kind, payload = self.dealer.recv_multipart()
            if kind == ADD:
                return payload
            if kind == ABORT:
                self.aborted.extend(msgpack.unpackb(payload))

    def wait_for_abort(self, request_id: str, timeout_s: float = DEADLINE_S) -> None:
        """Returns once ABORT for `request_id` arrived."""
        deadline = time.monotonic() + timeout_s
        while request_id not in self.aborted:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.dealer.poll(remaining * 1000), f"no ABORT for {request_id}"
            kind, payload = self.dealer.recv_multipart()
            if kind == ABORT:
                self.aborted.extend(msgpack.unpackb(payload))

    def send_outputs(self, outputs: list[list[Any]]) -> None:
        """Pushes one well-formed batch."""
        self.push.send(msgpack.packb([0, outputs, {"num_running_reqs": 0, "num_waiting_reqs": 0}, time.time()]))

    def close(self) -> None:
        """Closes the sockets and the context."""
        self.dealer.close(linger=0)
        self.push.close(linger=0)
        self.ctx.term()
