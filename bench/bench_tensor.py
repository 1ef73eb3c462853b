"""Benchmarks for vllm_rs.tensor_utils (issue "Torch-facing utilities").

Every number is a ratio against a baseline measured in the same run:

1. tensor_data on a contiguous 1 GiB tensor vs a 1 KiB one (zero copy: the
   ratio of per-call times should be about 1, not 2**20).
2. tensor_data on non-contiguous tensors: bytes/s vs a plain memcpy
   (ctypes.memmove between two warm buffers) of the same size, and vs the
   seed's one-liner.
3. compute_iteration_details with 4096 scheduled requests vs the seed's loop
   (written below), on our dataclasses and on a duck-typed vLLM-like input.
   Target: ratio <= 1.0.

Usage: python bench/bench_tensor.py [--nc-mib 64] [--reqs 4096] [--quick]
The default run takes well under a minute.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import time
import types

import numpy as np
import torch
from vllm_rs.tensor_utils import (
    CachedRequestData,
    EncoderInputStats,
    IterationDetails,
    NewRequestData,
    SchedulerOutput,
    compute_iteration_details,
    tensor_data,
)


def per_call(fn, *, min_s: float, repeat: int = 5) -> float:
    """Median seconds per call over `repeat` rounds of at least `min_s`."""
    fn()  # warm up
    n, elapsed = 1, 0.0
    while True:  # find a loop count that lasts min_s
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            break
        n = max(n * 2, int(n * min_s / max(elapsed, 1e-9)))
    rounds = [elapsed / n]
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def seed_tensor_data(tensor: torch.Tensor) -> memoryview:
    """The seed's tensor_data."""
    return tensor.flatten().cpu().contiguous().view(torch.uint8).numpy().data


# ---------------------------------------------------------------- 1 and 2


def bench_contiguous(min_s: float) -> None:
    big = torch.empty(1 << 30, dtype=torch.uint8)  # 1 GiB, never touched
    small = torch.empty(1 << 10, dtype=torch.uint8)
    addr = np.frombuffer(tensor_data(big), dtype=np.uint8).ctypes.data
    assert addr == big.data_ptr(), "tensor_data copied a contiguous tensor"
    t_big = per_call(lambda: tensor_data(big), min_s=min_s)
    t_small = per_call(lambda: tensor_data(small), min_s=min_s)
    print("tensor_data, contiguous CPU tensor (zero copy)")
    print(f"  1 KiB: {t_small * 1e6:8.2f} us/call")
    print(f"  1 GiB: {t_big * 1e6:8.2f} us/call")
    print(f"  ratio 1 GiB / 1 KiB: {t_big / t_small:.2f}  (a copy would be ~{2**20}x)")


