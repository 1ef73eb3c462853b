"""Gemma 3 in the reference engine, exact to transformers: a tiny
random-init Gemma3ForCausalLM (5 sliding-window layers with a window of 8
and their own RoPE base, 1 global layer with linear RoPE scaling, q/k
norms, pre- and post-norms, GeGLU, scaled and tied embeddings,
`query_pre_attn_scalar`) as safetensors and as llama.cpp's `gemma3` GGUF
(F32, F16, and Q8_0/Q4_0 weights read in place by the Rust kernel) and
as a multimodal Gemma3ForConditionalGeneration checkpoint, run
through the paged cache with chunked prefill, a prefix-cache hit and
prompts longer than the window: every sampled position's logits within
1e-4 of transformers' and greedy output equal to `generate`. Then the
packaged Gemma 3 270M Q4_K_M GGUF against transformers reading the same
file."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from vllm_rs.engine import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.model_loader.registry import resolve_model  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest  # noqa: E402
from vllm_rs.engine.worker import torch_executor  # noqa: E402

from tests.support.executors import linear_blocks  # noqa: E402
from tests.support.gemma3_270m import gemma3_270m_path  # noqa: E402
from tests.support.tiny_models import gemma3_gguf_model, make_hf_model, save_gguf, save_safetensors  # noqa: E402
from tests.test_real_models import _check_against_transformers, one_thread  # noqa: E402, F401

WINDOW = 8


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """The safetensors model and the GGUF one, with their files."""
    root = tmp_path_factory.mktemp("tiny-gemma3")
    model = make_hf_model("gemma3_text", seed=5)
    gguf_model = gemma3_gguf_model(seed=6)
    paths = {
        "safetensors": save_safetensors(model, str(root / "st")),
        "gguf-f32": save_gguf(gguf_model, str(root / "f32.gguf")),
        "gguf-f16": save_gguf(gguf_model, str(root / "f16.gguf"), f16=True),
    }
    return model, gguf_model, paths


def test_config_has_both_layer_kinds(gemma3):
    model, gguf_model, paths = gemma3
    for path, reference in ((paths["safetensors"], model), (paths["gguf-f32"], gguf_model)):
        config = resolve_model(path).transformer
        assert config.architecture == "Gemma3ForCausalLM"
        expected = tuple(WINDOW if kind == "sliding_attention" else None for kind in reference.config.layer_types)
        assert config.layer_windows == expected and None in expected and WINDOW in expected
        assert config.local_rope_theta == 10000.0 and config.rope_theta == 1000000.0
        assert config.rope_scaling["rope_type"] == "linear" and config.rope_scaling["factor"] == 4.0
        assert config.query_pre_attn_scalar == reference.config.query_pre_attn_scalar
        assert config.tie_word_embeddings and config.final_logit_softcapping is None


@pytest.mark.parametrize("decodes", ["kernel", "gathered"])
def test_safetensors_logits_and_greedy_match_transformers(gemma3, monkeypatch, decodes):
    """Decodes attended by the Rust kernel (a float32 cache on the CPU) and
    by torch over gathered keys with a mask (a CUDA or half cache)."""
    model, _, paths = gemma3
    if decodes == "gathered":
        monkeypatch.setattr(torch_executor, "attends_in_place", lambda device, dtype: False)
    _check_against_transformers(model, paths["safetensors"], seed=1)


@pytest.mark.parametrize(("fmt", "quantization"), [("gguf-f32", "none"), ("gguf-f16", "none"), ("gguf-f16", "gguf")])
def test_gguf_logits_and_greedy_match_transformers(gemma3, fmt, quantization):
    _, gguf_model, paths = gemma3
    _check_against_transformers(gguf_model, paths[fmt], seed=2, quantization=quantization)


def test_quantized_gguf_read_in_place_matches_transformers_reading_it(gemma3, tmp_path):
    """Q8_0 and Q4_0 weights (the tiny rows are not whole K-quant blocks),
    multiplied in place by the Rust kernel, against transformers loading
    the same file (with the tiny config, which the GGUF's metadata does not
    fully give: transformers' defaults are the real models' sizes)."""
    _, gguf_model, _ = gemma3
    kinds = {"attn_": "Q8_0", "ffn_": "Q4_0", "token_embd": "Q8_0"}
    path = save_gguf(gguf_model, str(tmp_path / "quantized.gguf"), quant=kinds)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="quantized.gguf", config=gguf_model.config, dtype=torch.float32
    ).eval()
    core = _check_against_transformers(reference, path, seed=4, quantization="gguf")
    blocks = linear_blocks(core)
    assert blocks and all(b is not None for b in blocks.values())


def test_multimodal_checkpoints_text_part_matches_transformers(gemma3, tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint (a tiny vision tower
    beside the same text weights): its `text_config` and
    `language_model.` weights run as the text model."""
    model, _, _ = gemma3
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=model.config.to_dict(), vision_config=vision, mm_tokens_per_image=4, image_token_index=95,
        boi_token_index=93, eoi_token_index=94, architectures=["Gemma3ForConditionalGeneration"],
    )  # fmt: skip
    multimodal = transformers.Gemma3ForConditionalGeneration(config)
    multimodal.model.language_model.load_state_dict(model.model.state_dict())
    path = save_safetensors(multimodal, str(tmp_path / "multimodal"))
    spec = resolve_model(path)
    assert spec.transformer.architecture == "Gemma3ForConditionalGeneration"
    expected = tuple(WINDOW if kind == "sliding_attention" else None for kind in model.config.layer_types)
    assert spec.transformer.layer_windows == expected
    _check_against_transformers(model, path, seed=5)


