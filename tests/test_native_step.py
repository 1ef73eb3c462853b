"""The native step (`engine/worker/native_step.py`: the whole decoder in one call
of `_core.DecoderStack`, built from the torch modules' weights or, for a
GGUF, by the torch-free `native_executor` from the file) against the torch
step (`--enforce-eager`) on the same weights: every architecture it runs (Llama with Llama 3 RoPE scaling,
Mistral, Qwen2 with q/k/v biases and tied embeddings, Qwen3 with q/k norms,
Granite with its multipliers, SmolLM3 with layers without RoPE, Phi-3
with fused projections, partial rotary and LongRoPE, Gemma 3 with its
windowed layers, output norms, GeGLU and softcapping),
weights read in place as F16/BF16 rows, GGUF blocks of several types and the
packaged SmolLM2, through the paged cache with chunked prefill beside
decodes, a prefix-cache hit and preemption: every sampled row's logits
within float32 rounding, greedy tokens equal. Then where it does not run
(the engine says why) and the bad calls `DecoderStack` refuses."""

from __future__ import annotations

import copy
import logging
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from vllm_rs import _core  # noqa: E402
from vllm_rs.engine import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.model_loader.checkpoint import config_from_hf  # noqa: E402
from vllm_rs.engine.models.gemma3 import Gemma3ForCausalLM  # noqa: E402
from vllm_rs.engine.models.llama import CausalLM  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest  # noqa: E402
from vllm_rs.engine.worker.native_executor import NativeExecutor  # noqa: E402
from vllm_rs.engine.worker.native_step import decoder_weight_shapes  # noqa: E402

from tests.support.greedy import run_to_completion
from tests.support.tiny_models import gemma3_gguf_model, make_hf_model, save_gguf, save_safetensors  # noqa: E402
from tests.test_real_models import _prompts, run_engine  # noqa: E402

#: The two steps sum in different orders (the kernel's lanes and threads
#: against torch's); the tiny models' logits are of order 10.
LOGITS_TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_same_step(path: str, prompts: list[list[int]], quantization: str | None = None) -> EngineCore:
    """Runs `prompts` natively and with `--enforce-eager`; asserts the
    native step ran, the greedy tokens are equal and every sampled row's
    logits agree. Returns the native core."""
    native_out, native_logits, native = run_engine(path, prompts, quantization=quantization)
    eager_out, eager_logits, eager = run_engine(path, prompts, quantization=quantization, enforce_eager=True)
    assert native.runner.executor.native_step is not None and eager.runner.executor.native_step is None
    assert native.scheduler.kv_cache_manager.block_pool.hits >= 2, "the last prompt should reuse two cached blocks"
    assert native_out == eager_out
    for request_id, rows in eager_logits.items():
        ours = torch.stack(native_logits[request_id])
        torch.testing.assert_close(ours, torch.stack(rows), atol=LOGITS_TOLERANCE, rtol=0)
    return native


@pytest.mark.parametrize(
    ("arch", "dtype"),
    [
        ("llama", torch.float16),
        ("mistral", torch.bfloat16),
        ("qwen2", torch.bfloat16),
        ("qwen3", torch.float16),
        ("granite", torch.bfloat16),
        ("smollm3", torch.float16),
        ("phi3", torch.bfloat16),
        ("gemma3_text", torch.bfloat16),
        ("qwen3_moe", torch.bfloat16),
        ("qwen2_moe", torch.float16),
        ("olmoe", torch.bfloat16),
        ("mixtral", torch.float16),
    ],  # fmt: skip
)
def test_half_checkpoints_step_natively_as_in_torch(tmp_path, arch, dtype):
    # Gemma 3 with its logits softcapped (the tiny logits are of order 10).
    sizes = {"final_logit_softcapping": 8.0} if arch == "gemma3_text" else WHOLE_BLOCK_EXPERTS.get(arch, {})
    model = make_hf_model(arch, seed=3, **sizes)
    path = save_safetensors(copy.deepcopy(model).to(dtype), str(tmp_path / arch))
    assert_same_step(path, _prompts(model.config.vocab_size, 4))


