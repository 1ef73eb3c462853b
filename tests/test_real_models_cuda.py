"""Real models on `--device cuda`: the same runner with the weights and the
KV cache on the GPU gives the CPU's greedy output (float32) and logits close
to transformers' on the GPU. Skipped, with the reason, where torch sees no
CUDA device (bench/gpu_check.py runs the same checks plus speed on a GPU
machine)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch sees no CUDA device)")

transformers = pytest.importorskip("transformers")

from vllm_rs.engine.core import EngineCore  # noqa: E402

from tests.support.tiny_models import make_hf_model, save_safetensors  # noqa: E402
from tests.test_real_models import MAX_TOKENS, run_engine  # noqa: E402

#: Token ids below every tiny model's vocabulary; lengths that take one, two and three prefill chunks.
PROMPTS = ([5, 17, 90, 3], [42] * 19, list(range(1, 34)))


def greedy(path: str, device: str, dtype: str = "float32") -> tuple[dict[str, list[int]], EngineCore]:
    """Greedy tokens per prompt on `device`: the CPU tests' engine run, in
    16-token prefill chunks, the last prompt after the others."""
    outputs, _logits, core = run_engine(path, list(PROMPTS), device, dtype)
    return outputs, core


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_cuda_greedy_equals_cpu_and_transformers(tmp_path, arch):
    model = make_hf_model(arch, seed=7)
    path = save_safetensors(model, str(tmp_path / arch), None)
    on_gpu, core = greedy(path, "cuda")
    assert core.runner.executor.kv_caches[0].device.type == "cuda", "the KV cache should live on the GPU"
    assert next(core.runner.executor.model.parameters()).device.type == "cuda"
    on_cpu, _ = greedy(path, "cpu")
    assert on_gpu == on_cpu
    model = model.to("cuda").eval()
    for request_id, prompt in zip(["r0", "r1", "cached"], PROMPTS, strict=True):
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([prompt], device="cuda"), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                do_sample=False, pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        assert on_gpu[request_id] == expected, request_id


def test_cuda_auto_dtype_is_the_checkpoints_half_dtype(tmp_path):
    path = save_safetensors(make_hf_model("llama", seed=3), str(tmp_path / "llama"), None)
    outputs, core = greedy(path, "cuda", dtype="auto")
    assert next(core.runner.executor.model.parameters()).dtype in (torch.float16, torch.bfloat16)
    assert all(len(tokens) == MAX_TOKENS for tokens in outputs.values())
