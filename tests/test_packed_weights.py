"""`--quantization gguf`: a GGUF's linear weights kept in the file's blocks
for the Rust kernel (types it does not read held in float32), its
embeddings read from the file. On the packaged SmolLM2 GGUF (Q4_1 layers,
Q8_0 embeddings tied to the output head) it is the default on the CPU (run
without torch by the native executor),
generates the same greedy tokens as the dequantized float32 path with
logprobs equal up to float32 summation order, holds the blocks zero-copy
(the permuted Q/K rows excepted) and no float32 copy of a weight, and looks
embeddings up exactly; where it cannot run, `serve` exits 2 naming the
option."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.config import EngineConfigError
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.layers.packed_weights import PackedLinear
from vllm_rs.engine.worker.native_executor import NativeExecutor

from tests.support.executors import linear_blocks
from tests.support.greedy import greedy_with_rows

#: SmolLM2 token ids: a chat-formatted question, then plain-text prompts.
PROMPTS = [
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198,
     1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    [504, 3575, 282, 4649, 314],
    [504, 2512, 282, 260, 1851, 359],
    list(range(1000, 1040)),
]  # fmt: skip
MAX_TOKENS = 32
#: Largest difference allowed between the two paths' log-probabilities of a
#: sampled position: the kernel computes with the very weights of the
#: dequantized path, so only float32 summation order differs (measured:
#: under 1e-4), far below the gaps that would flip a greedy token.
LOGPROB_TOLERANCE = 2e-3


def engine(path: str, quantization: str | None) -> EngineCore:
    config = make_engine_config(path, max_model_len=256, device="cpu", dtype="float32",
                                kv_cache_memory_bytes=64 << 20, quantization=quantization)  # fmt: skip
    return EngineCore(config)


def generate(core: EngineCore) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]]]:
    """Greedy tokens and the log-probabilities of every sampled row, per
    request, all prompts in flight together."""
    return greedy_with_rows(core, PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def both(smollm2):
    """(packed core, its outputs), (dequantized core, its outputs)."""
    torch.set_num_threads(1)
    packed = engine(smollm2, None)
    packed_out = generate(packed)
    dequantized = engine(smollm2, "none")
    return (packed, packed_out), (dequantized, generate(dequantized))


def test_packed_is_the_default_for_a_quantized_gguf_on_the_cpu(smollm2):
    def quantization(**options) -> str | None:
        config = make_engine_config(smollm2, max_model_len=256, kv_cache_memory_bytes=1 << 26, **options)
        return config.model_config.quantization

    assert quantization(device="cpu") == "gguf"
    assert quantization(device="cpu", quantization="none") is None
    assert quantization(device="cpu", dtype="bfloat16") is None


def test_greedy_text_equals_the_dequantized_path(both):
    (_, (packed_tokens, packed_rows)), (_, (tokens, rows)) = both
    assert packed_tokens == tokens
    for request_id, expected in rows.items():
        for step, (ours, reference) in enumerate(zip(packed_rows[request_id], expected, strict=True)):
            token = tokens[request_id][step]
            # The sampled token's log-probability and the top of the distribution.
            assert abs(float(ours[token] - reference[token])) < LOGPROB_TOLERANCE, (request_id, step)
            top = reference.topk(5).indices
            assert (ours[top] - reference[top]).abs().max() < LOGPROB_TOLERANCE, (request_id, step)


def test_no_float32_copy_of_a_weight_is_kept(both):
    (packed, _), _ = both
    executor = packed.runner.executor
    assert isinstance(executor, NativeExecutor), "the packaged GGUF runs without torch"
    layers = linear_blocks(packed)
    config = packed.config.model_config.spec.transformer
    # 7 per layer, and the output head (tied to the embeddings); all Q4_1 or
    # Q8_0 in this GGUF, so all read by the kernel.
    assert len(layers) == 7 * config.num_layers + 1
    assert all(isinstance(blocks, GgufBlocks) for blocks in layers.values())
    dense = sum(a.nbytes for a in executor.weights.values() if not isinstance(a, GgufBlocks))
    # Only the RMSNorm weights remain: 2 per layer and the final norm.
    assert dense == (2 * config.num_layers + 1) * config.hidden_size * 4


def file_backed(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file (no copy)."""
    while isinstance(array, np.ndarray):
        array = array.base
    return isinstance(array, mmap.mmap)


def test_blocks_are_the_files_own_pages_but_the_permuted_rows(both):
    (packed, _), _ = both
    copied = 0
    for name, blocks in linear_blocks(packed).items():
        if blocks is not None:
            rows = blocks.rows
            permuted = name.endswith(("q_proj.weight", "k_proj.weight"))
            assert file_backed(rows) != permuted, name
            copied += rows.nbytes if permuted else 0
    # The Q/K copies: (576 + 192) rows of 18 Q4_1 blocks in each of 30 layers.
    assert copied == 30 * (576 + 192) * 18 * 20


def test_the_blocks_hold_exactly_the_dequantized_weights(both):
    """The Q/K row permutation applied to rows of blocks, and the tied head
    read from the Q8_0 embeddings, give the dequantized path's weights."""
    import gguf

    (packed, _), (dequantized, _) = both
    reference = dequantized.runner.executor.model.state_dict()
    for name, blocks in linear_blocks(packed).items():
        if blocks is not None:
            weight = gguf.quants.dequantize(blocks.rows, gguf.GGMLQuantizationType(blocks.type))
            key = "model.embed_tokens.weight" if name not in reference else name
            assert torch.equal(torch.from_numpy(weight.reshape(blocks.shape)), reference[key]), name


def test_a_dense_weight_is_held_in_float32_exactly():
    """Types the kernel does not read (F32, the other i-quants) are held as
    the dequantized path holds them: float32, not rounded to a half type."""
    layer = PackedLinear(64, 48, bias=False)
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    layer.load_weight(weight)
    assert layer.blocks is None and layer.dense.dtype == torch.float32
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, weight.float()))


def test_embeddings_from_the_file_equal_the_dequantized_ones(both):
    (packed, _), (dequantized, _) = both
    ids = torch.tensor([0, 1, 504, 49151, 504, 12345])
    ours = torch.from_numpy(packed.runner.executor.embeddings.lookup(ids.numpy()))
    assert torch.equal(ours, dequantized.runner.executor.model.model.embed_tokens.weight[ids])


def test_where_gguf_packing_cannot_run_it_is_refused(smollm2):
    with pytest.raises(EngineConfigError, match="--quantization gguf: needs --dtype float32"):
        make_engine_config(smollm2, device="cpu", dtype="bfloat16", quantization="gguf", max_model_len=256)
    with pytest.raises(EngineConfigError, match="--quantization gguf: the model is not a .gguf file"):
        make_engine_config("toy", quantization="gguf")
    with pytest.raises(EngineConfigError, match="--quantization: invalid value 'awq'"):
        make_engine_config(smollm2, device="cpu", quantization="awq", max_model_len=256)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--quantization", "awq"], "--quantization"),
        (["--quantization", "gguf"], "--quantization gguf: the model is not a .gguf file"),
    ],
)
def test_serve_exits_2_naming_the_option(args, expected):
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", "--model", "toy", *args, "--port", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