def bench_non_contiguous(mib: int, min_s: float) -> None:
    nbytes = mib << 20
    n_f32 = nbytes // 4
    side = int(n_f32**0.5)
    cases = {
        "transposed f32 (T of square)": torch.rand(side, side).t(),
        "column half f32 ([:, :W/2])": torch.rand(n_f32 // 2048, 4096)[:, :2048],
        "every other f32 ([::2])": torch.rand(2 * n_f32)[::2],
        "transposed bf16": torch.rand(side, 2 * side, dtype=torch.bfloat16).t(),
    }
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty(nbytes, dtype=np.uint8)
    dst[:] = 0  # fault the pages in: a warm, plain memcpy

    def memcpy(size):
        ctypes.memmove(dst.ctypes.data, src.ctypes.data, size)

    print(f"\ntensor_data, non-contiguous CPU tensors (~{mib} MiB of output)")
    print(f"  {'layout':32s} {'GB/s':>7s} {'memcpy GB/s':>12s} {'vs memcpy':>10s} {'vs seed':>8s}")
    for name, t in cases.items():
        assert not t.is_contiguous()
        size = t.numel() * t.element_size()
        assert bytes(tensor_data(t)[:64]) == bytes(seed_tensor_data(t)[:64])
        t_ours = per_call(lambda t=t: tensor_data(t), min_s=min_s, repeat=3)
        t_seed = per_call(lambda t=t: seed_tensor_data(t), min_s=min_s, repeat=3)
        t_copy = per_call(functools.partial(memcpy, size), min_s=min_s, repeat=3)
        print(
            f"  {name:32s} {size / t_ours / 1e9:7.2f} {size / t_copy / 1e9:12.2f}"
            f" {t_copy / t_ours:10.2f} {t_seed / t_ours:8.2f}"
        )
    print("  (vs memcpy = bytes/s of tensor_data / bytes/s of memcpy; vs seed = seed time / ours)")


# ---------------------------------------------------------------- 3


def seed_compute_iteration_details(scheduler_output) -> IterationDetails:
    """The seed's loop (vllm/v1/utils.py, newer version)."""
    num_context_requests = 0
    num_context_tokens = 0
    num_generation_requests = 0
    num_generation_tokens = 0
    new_req_ids = {new_req.req_id for new_req in scheduler_output.scheduled_new_reqs}
    for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
        if scheduler_output.scheduled_cached_reqs.is_context_phase(req_id) or (req_id in new_req_ids):
            num_context_requests += 1
            num_context_tokens += num_tokens
        else:
            num_generation_requests += 1
            num_generation_tokens += num_tokens
    stats = scheduler_output.scheduled_encoder_input_stats
    num_encoder_inputs = 0
    num_encoder_output_tokens = 0
    if stats is not None:
        num_encoder_inputs = stats.num_inputs
        num_encoder_output_tokens = stats.output_tokens
    return IterationDetails(
        num_context_requests,
        num_context_tokens,
        num_generation_requests,
        num_generation_tokens,
        num_encoder_inputs,
        num_encoder_output_tokens,
    )


class VllmLikeCachedRequestData:
    """vLLM's CachedRequestData lookup (cached dict of output tokens)."""

    def __init__(self, req_ids, num_output_tokens):
        self.req_ids = req_ids
        self.num_output_tokens = num_output_tokens

    @functools.cached_property
    def _req_id_to_num_output_tokens(self):
        return dict(zip(self.req_ids, self.num_output_tokens))

    def is_context_phase(self, req_id):
        n = self._req_id_to_num_output_tokens.get(req_id)
        return n is not None and n == 0


def make_step(num_reqs: int, seed: int = 0):
    """One step: 1/16 new requests, the rest cached, 1/10 of those still in
    (chunked) prefill. Returns (ours, duck-typed) with the same content."""
    rng = np.random.default_rng(seed)
    ids = [f"req-{i:06d}" for i in range(num_reqs)]
    n_new = num_reqs // 16
    new_ids, cached_ids = ids[:n_new], ids[n_new:]
    outs = [0 if x < 0.1 else int(x * 100) for x in rng.random(len(cached_ids))]
    nst = {}
    for rid in new_ids:
        nst[rid] = int(rng.integers(64, 2048))
    for rid, n in zip(cached_ids, outs):
        nst[rid] = int(rng.integers(64, 512)) if n == 0 else 1
    stats = EncoderInputStats(num_inputs=4, output_tokens=2304)
    ours = SchedulerOutput([NewRequestData(r) for r in new_ids], CachedRequestData(cached_ids, outs), nst, stats)
    duck = types.SimpleNamespace(
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r) for r in new_ids],
        scheduled_cached_reqs=VllmLikeCachedRequestData(cached_ids, outs),
        num_scheduled_tokens=nst,
        scheduled_encoder_input_stats=types.SimpleNamespace(num_inputs=4, output_tokens=2304),
    )
    return ours, duck


def bench_iteration_details(num_reqs: int, min_s: float) -> None:
    ours, duck = make_step(num_reqs)
    print(f"\ncompute_iteration_details, {num_reqs} scheduled requests (target ratio <= 1.0)")
    for label, so in (("our dataclasses", ours), ("duck-typed vLLM-like", duck)):
        expected = seed_compute_iteration_details(so)
        assert compute_iteration_details(so) == expected
        t_seed = per_call(lambda so=so: seed_compute_iteration_details(so), min_s=min_s)
        t_ours = per_call(lambda so=so: compute_iteration_details(so), min_s=min_s)
        print(
            f"  {label:22s} ours {t_ours * 1e6:8.1f} us  seed loop {t_seed * 1e6:8.1f} us  ratio {t_ours / t_seed:.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nc-mib", type=int, default=64, help="size of the non-contiguous cases")
    p.add_argument("--reqs", type=int, default=4096, help="scheduled requests per step")
    p.add_argument("--quick", action="store_true", help="shorter timing rounds (noisier)")
    args = p.parse_args()
    min_s = 0.05 if args.quick else 0.2
    torch.set_num_threads(1)  # one core: comparable with the single-threaded memcpy
    print(f"torch {torch.__version__}, numpy {np.__version__}, 1 torch thread")
    bench_contiguous(min_s)
    bench_non_contiguous(args.nc_mib, min_s)
    bench_iteration_details(args.reqs, min_s)


if __name__ == "__main__":
    main()
