"""`--kv-cache-dtype`: `auto` keeps the model's dtype (float32 on the CPU:
exact); `float16` and `bfloat16` hold keys and values rounded to 16 bits
(half the memory, twice the blocks for a budget), read back as float32. On
the packaged SmolLM2, four prompts of 32 greedy tokens in flight together:
the greedy tokens equal the float32 cache's, and every sampled row's
log-probabilities of the float32 cache's top 5 tokens stay within the bound
docs/real-models.md states, through the native step and the torch step.
vLLM's values this engine does not run, and unknown ones, exit 2 naming
the option."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.config import EngineConfigError
from vllm_rs.engine.core import EngineCore

from tests.support.greedy import greedy_with_rows
from tests.test_packed_weights import MAX_TOKENS, PROMPTS

#: The largest change of a top-5 log-probability a 16-bit cache may make
#: (measured on these prompts: bfloat16 0.075, float16 0.011; bfloat16
#: keeps 8 significant bits, float16 11).
LOGPROB_BOUND = {"bfloat16": 0.15, "float16": 0.025}


def generate(path: str, kv_cache_dtype: str, enforce_eager: bool = False):
    config = make_engine_config(path, max_model_len=256, device="cpu", dtype="float32", kv_cache_memory_bytes=64 << 20,
                                kv_cache_dtype=kv_cache_dtype, enforce_eager=enforce_eager)  # fmt: skip
    core = EngineCore(config)
    return (*greedy_with_rows(core, PROMPTS, MAX_TOKENS), core)


@pytest.fixture(scope="module")
def exact(smollm2):
    torch.set_num_threads(1)
    return generate(smollm2, "auto")


def top5_change(rows, reference) -> float:
    """The largest change of a reference top-5 log-probability over every sampled row."""
    worst = 0.0
    for request_id, expected in reference.items():
        for ours, want in zip(rows[request_id], expected, strict=True):
            top = want.topk(5).indices
            worst = max(worst, float((ours[top] - want[top]).abs().max()))
    return worst


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16"])
def test_a_sixteen_bit_cache_stays_within_its_bound(smollm2, exact, kv_cache_dtype, caplog):
    with caplog.at_level(logging.INFO):
        tokens, rows, core = generate(smollm2, kv_cache_dtype)
    exact_tokens, exact_rows, exact_core = exact
    assert core.runner.executor.native_step is not None
    assert "torch step" not in caplog.text and f"tokens ({kv_cache_dtype}); native step" in caplog.text
    # The same budget holds twice the blocks.
    assert core.runner.num_gpu_blocks == 2 * exact_core.runner.num_gpu_blocks
    assert tokens == exact_tokens
    change = top5_change(rows, exact_rows)
    assert 0 < change <= LOGPROB_BOUND[kv_cache_dtype], change


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16"])
def test_the_torch_step_on_a_sixteen_bit_cache_stays_within_the_bound_too(smollm2, exact, kv_cache_dtype):
    # Not bit for bit the native step's: a float32 key that differs in its
    # last bits (summation order) can round to the neighbouring 16-bit value.
    tokens, rows, eager = generate(smollm2, kv_cache_dtype, enforce_eager=True)
    exact_tokens, exact_rows, _ = exact
    assert eager.runner.executor.native_step is None
    assert tokens == exact_tokens
    assert top5_change(rows, exact_rows) <= LOGPROB_BOUND[kv_cache_dtype]


def test_vllms_values_this_engine_does_not_run_are_refused(smollm2):
    with pytest.raises(EngineConfigError, match="--kv-cache-dtype fp8: not supported by this engine"):
        make_engine_config(smollm2, device="cpu", max_model_len=256, kv_cache_dtype="fp8")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("fp8_e4m3", "--kv-cache-dtype fp8_e4m3: not supported by this engine (it runs auto, float16, bfloat16)"),
        ("float64", "argument --kv-cache-dtype: invalid choice: 'float64'"),
    ],
)
def test_serve_exits_2_naming_the_option(value, expected):
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", "--model", "toy", "--kv-cache-dtype", value, "--port", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