#: The tiny Qwen-MoEs' experts with rows of whole blocks of 32 (F16, Q8_0),
#: so that the kernel reads every expert in place.
WHOLE_BLOCK_EXPERTS = {
    "qwen3_moe": {"moe_intermediate_size": 64},
    "qwen2_moe": {"moe_intermediate_size": 64, "shared_expert_intermediate_size": 96},
}


#: Files of several block types: legacy and K-quant blocks side by side.
GGUF_MIXES = {
    "qwen2-q4_k-q8_0": (
        "qwen2",
        {"token_embd": "Q8_0", "attn_": "Q8_0", "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
    ),
    "qwen3-q4_0-q5_1": ("qwen3", {"attn_": "Q4_0", "ffn_": "Q5_1", "output": "Q8_0"}),
    "llama-q4_1-iq4_nl": ("llama", {"attn_": "Q4_1", "ffn_": "IQ4_NL", "output": "Q6_K"}),
}


@pytest.mark.parametrize("name", list(GGUF_MIXES))
def test_gguf_blocks_step_natively_as_in_torch(tmp_path, name):
    arch, quant = GGUF_MIXES[name]
    model = make_hf_model(arch, seed=5, hidden_size=256, intermediate_size=512)
    path = save_gguf(model, str(tmp_path / f"{name}.gguf"), quant=quant)
    assert_same_step(path, _prompts(model.config.vocab_size, 6), quantization="gguf")


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "qwen2",
        "qwen3",
        "granite",
        "smollm3",
        "phi3",
        "gemma3_text",
        "qwen3_moe",
        "qwen2_moe",
        "olmoe",
        "mixtral",
    ],
)
def test_gguf_files_of_every_family_step_without_torch_as_in_torch(tmp_path, arch):
    """A GGUF runs on the torch-free executor (`native_executor`), which
    reads the file by itself: the same logits as the torch modules."""
    # llama.cpp's smollm3 leaves RoPE out of every 4th layer.
    sizes = {"num_hidden_layers": 4, "no_rope_layer_interval": 4} if arch == "smollm3" else {}
    sizes.update(WHOLE_BLOCK_EXPERTS.get(arch, {}))
    model = gemma3_gguf_model(seed=4) if arch == "gemma3_text" else make_hf_model(arch, seed=4, **sizes)
    path = save_gguf(model, str(tmp_path / f"{arch}.gguf"), f16=True)
    native = assert_same_step(path, _prompts(model.config.vocab_size, 4), quantization="gguf")
    assert isinstance(native.runner.executor, NativeExecutor)


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "qwen3", "granite", "phi3", "gemma3_text", "qwen3_moe", "qwen2_moe", "olmoe", "mixtral"]
)
def test_the_native_steps_weight_list_is_the_torch_modules(arch):
    """`decoder_weight_shapes` (what the torch-free executor reads from a
    file) names exactly the weights `llama.CausalLM` (or Gemma 3's) holds,
    with their shapes."""
    config = config_from_hf(make_hf_model(arch, seed=0).config.to_dict(), arch)
    module = (Gemma3ForCausalLM if arch == "gemma3_text" else CausalLM).build(config)
    assert decoder_weight_shapes(config) == {name: tuple(t.shape) for name, t in module.state_dict().items()}


def test_packaged_smollm2_steps_natively_as_in_torch(smollm2):
    prompts = [list(range(1000, 1000 + n)) for n in (5, 37, 64)] + [list(range(1000, 1024)) + [7, 8, 9]]
    assert_same_step(smollm2, prompts)


def test_preempted_requests_resume_natively_as_in_torch(tmp_path):
    model = make_hf_model("qwen2", seed=7)
    path = save_safetensors(model.to(torch.bfloat16), str(tmp_path / "qwen2"))
    prompts = _prompts(model.config.vocab_size, 3)[:4]

    def generate(enforce_eager: bool) -> tuple[dict[str, list[int]], int]:
        config = make_engine_config(path, device="cpu", max_model_len=64, block_size=4, num_gpu_blocks=16,
                                    max_num_batched_tokens=16, enforce_eager=enforce_eager)  # fmt: skip
        core = EngineCore(config)
        assert (core.runner.executor.native_step is None) == enforce_eager
        for i, prompt in enumerate(prompts):
            core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": 20}))
        outputs = run_to_completion(core)
        return outputs, core.scheduler.num_preemptions

    (native, native_preempted), (eager, eager_preempted) = generate(False), generate(True)
    assert native_preempted > 0 and eager_preempted > 0
    assert native == eager


