"""Every GGUF weight type the Rust kernel reads in place (legacy Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; K-quants Q2_K..Q6_K, IQ4_XS; F16, BF16):
its dequantization has the `gguf` package's bits, its matmul equals
`gguf` dequantize + `F.linear` within float32 summation error for 1..33
rows and 1..3 threads on SmolLM2- and 1B-shaped weights, and a GGUF file
of each type (written by the test) loads, keeps its blocks in the file and
generates through `--quantization gguf` what `--quantization none` does."""

from __future__ import annotations

import logging
import mmap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from vllm_rs import _core
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.worker.native_executor import NativeExecutor

from tests.support.executors import linear_blocks
from tests.support.gguf_blocks import KERNEL_TYPES, random_blocks
from tests.support.greedy import greedy_with_rows
from tests.support.tiny_models import make_hf_model, save_gguf

gguf = pytest.importorskip("gguf")

NAMES = list(KERNEL_TYPES)


def dequantize(name: str, rows: np.ndarray, n: int) -> torch.Tensor:
    weight = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(KERNEL_TYPES[name][0]))
    return torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32).reshape(n, -1))


@pytest.mark.parametrize("name", NAMES)
def test_the_kernels_dequantization_has_the_gguf_packages_bits(name):
    type_id, block = KERNEL_TYPES[name]
    rows = random_blocks(name, 7, 2 * block * (8 if block == 32 else 1), seed=3)
    reference = dequantize(name, rows, 7).numpy()
    ours = np.full(reference.shape, np.nan, np.float32)
    _core.gguf_dequantize(rows, ours, type_id)
    assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", ["smollm2", "1b"])
def test_the_kernel_equals_dequantize_then_linear(name, shape):
    type_id, block = KERNEL_TYPES[name]
    # SmolLM2's MLP rows (576 wide, 256-blocks: 512) and a 1B model's (2048).
    n, k = (96, 576 if block == 32 else 512) if shape == "smollm2" else (40, 2048)
    rows = random_blocks(name, n, k, seed=n + k)
    weight = dequantize(name, rows, n)
    exact_weight = weight.double()
    for m in (1, 2, 3, 4, 5, 16, 33):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 2
        exact = F.linear(x.double(), exact_weight)
        bound = F.linear(x.double().abs(), exact_weight.abs()) * (4 * torch.finfo(torch.float32).eps * k**0.5)
        for threads in (1, 2, 3):
            out = torch.full((m, n), float("nan"))
            _core.gguf_matmul(x.numpy(), rows, out.numpy(), type_id, n, k, threads)
            assert torch.all((out.double() - exact).abs() <= bound + 1e-30), (m, threads)


def test_bad_types_and_partial_blocks_are_named():
    out = np.empty(256, np.float32)
    with pytest.raises(ValueError, match=r"quant_type 16 is not one the kernel reads: .*Q4_K \(12\)"):
        _core.gguf_dequantize(np.zeros(66, np.uint8), out, 16)
    with pytest.raises(ValueError, match="rows has 100 bytes, not whole 144-byte blocks of Q4_K"):
        _core.gguf_dequantize(np.zeros(100, np.uint8), out, 12)
    with pytest.raises(ValueError, match="out has 256 elements, rows hold 512"):
        _core.gguf_dequantize(np.zeros(288, np.uint8), out, 12)
    with pytest.raises(ValueError, match=r"k = 576 is not a positive multiple of 256 \(the Q6_K block size\)"):
        _core.gguf_matmul(np.zeros(576, np.float32), np.zeros(420, np.uint8), np.zeros(1, np.float32), 14, 1, 576, 1)


#: Tiny Qwen2-shaped models whose rows are multiples of 256, so that every
#: type fits (Qwen2: tied embeddings, so the head is read from token_embd).
SIZES = dict(hidden_size=256, intermediate_size=512, vocab_size=256, num_attention_heads=4, num_key_value_heads=2)
PROMPTS = [[5, 9, 200, 17, 3, 77, 150, 42, 8], [100, 101, 102], list(range(30, 60))]
MAX_TOKENS = 16
#: Both paths multiply the very same float32 weights: only float32 summation
#: order differs.
LOGPROB_TOLERANCE = 2e-3


def generate(path: str, quantization: str) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]], EngineCore]:
    """Greedy tokens and sampled rows' log-probabilities of PROMPTS on the
    file, and the core that ran them."""
    config = make_engine_config(path, max_model_len=128, device="cpu", dtype="float32", block_size=8,
                                kv_cache_memory_bytes=16 << 20, quantization=quantization)  # fmt: skip
    core = EngineCore(config)
    return (*greedy_with_rows(core, PROMPTS, MAX_TOKENS), core)


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(1)
    return make_hf_model("qwen2", seed=5, **SIZES)


#: A file per type (every 2-D weight of it), and the mix a llama-quantize
#: Q4_K_M of a model with 576-wide rows holds (Q5_0 fallbacks beside Q4_K,
#: Q6_K and Q8_0).
FILES = {name: {"": name} for name in NAMES}
FILES["Q4_K_M-like"] = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q6_K", "attn_output": "Q5_0",
                        "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}  # fmt: skip


