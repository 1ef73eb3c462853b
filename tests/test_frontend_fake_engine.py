"""A fake engine core for the frontend tests, written with pyzmq and msgpack
against engine-protocol.md. It runs as an engine process of
`CoreEngineProcManager` and records what it receives in a JSON-lines file.

Prompts steer it: `HANG...` never answers, `DIE...` sends ENGINE_CORE_DEAD and
exits 1; otherwise it echoes the prompt tokens, one per step, up to `max_tokens`.
No tests live here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

ADD, ABORT, UTILITY = b"\x00", b"\x01", b"\x03"
FINISH_LENGTH = 1


def engine_log(log_dir: str | Path, rank: int) -> list[dict[str, Any]]:
    """Everything engine `rank` has recorded so far."""
    path = Path(log_dir) / f"engine{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def run_fake_engine(vllm_config, on_head_node, input_address, executor_class, log_stats, dp_rank, local_dp_rank):
    """Engine-process target: `vllm_config` is a dict with `output_address`,
    `log_dir` and optionally `step_s` and `max_model_len`."""
    ctx, dealer, push = connect_as_engine(
        input_address, vllm_config["output_address"], dp_rank, vllm_config.get("max_model_len", 512)
    )
    log = open(Path(vllm_config["log_dir"]) / f"engine{dp_rank}.jsonl", "a", buffering=1)
    step_s = vllm_config.get("step_s", 0.002)
    active: dict[str, dict[str, Any]] = {}
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    next_step = time.monotonic()
    while True:
        timeout_ms = 100 if not active else max(0.0, (next_step - time.monotonic()) * 1000)
        if poller.poll(timeout_ms):
            while True:
                try:
                    kind, payload = dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = msgpack.unpackb(payload)
                if kind == ADD:
                    request_id, prompt, sampling = message[0], message[1], message[3]
                    log.write(
                        json.dumps(
                            {"event": "add", "id": request_id, "prompt_len": len(prompt), "prompt": list(prompt)}
                        )
                        + "\n"
                    )
                    text = bytes(t for t in prompt if t < 256)
                    if text.startswith(b"DIE"):
                        push.send(b"ENGINE_CORE_DEAD")
                        push.close(linger=2000)
                        dealer.close()
                        ctx.term()
                        os._exit(1)
                    active[request_id] = {
                        "prompt": prompt,
                        "max_tokens": sampling.get("max_tokens", 16),
                        "generated": 0,
                        "hang": text.startswith(b"HANG"),
                    }
                elif kind == ABORT:
                    for request_id in message:
                        active.pop(request_id, None)
                        log.write(json.dumps({"event": "abort", "id": request_id}) + "\n")
                elif kind == UTILITY:
                    _client_index, call_id, method, _args = message
                    log.write(json.dumps({"event": "utility", "method": method}) + "\n")
                    push.send(msgpack.packb([dp_rank, [], None, time.time(), [call_id, None, [None, "ok"]]]))
        if not active or time.monotonic() < next_step:
            continue
        next_step = time.monotonic() + step_s
        outputs = []
        for request_id, state in list(active.items()):
            if state["hang"]:
                continue
            token = state["prompt"][state["generated"] % len(state["prompt"])]
            state["generated"] += 1
            finished = state["generated"] >= state["max_tokens"]
            outputs.append([request_id, [token], None, None, None, FINISH_LENGTH if finished else None, None])
            if finished:
                del active[request_id]
        if outputs:
            stats = {"num_running_reqs": len(active), "num_waiting_reqs": 0}
            push.send(msgpack.packb([dp_rank, outputs, stats, time.time()]))