def test_int8_kernel_precision_stays_near_the_exact_step(smollm2):
    """`--kernel-precision int8` reaches the decode steps' products (their
    logits move) and stays within its bound's reach: every first decode row
    within 10% of the row's largest logit, its exact greedy token among the
    int8 row's 5 largest. The prefill (one step of 42 tokens) is exact, bit
    for bit, where `int8_runs(42)` is false (a CPU without AVX-512 VNNI),
    else within the same reach."""
    from vllm_rs._core import int8_runs

    prompts = [list(range(1000, 1000 + n)) for n in (5, 37)]
    exact_out, exact_logits, _ = run_engine(smollm2, prompts, quantization=None)
    int8_out, int8_logits, core = run_engine(smollm2, prompts, quantization=None, kernel_precision="int8")
    assert core.runner.executor.native_step is not None
    prefill_int8 = int8_runs(sum(len(p) for p in prompts))
    for request_id, rows in exact_logits.items():
        for step in (0, 1) if prefill_int8 else (1,):
            moved = (int8_logits[request_id][step] - rows[step]).abs().max().item()
            assert 0 < moved < 0.1 * rows[step].abs().max().item(), (request_id, step, moved)
            assert exact_out[request_id][step] in torch.topk(int8_logits[request_id][step], 5).indices.tolist()
        if not prefill_int8:
            assert torch.equal(int8_logits[request_id][0], rows[0]), f"{request_id}: the prefill's logits moved"
            assert int8_out[request_id][0] == exact_out[request_id][0]


def test_int8_kernel_precision_without_the_native_step_is_refused(smollm2, tmp_path):
    from vllm_rs.engine.config import EngineConfigError

    needs = "--kernel-precision int8 needs the native step"
    with pytest.raises(EngineConfigError, match=f"{needs}, which does not run --enforce-eager"):
        make_engine_config(smollm2, device="cpu", kernel_precision="int8", enforce_eager=True)
    with pytest.raises(EngineConfigError, match=f"{needs}, which does not run the toy model"):
        make_engine_config("toy", kernel_precision="int8")
    dense = save_safetensors(make_hf_model("qwen2", seed=1), str(tmp_path / "q"))
    config = make_engine_config(dense, device="cpu", max_model_len=64, num_gpu_blocks=8, kernel_precision="int8")
    with pytest.raises(EngineConfigError, match=f"{needs}, which cannot run this model: some weights are not held"):
        EngineCore(config)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("float32 safetensors", "dense float32 weights"),
        ("dequantized gguf", "dense float32 weights"),
        ("enforce eager", "--enforce-eager"),
    ],
)
def test_where_the_native_step_does_not_run_the_engine_says_why(tmp_path, caplog, case, reason):
    if case == "enforce eager":
        path = save_safetensors(make_hf_model("qwen3_moe", seed=1).to(torch.bfloat16), str(tmp_path / "m"))
    elif case == "float32 safetensors":
        path = save_safetensors(make_hf_model("qwen2", seed=1), str(tmp_path / "q"))
    else:
        path = save_gguf(make_hf_model("qwen2", seed=1), str(tmp_path / "q.gguf"), f16=True)
    quantization = "none" if case == "dequantized gguf" else None
    with caplog.at_level(logging.INFO):
        config = make_engine_config(path, device="cpu", max_model_len=64, num_gpu_blocks=8, quantization=quantization,
                                    enforce_eager=case == "enforce eager")  # fmt: skip
        core = EngineCore(config)
    assert core.runner.executor.native_step is None
    assert "torch step (" in caplog.text and reason in caplog.text


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory):
    """A native step of a tiny Qwen2 (F16 GGUF) and its cache arrays."""
    model = make_hf_model("qwen2", seed=2, num_hidden_layers=1)
    path = save_gguf(model, str(tmp_path_factory.mktemp("stack") / "q.gguf"), f16=True)
    assert model.config.hidden_size == HIDDEN
    core = EngineCore(make_engine_config(path, device="cpu", max_model_len=64, num_gpu_blocks=4, block_size=8))
    return core.runner.executor.native_step, core.runner.executor.kv_caches


