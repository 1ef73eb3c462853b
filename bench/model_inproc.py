"""The in-process paths of bench_models.py, each run in a child process of
its own (so that its threads and memory are its own): Hugging Face
`transformers` `generate` at batch 1 on the GGUF (dequantized), and this
project's engine core (`vllm_rs.engine.core.EngineCore`) driven directly,
without sockets or frontend, on the same requests as the served load.

Run: python bench/model_inproc.py hf|engine < SPEC.json > RESULT.json, where
SPEC holds `gguf`, `threads`, `prompts`, `warmup` (a prompt for a short
first request), `output_tokens`, `concurrency`, `kv_cache_memory_bytes`
(engine) and `dtype` (engine, optional). The result is one JSON object: a LevelResult
plus memory figures. bench_models.py is the caller.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine_steps import steal_s  # noqa: E402
from bench.model_load import RequestTiming, summarize  # noqa: E402


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hf_generate(spec: dict) -> dict:
    """transformers' `generate` at batch 1, greedy, exactly `output_tokens`
    each, prompts one after another; token times from a streamer."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(spec["threads"])
    gguf = Path(spec["gguf"])
    before = rss_bytes()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    loaded = rss_bytes()

    class TokenClock(BaseStreamer):
        """Stamps every generated token (the first `put` is the prompt)."""

        def __init__(self, timing: RequestTiming):
            self.timing, self.seen_prompt = timing, False

        def put(self, value) -> None:
            if not self.seen_prompt:
                self.seen_prompt = True
                return
            now = time.monotonic()
            self.timing.first = self.timing.first or now
            self.timing.last = now
            self.timing.tokens += value.numel()

        def end(self) -> None:
            pass

    def generate(prompt: list[int], tokens: int, timing: RequestTiming) -> None:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, streamer=TokenClock(timing), pad_token_id=0)  # fmt: skip

    generate(spec["warmup"], 4, RequestTiming(time.monotonic()))
    timings = []
    started = time.monotonic()
    for prompt in spec["prompts"]:
        timing = RequestTiming(time.monotonic())
        generate(prompt, spec["output_tokens"], timing)
        timings.append(timing)
    result = summarize(1, timings, timings[-1].last - started).as_dict()
    result["extra"] = {"rss_bytes": loaded, "rss_load_delta_bytes": loaded - before, "dtype": "float32"}
    return result


def engine_direct(spec: dict) -> dict:
    """The engine core in this process, `concurrency` requests in flight (a
    closed loop, as the served load): the same step loop `serve`'s engine
    runs, minus sockets and frontend."""
    import torch
    from vllm_rs.engine import make_engine_config
    from vllm_rs.engine.core import EngineCore
    from vllm_rs.engine.protocol import EngineCoreRequest

    torch.set_num_threads(spec["threads"])
    before = rss_bytes()
    config = make_engine_config(spec["gguf"], device="cpu", dtype=spec.get("dtype") or "auto", log_stats=False,
                                kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
                                max_model_len=spec["max_model_len"])  # fmt: skip
    core = EngineCore(config)
    loaded = rss_bytes()
    tokens = spec["output_tokens"]
    request_ids = (f"r{n}" for n in itertools.count())

    def drive(queues: list[list[list[int]]], tokens: int) -> tuple[list[RequestTiming], float]:
        timings: dict[str, tuple[int, RequestTiming]] = {}

        def add(worker: int) -> None:
            if not queues[worker]:
                return
            request_id = next(request_ids)
            timing = RequestTiming(time.monotonic())
            timings[request_id] = (worker, timing)
            params = {"temperature": 0.0, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
            error = core.add_request(EngineCoreRequest(request_id, queues[worker].pop(0), params))
            if error is not None:
                raise RuntimeError(f"the engine refused a request: {error.error}")

        started = time.monotonic()
        for worker in range(len(queues)):
            add(worker)
        while core.has_work():
            outputs = core.step()
            now = time.monotonic()
            for _client, output in outputs:
                worker, timing = timings[output.request_id]
                timing.first = timing.first or now
                timing.last = now
                timing.tokens += len(output.new_token_ids)
                if output.finish_reason is not None:
                    add(worker)
        return [t for _, t in timings.values()], started

    drive([[spec["warmup"]]], 4)  # as the served load warms up
    concurrency = spec["concurrency"]
    steal_before = steal_s()
    timings, started = drive([spec["prompts"][i::concurrency] for i in range(concurrency)], tokens)
    steal_after = steal_s()
    if any(t.tokens != tokens for t in timings):
        raise RuntimeError(f"a request did not produce {tokens} tokens: {[t.tokens for t in timings]}")
    result = summarize(concurrency, timings, max(t.last for t in timings) - started).as_dict()
    # The level's own steal time, as the served paths' (not the model load's).
    steal = steal_after - steal_before if steal_before is not None and steal_after is not None else None
    result["extra"] = {"rss_bytes": loaded, "rss_load_delta_bytes": loaded - before,
                       "dtype": config.model_config.dtype, "steal_s": steal}  # fmt: skip
    return result


def main() -> int:
    """Reads the spec from stdin, writes the result to stdout."""
    kind = sys.argv[1] if len(sys.argv) == 2 else None
    runs = {"hf": hf_generate, "engine": engine_direct}
    if kind not in runs:
        print(f"usage: {sys.argv[0]} {'|'.join(runs)} < spec.json", file=sys.stderr)
        return 2
    spec = json.load(sys.stdin)
    json.dump(runs[kind](spec), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
