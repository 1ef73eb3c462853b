"""`vllm_rs._core.paged_decode_attention`, the Rust kernel that attends one
query per sequence over its keys and values where they lie in a paged KV
cache: it equals torch's `scaled_dot_product_attention` over the keys
gathered by slot within float32 rounding (grouped and ungrouped heads, head
sizes that are and are not whole AVX2 vectors), writes only the sequences'
rows, gives the same bits on any number of threads, refuses bad buffers and
indices with a clear Python error; and the engine serving the packaged
SmolLM2 with it generates the greedy tokens of the gathered path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from vllm_rs import _core
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.protocol import EngineCoreRequest
from vllm_rs.engine.worker import torch_executor
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

BLOCK = 16


def paged_case(lens: list[int], heads: int, kv_heads: int, head_dim: int, seed: int = 0) -> dict:
    """Caches of scattered blocks, each sequence's slots in blocks taken at
    random, its query in every other row of `q`."""
    g = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // BLOCK) for n in lens) + 3
    order = torch.randperm(blocks, generator=g)
    width = max(lens)
    key_slots = torch.zeros(len(lens), width, dtype=torch.int64)
    taken = 0
    for s, n in enumerate(lens):
        own = order[taken : taken + -(-n // BLOCK)]
        taken += len(own)
        key_slots[s, :n] = (own[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:n]
    return {
        "q": torch.randn(2 * len(lens) + 1, heads, head_dim, generator=g),
        "keys": torch.randn(blocks * BLOCK, kv_heads, head_dim, generator=g),
        "values": torch.randn(blocks * BLOCK, kv_heads, head_dim, generator=g),
        "rows": torch.arange(len(lens), dtype=torch.int64) * 2 + 1,
        "key_slots": key_slots,
        "lens": torch.tensor(lens, dtype=torch.int64),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
    }


def kernel(case: dict, threads: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.full_like(case["q"], float("nan")) if out is None else out
    _core.paged_decode_attention(
        case["q"].numpy(), case["keys"].numpy(), case["values"].numpy(), case["rows"].numpy(),
        case["key_slots"].numpy(), case["lens"].numpy(), out.numpy(), case["heads"], case["kv_heads"],
        case["head_dim"], 1.0 / math.sqrt(case["head_dim"]), threads,
    )  # fmt: skip
    return out


def gathered(case: dict) -> torch.Tensor:
    """torch's attention over each sequence's keys and values gathered by slot."""
    out = torch.full_like(case["q"], float("nan"))
    gqa = case["heads"] != case["kv_heads"]
    for row, slots, n in zip(case["rows"], case["key_slots"], case["lens"], strict=True):
        keys = case["keys"][slots[:n]].transpose(0, 1)
        values = case["values"][slots[:n]].transpose(0, 1)
        query = case["q"][row][:, None, :]
        out[row] = F.scaled_dot_product_attention(query, keys, values, enable_gqa=gqa)[:, 0, :]
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(9, 3, 64), (4, 4, 16), (8, 2, 12), (2, 1, 5)],
)
def test_the_kernel_equals_sdpa_over_the_gathered_cache(heads, kv_heads, head_dim):
    case = paged_case([1, 17, 130, 64, 5], heads, kv_heads, head_dim)
    got, want = kernel(case), gathered(case)
    # Rows that are no sequence's stay as they were (NaN).
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_threads_give_the_same_bits():
    case = paged_case([200, 3, 77, 150, 16, 33, 1, 90], 9, 3, 64, seed=1)
    one = kernel(case)
    for threads in (2, 3, 16):
        assert torch.equal(kernel(case, threads).nan_to_num(), one.nan_to_num())


def call_with(case: dict, **changes) -> None:
    args = {name: case[name] for name in ("q", "keys", "values", "rows", "key_slots", "lens")}
    args["out"] = torch.zeros_like(case["q"])
    args.update(changes)
    arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args.values()]
    _core.paged_decode_attention(*arrays, case["heads"], case["kv_heads"], case["head_dim"], 0.125, 1)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda c: {"q": c["q"].double()}, TypeError, "q must be a buffer of float32"),
        (lambda c: {"lens": c["lens"].int()}, TypeError, "lens must be a buffer of int64"),
        (lambda c: {"key_slots": c["key_slots"].t()}, ValueError, "key_slots must be C-contiguous"),
        (lambda c: {"key_slots": c["key_slots"].clone().fill_(10_000)}, ValueError, "sequence 0: key 0 is slot 10000"),
        (lambda c: {"key_slots": c["key_slots"].clone().fill_(-1)}, ValueError, "key 0 is slot -1"),
        (lambda c: {"lens": torch.tensor([0, 1])}, ValueError, "sequence 0: 0 keys, not 1..=20"),
        (lambda c: {"lens": torch.tensor([21, 1])}, ValueError, "sequence 0: 21 keys"),
        (lambda c: {"rows": torch.tensor([3, 1])}, ValueError, "sequence 1: row 1 is not above"),
        (lambda c: {"rows": torch.tensor([1, 5])}, ValueError, "row 5 is not above the previous sequence's row and below tokens = 5"),
        (lambda c: {"values": c["values"][:-1]}, ValueError, "value_cache has"),
        (lambda c: {"out": c["q"]}, ValueError, "out overlaps q"),
        (lambda c: {"out": np.zeros(c["q"].shape, np.float32)[:, :, :-1]}, ValueError, "out must be C-contiguous"),
    ],
)  # fmt: skip
def test_bad_calls_raise_naming_the_argument(change, error, message):
    case = paged_case([20, 3], 2, 1, 8)
    with pytest.raises(error, match=message):
        call_with(case, **change(case))


def test_a_read_only_out_is_refused():
    case = paged_case([4], 2, 1, 8)
    out = np.zeros(case["q"].shape, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        call_with(case, out=out)


PROMPTS = [[504, 3575, 282, 4649, 314], [504, 2512, 282, 260, 1851, 359], list(range(1000, 1040)), [1, 9690, 198]]


def greedy(path: str) -> dict[str, list[int]]:
    """The torch step's greedy tokens (`--enforce-eager`: the attention
    layers, not the native step, read the cache)."""
    config = make_engine_config(path, max_model_len=256, device="cpu", dtype="float32",
                                kv_cache_memory_bytes=64 << 20, enforce_eager=True)  # fmt: skip
    core = EngineCore(config)
    torch.set_num_threads(1)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}))
    tokens: dict[str, list[int]] = {}
    while core.has_work():
        for _, output in core.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    return tokens


def test_smollm2_generates_the_gathered_paths_tokens(monkeypatch):
    try:
        path = packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}")
    in_place = greedy(path)
    monkeypatch.setattr(torch_executor, "attends_in_place", lambda device, dtype: False)
    assert greedy(path) == in_place
    assert all(len(t) == 24 for t in in_place.values())