def test_sparse_text_config_takes_transformers_defaults():
    """The `text_config` of Gemma 3 4B lists 5 keys; the rest are
    transformers' Gemma3TextConfig defaults."""
    from vllm_rs.engine.model_loader.checkpoint import config_from_hf

    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}  # fmt: skip
    ours = config_from_hf({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}, "config.json")
    reference = transformers.Gemma3TextConfig(**text)
    assert (ours.vocab_size, ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.max_position_embeddings) == (
        reference.vocab_size, reference.num_attention_heads, reference.num_key_value_heads, reference.head_dim,
        reference.max_position_embeddings,
    )  # fmt: skip
    assert ours.rms_norm_eps == reference.rms_norm_eps and ours.query_pre_attn_scalar == reference.query_pre_attn_scalar
    assert ours.tie_word_embeddings == reference.tie_word_embeddings
    windows = tuple(1024 if kind == "sliding_attention" else None for kind in reference.layer_types)
    assert ours.layer_windows == windows
    rope = reference.rope_parameters
    assert ours.rope_theta == rope["full_attention"]["rope_theta"]
    assert ours.local_rope_theta == rope["sliding_attention"]["rope_theta"]
    assert (
        ours.rope_scaling["rope_type"] == "linear" and ours.rope_scaling["factor"] == rope["full_attention"]["factor"]
    )


def test_final_logit_softcapping(tmp_path):
    model = make_hf_model("gemma3_text", seed=7, final_logit_softcapping=3.0)
    _check_against_transformers(model, save_safetensors(model, str(tmp_path / "capped")), seed=3)


# ---- the packaged real model ----

#: Prompts as token ids of Gemma 3's tokenizer (transformers' from this
#: GGUF, `<bos>` first): "The capital of France is", "def fibonacci(n):",
#: "Once upon a time, in a small village,"; and those three 28 times over
#: (589 tokens), longer than the 512-token window of the local layers.
SHORT_PROMPTS = (
    [2, 818, 5279, 529, 7001, 563],
    [2, 2063, 10779, 78113, 236769, 236749, 1473],
    [2, 14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744, 236764],
)
PROMPTS = (*SHORT_PROMPTS, [2] + [t for p in SHORT_PROMPTS for t in p[1:]] * 28)
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def gemma3_270m() -> str:
    return gemma3_270m_path()


def _greedy(path: str, quantization: str | None) -> tuple[dict[int, list[int]], EngineCore]:
    config = make_engine_config(path, max_model_len=1024, device="cpu", dtype="float32", kv_cache_memory_bytes=1 << 27,
                                quantization=quantization)  # fmt: skip
    core = EngineCore(config)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(EngineCoreRequest(str(i), list(prompt), {"temperature": 0.0, "max_tokens": NEW_TOKENS,
                                                                  "ignore_eos": True}))  # fmt: skip
    outputs: dict[int, list[int]] = {}
    while core.has_work():
        for _, output in core.step():
            outputs.setdefault(int(output.request_id), []).extend(output.new_token_ids)
    return outputs, core


def test_gemma3_270m_gguf_matches_transformers(gemma3_270m):
    """The default (Q4_K/Q6_K/... read in place) and `--quantization none`
    (dequantized to float32) give the same greedy tokens, equal to
    transformers' `generate` on the same file."""
    in_place, core = _greedy(gemma3_270m, None)
    assert core.config.model_config.quantization == "gguf"
    dequantized, _ = _greedy(gemma3_270m, "none")
    assert in_place == dequantized
    directory, name = os.path.split(gemma3_270m)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = reference.eval().generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        assert dequantized[i] == expected, i