@pytest.mark.parametrize("file", list(FILES))
def test_a_gguf_of_each_type_serves_in_place_as_dequantized(tiny_model, tmp_path, file, caplog):
    path = save_gguf(tiny_model, str(tmp_path / f"{file}.gguf"), quant=FILES[file])
    with caplog.at_level(logging.INFO):
        in_place_tokens, in_place_rows, core = generate(path, "gguf")
    assert "dequantized to float32" not in caplog.text
    assert isinstance(core.runner.executor, NativeExecutor), "a file the kernel reads runs without torch"
    layers = linear_blocks(core).values()
    assert layers and all(isinstance(blocks, GgufBlocks) for blocks in layers)
    # Qwen2 has no Q/K row permutation: every weight is the file's own pages.
    assert all(file_backed(blocks.rows) for blocks in layers)
    types = {blocks.type for blocks in layers}
    assert types == {KERNEL_TYPES[kind][0] for kind in FILES[file].values()}
    tokens, rows, _ = generate(path, "none")
    assert in_place_tokens == tokens
    for request_id, expected in rows.items():
        for ours, reference in zip(in_place_rows[request_id], expected, strict=True):
            top = reference.topk(5).indices
            assert (ours[top] - reference[top]).abs().max() < LOGPROB_TOLERANCE, request_id


def file_backed(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file (no copy)."""
    while isinstance(array, np.ndarray):
        array = array.base
    return isinstance(array, mmap.mmap)


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL"])
def test_the_in_place_path_matches_transformers_reading_the_file(tiny_model, tmp_path, kind):
    """A file of each type the `gguf` package cannot write, read by
    transformers through the same package: every sampled position's logits
    within 1e-4 of transformers', greedy text equal to its `generate`, and
    the served logprobs and prompt logprobs its raw log-softmax."""
    transformers = pytest.importorskip("transformers")
    from tests.test_real_models import _check_against_transformers, check_logprobs_against_transformers

    path = save_gguf(tiny_model, str(tmp_path / f"{kind}.gguf"), quant={"": kind})
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=f"{kind}.gguf", dtype=torch.float32
    )
    _check_against_transformers(reference.eval(), path, seed=7, quantization="gguf")
    check_logprobs_against_transformers(reference, path, "gguf", seed=8)


def test_llama_q_and_k_rows_of_super_blocks_are_unpermuted(tmp_path):
    """llama.cpp permutes the Q and K rows of the `llama` architecture; the
    loader undoes it on rows of super-blocks (copies: the only weights not
    the file's pages) and generates what the dequantized path does."""
    model = make_hf_model("llama", seed=6, **SIZES)
    path = save_gguf(model, str(tmp_path / "llama-q4_k.gguf"), quant={"": "Q4_K"})
    tokens, rows, core = generate(path, "gguf")
    for name, blocks in linear_blocks(core).items():
        assert file_backed(blocks.rows) != name.endswith(("q_proj.weight", "k_proj.weight")), name
    expected_tokens, expected_rows, _ = generate(path, "none")
    assert tokens == expected_tokens
    for request_id, expected in expected_rows.items():
        for ours, reference in zip(rows[request_id], expected, strict=True):
            assert (ours - reference).abs().max() < LOGPROB_TOLERANCE, request_id


def test_a_file_with_rows_of_2048_serves_in_place(tmp_path):
    """A 1B model's row width (Llama 3.2 1B, Qwen3 1.7B: 2048), one layer:
    its Q4_K_M mix (Q4_K, Q6_K; the untied head Q6_K, the embeddings Q4_K)
    read in place generates what the dequantized path does."""
    model = make_hf_model("llama", seed=8, hidden_size=2048, intermediate_size=2048, num_hidden_layers=1,
                          num_attention_heads=16, num_key_value_heads=4, vocab_size=256)  # fmt: skip
    quant = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K", "": "Q4_K"}
    path = save_gguf(model, str(tmp_path / "rows-2048.gguf"), quant=quant)
    tokens, rows, core = generate(path, "gguf")
    layers = linear_blocks(core)
    assert {blocks.type for blocks in layers.values()} == {12, 14} and layers["lm_head.weight"].type == 14
    expected_tokens, expected_rows, _ = generate(path, "none")
    assert tokens == expected_tokens
    for request_id, expected in expected_rows.items():
        for ours, reference in zip(rows[request_id], expected, strict=True):
            assert (ours - reference).abs().max() < LOGPROB_TOLERANCE, request_id


def test_types_the_kernel_does_not_read_are_dequantized_with_one_log_line(tiny_model, tmp_path, caplog):
    """F32 weights stay float32; an i-quant the kernel does not read (here
    TQ2_0, which the `gguf` package writes) is dequantized, and said so once."""
    path = save_gguf(tiny_model, str(tmp_path / "tq.gguf"), quant={"ffn_down": "TQ2_0", "ffn_up": "Q4_K"})
    with caplog.at_level(logging.INFO):
        tokens, _, core = generate(path, "gguf")
    notes = [r.getMessage() for r in caplog.records if "dequantized to float32" in r.getMessage()]
    assert len(notes) == 1 and "TQ2_0" in notes[0], notes
    assert not isinstance(core.runner.executor, NativeExecutor)
    down = core.runner.executor.model.model.layers[0].mlp.down_proj
    assert down.blocks is None and down.dense.dtype == torch.float32
    assert core.runner.executor.model.model.layers[0].mlp.up_proj.blocks is not None
    assert tokens == generate(path, "none")[0]
