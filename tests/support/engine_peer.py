"""An engine's end of the frontend-engine sockets, for a test or benchmark
that plays the engine itself (sending outputs the reference engine never
sends: malformed, forged, or at a chosen moment). Everything else uses the
reference engine (`vllm_rs.engine.run_engine_core`, the `echo` model)."""

from __future__ import annotations

import msgpack
import zmq


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