#: The tiny models' width.
HIDDEN = 64


def step_args(stack, tokens: int = 2) -> dict[str, np.ndarray]:
    i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return {
        "x": np.zeros((tokens, HIDDEN), np.float32),
        "positions": i64(range(tokens)),
        "slot_mapping": i64(range(tokens)),
        "key_starts": i64([0] * tokens),
        "key_slots": i64(range(tokens)),
        "logits_rows": i64([tokens - 1]),
        "logits": np.zeros((1, stack.vocab), np.float32),
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda a: a.update(slot_mapping=np.array([0, 32], np.int64)),
            "token 1: slot 32 is outside the cache's 32 slots",
        ),
        (
            lambda a: a.update(positions=np.array([0, 2], np.int64)),
            "token 1: keys 0..=0+2 are outside key_slots' 2 slots",
        ),
        (lambda a: a.update(positions=np.array([0, -1], np.int64)), "token 1: position -1 is negative"),
        (
            lambda a: a.update(key_slots=np.array([0, -3], np.int64)),
            "key_slots[1] = -3 is outside the cache's 32 slots",
        ),
        (
            lambda a: a.update(logits_rows=np.array([2], np.int64)),
            "logits row 0 is token 2, not below the step's 2 tokens",
        ),
        (lambda a: a.update(x=np.zeros((2, HIDDEN - 1), np.float32)), "x has 126 elements, the shapes need 128"),
        (lambda a: a.update(logits=np.zeros((2, 3), np.float32)), "logits has 6 elements, the shapes need"),
    ],
)
def test_bad_steps_are_refused_before_the_cache_is_written(small_stack, edit, message):
    stack, caches = small_stack
    keys, _ = caches[0]
    keys.fill(7.0)
    args = step_args(stack)
    edit(args)
    with pytest.raises(ValueError, match=re.escape(f"DecoderStack.forward: {message}")):
        stack._stack.forward(*args.values(), 1)
    assert (keys == 7.0).all(), "nothing is written by a refused step"


def test_buffers_of_the_wrong_type_are_named(small_stack):
    stack, _ = small_stack
    args = step_args(stack)
    args["positions"] = args["positions"].astype(np.int32)
    with pytest.raises(TypeError, match="positions must be a buffer of int64"):
        stack._stack.forward(*args.values(), 1)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        stack._stack.forward(*step_args(stack).values(), 0)


def test_a_model_whose_shapes_do_not_fit_is_refused():
    ones = np.ones(8, np.float32)
    rows = np.zeros((8, 2 * 32), np.uint8)  # F16 rows of 32 weights
    linear = (1, rows, 8, 32, None)
    layer = (ones, ones, None, None, [linear] * 7, None, 0, None, None, 0, None)
    shape = (32, 2, 1, 4, 32, 8, 1e-6, 0.5, 1.0, 4, 1.0)
    norm, table = np.ones(32, np.float32), np.ones(2, np.float32)
    with pytest.raises(ValueError, match=re.escape("inv_freqs[0] has 4 elements, the shapes need 2")):
        _core.DecoderStack(shape, [np.ones(4, np.float32)], [layer], norm, linear, [])
    with pytest.raises(ValueError, match="layer 0 has 6 linear layers, not 7"):
        bad = (ones, ones, None, None, [linear] * 6, None, 0, None, None, 0, None)
        _core.DecoderStack(shape, [table], [bad], norm, linear, [])
    with pytest.raises(ValueError, match="layer 0: RoPE table 1, but the model has 1"):
        bad = (ones, ones, None, None, [linear] * 7, None, 1, None, None, 0, None)
        _core.DecoderStack(shape, [table], [bad], norm, linear, [])
    with pytest.raises(ValueError, match='activation "relu" is not "silu" or "gelu_tanh"'):
        _core.DecoderStack(shape, [table], [layer], norm, linear, [], activation="relu")
