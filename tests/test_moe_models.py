"""Mixtures of experts in the reference engine, exact to transformers: tiny
random-init Mixtral (routing weights always renormalized), OLMoE (q/k norms
over the whole projections, weights not renormalized), Qwen2-MoE (q/k/v
bias, a shared expert with its sigmoid gate, a dense layer by
`mlp_only_layers`) and Qwen3-MoE (per-head q/k norms, renormalized
weights, dense layers by `decoder_sparse_step`) as float32 safetensors,
6 experts, top 2, run through the paged cache with chunked prefill and a
prefix-cache hit: every sampled position's logits within 1e-4 of
transformers' and greedy output equal to `generate`, the tokens of one step
routed to several experts, and only the experts a token was routed to run.
They run the torch step (float32 weights), a bfloat16 checkpoint's experts
multiplied as stored. The same models as GGUF files in llama.cpp's layout
(`qwen3moe`, `qwen2moe`, `olmoe`, Mixtral as `llama` with
`llama.expert_count`; experts stacked in `ffn_*_exps`), F16 and a
Q4_0/Q8_0 mix, and llama.cpp's first Mixtral layout (a tensor per expert),
read in place (each expert its rows of the file's blocks: the torch-free
native executor, or the torch one where some rows are not whole blocks)
and dequantized, match transformers on the weights the file holds; bad MoE
metadata is named. (`tests/test_native_step.py` holds the native step's
experts equal to the torch step's.)"""

from __future__ import annotations

import copy
import logging
from collections import Counter

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from vllm_rs.engine import make_engine_config  # noqa: E402
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks  # noqa: E402
from vllm_rs.engine.layers.moe import SparseMoeBlock  # noqa: E402
from vllm_rs.engine.model_loader.registry import ModelPathError, resolve_model  # noqa: E402
from vllm_rs.engine.models import llama  # noqa: E402
from vllm_rs.engine.worker.native_executor import NativeExecutor, NativeStepUnsupported  # noqa: E402
from vllm_rs.engine.worker.torch_executor import TorchExecutor  # noqa: E402

from tests.support.executors import linear_blocks  # noqa: E402
from tests.support.tiny_models import make_hf_model, save_gguf, save_safetensors  # noqa: E402
from tests.test_gguf_formats import file_backed  # noqa: E402
from tests.test_real_models import _check_against_transformers, one_thread  # noqa: E402, F401

ARCHS = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe")
ARCHITECTURES = {
    "mixtral": "MixtralForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (transformers model, safetensors directory)."""
    root = tmp_path_factory.mktemp("tiny-moe")
    out = {}
    for seed, arch in enumerate(ARCHS):
        model = make_hf_model(arch, seed=10 + seed)
        out[arch] = (model, save_safetensors(model, str(root / arch)))
    return out


def _sparse(model) -> tuple[bool, ...]:
    """Which of transformers' decoder layers have routed experts."""
    return tuple(type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in model.model.layers)


@pytest.mark.parametrize("arch", ARCHS)
def test_config_reads_the_experts(checkpoints, arch):
    model, path = checkpoints[arch]
    config = resolve_model(path).transformer
    hf = model.config
    assert config.architecture == ARCHITECTURES[arch]
    moe = config.moe
    assert (moe.num_experts, moe.top_k) == (6, 2)
    assert moe.sparse_layers == _sparse(model) and True in moe.sparse_layers
    assert moe.norm_topk_prob == (arch == "mixtral" or hf.norm_topk_prob)
    assert moe.intermediate_size == getattr(hf, "moe_intermediate_size", hf.intermediate_size)
    assert moe.shared_expert_intermediate_size == (80 if arch == "qwen2_moe" else 0)
    assert config.qkv_bias == (arch == "qwen2_moe")
    assert (config.qk_norm, config.qk_norm_whole) == (arch in ("olmoe", "qwen3_moe"), arch == "olmoe")
    if arch == "qwen2_moe":
        assert moe.sparse_layers == (True, False, True)  # mlp_only_layers=[1]
    if arch == "qwen3_moe":
        assert moe.sparse_layers == (False, True, False)  # decoder_sparse_step=2
    parameters = sum(p.numel() for p in model.parameters())
    assert config.num_parameters() == parameters


class Routing:
    """What the engine's MoE blocks did: each routing (the block, its rows,
    the distinct experts chosen) and each expert MLP's call (its rows)."""

    def __init__(self, monkeypatch):
        self.routes: list[tuple[SparseMoeBlock, int, frozenset[int]]] = []
        self.calls: Counter[int] = Counter()
        self.rows: Counter[int] = Counter()
        route, mlp = SparseMoeBlock.route, llama.MLP.forward

        def recording_route(block, x):
            weights, experts = route(block, x)
            self.routes.append((block, x.shape[0], frozenset(experts.flatten().tolist())))
            for e, count in Counter(experts.flatten().tolist()).items():
                self.rows[id(block.experts[e])] += count
            return weights, experts

        def recording_mlp(module, x):
            self.calls[id(module)] += 1
            self.rows[id(module)] -= x.shape[0]
            return mlp(module, x)

        monkeypatch.setattr(SparseMoeBlock, "route", recording_route)
        monkeypatch.setattr(llama.MLP, "forward", recording_mlp)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_match_transformers(checkpoints, monkeypatch, arch):
    """Prompts of 3 to 34 tokens in one batch (chunked by 16), then one
    sharing two cached blocks; the steps that route tokens of several
    prompts use more experts than one token's top 2, and each expert runs
    once per routing that chose it, on exactly the rows routed to it."""
    model, path = checkpoints[arch]
    routing = Routing(monkeypatch)
    core = _check_against_transformers(model, path, seed=1)
    assert core.runner.executor.native_step is None
    assert max(len(experts) for _, rows, experts in routing.routes if rows > 1) > 2
    expected = Counter(id(block.experts[e]) for block, _, experts in routing.routes for e in experts)
    experts = {id(m) for block, _, _ in routing.routes for m in block.experts}
    assert Counter({k: v for k, v in routing.calls.items() if k in experts}) == expected
    assert all(routing.rows[k] == 0 for k in experts)


def test_bfloat16_checkpoint_multiplies_the_experts_as_stored(tmp_path):
    """A bfloat16 Qwen2-MoE on the CPU (float32 activations, the default):
    every linear layer, the experts and the gates included, the kernel's
    BF16 rows; the torch step runs it, matching transformers on the same
    weights."""
    from vllm_rs.engine.layers.packed_weights import PackedLinear

    model = make_hf_model("qwen2_moe", seed=20)
    path = save_safetensors(copy.deepcopy(model).to(torch.bfloat16), str(tmp_path / "half"))
    with torch.no_grad():  # the reference: the stored weights, widened
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    core = _check_against_transformers(model, path, seed=2, quantization=None)
    assert core.config.model_config.quantization == "half" and core.runner.executor.native_step is None
    block = core.runner.executor.model.model.layers[0].mlp
    assert isinstance(block, SparseMoeBlock)
    assert all(isinstance(m, PackedLinear) for m in (block.gate, block.shared_expert_gate, block.experts[0].up_proj))


def _rounded(model, experts: str = "Q4_0"):
    """A copy of `model` with the weights a Q4_0/Q8_0 GGUF of it holds
    (GGUF_QUANT): the experts' rows through `experts`, every other matrix but
    the routers (which stay float32) through Q8_0. Rounding twice gives
    the same bits, so the file written from the copy holds it exactly."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2 or name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                continue
            param.copy_(_rounded_rows(param, experts if ".mlp.experts." in name else "Q8_0"))
    return model


def _rounded_rows(param: torch.Tensor, kind: str) -> torch.Tensor:
    """`param`'s rows through the ggml type `kind` and back."""
    ggml = gguf.GGMLQuantizationType[kind]
    rows = param.detach().reshape(-1, param.shape[-1]).numpy()
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(rows, ggml), ggml)).reshape(param.shape)


#: The quantized mix: the stacked experts Q4_0, the rest Q8_0 (the routers F32).
GGUF_QUANT = {"_exps": "Q4_0", "": "Q8_0"}
#: Qwen-MoE's expert rows made whole Q4_0/Q8_0 blocks (48 and 80 are not).
QUANTIZABLE_SIZES = {"qwen2_moe": dict(moe_intermediate_size=64, shared_expert_intermediate_size=96),
                     "qwen3_moe": dict(moe_intermediate_size=64)}  # fmt: skip


def _experts(core) -> dict[str, GgufBlocks | None]:
    """The routed experts' weights of the core's model: the blocks the
    kernel reads, None where held dense."""
    return {name: blocks for name, blocks in linear_blocks(core).items() if ".mlp.experts." in name}


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_config_reads_the_experts(checkpoints, tmp_path, arch):
    """llama.cpp's metadata (`expert_count`, `expert_used_count`, the
    expert and shared expert sizes) and tensors (a router per sparse layer)
    give the config the safetensors checkpoint does."""
    model, directory = checkpoints[arch]
    ours = resolve_model(save_gguf(model, str(tmp_path / f"{arch}.gguf"), f16=True)).transformer
    theirs = resolve_model(directory).transformer
    assert ours.architecture == theirs.architecture and ours.moe == theirs.moe
    fields = ("qkv_bias", "qk_norm", "qk_norm_whole", "intermediate_size", "num_layers", "tie_word_embeddings")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    assert ours.num_parameters() == theirs.num_parameters()


@pytest.mark.parametrize("arch", ARCHS)
def test_f16_gguf_matches_transformers(checkpoints, tmp_path, arch, caplog):
    """An F16 GGUF as llama.cpp's converter writes it (experts stacked,
    Mixtral's Q/K rows permuted) holds the float16-exact model: every
    sampled position's logits within 1e-4 of transformers', greedy output
    its `generate`. The torch executor runs it and its start line says why;
    each expert is rows of the file's own F16 blocks, read in place, where
    its rows are whole 32-weight groups (Qwen-MoE's 48-wide down rows are
    dequantized, so the torch executor runs those files and says why; the
    torch-free one the others)."""
    model, _ = checkpoints[arch]
    path = save_gguf(model, str(tmp_path / f"{arch}.gguf"), f16=True)
    with caplog.at_level(logging.INFO):
        core = _check_against_transformers(model, path, seed=1, quantization=None)
    narrow_rows = arch in ("qwen2_moe", "qwen3_moe")
    assert isinstance(core.runner.executor, TorchExecutor if narrow_rows else NativeExecutor)
    if narrow_rows:
        assert "torch step (some weights are not held as blocks the kernel reads" in caplog.text
    experts = _experts(core)
    assert len(experts) == 6 * 3 * sum(resolve_model(path).transformer.moe.sparse_layers)
    for name, blocks in experts.items():
        narrow = arch in ("qwen2_moe", "qwen3_moe") and name.endswith("down_proj.weight")
        assert (blocks is None) == narrow, name
        assert blocks is None or (blocks.type == 1 and file_backed(blocks.rows)), name


def test_a_gguf_of_one_tensor_per_expert_matches_transformers(checkpoints, tmp_path):
    """llama.cpp's first Mixtral layout (`blk.L.ffn_gate.E.weight`, one
    Q8_0 tensor per expert), read in place: as the stacked one."""
    model = _rounded(checkpoints["mixtral"][0], experts="Q8_0")
    path = save_gguf(model, str(tmp_path / "mixtral-legacy.gguf"), quant={"": "Q8_0"}, stacked_experts=False)
    core = _check_against_transformers(model, path, seed=1, quantization="gguf")
    experts = _experts(core).values()
    assert len(experts) == 2 * 6 * 3 and all(b is not None and b.type == 8 and file_backed(b.rows) for b in experts)


@pytest.mark.parametrize("quantization", ["gguf", "none"])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_gguf_matches_transformers_on_its_weights(tmp_path, arch, quantization):
    """A Q4_0-experts, Q8_0-elsewhere GGUF, read in place (`--quantization
    gguf`) or dequantized one expert at a time (`none`): every sampled
    position's logits within 1e-4 of transformers' on the same (rounded)
    weights, greedy output its `generate`; in place, each expert's weight
    is its rows of the file's Q4_0 blocks, the attention's Q8_0, the
    routers float32."""
    model = _rounded(make_hf_model(arch, seed=10 + ARCHS.index(arch), **QUANTIZABLE_SIZES.get(arch, {})))
    path = save_gguf(model, str(tmp_path / f"{arch}-q4_0.gguf"), quant=GGUF_QUANT)
    core = _check_against_transformers(model, path, seed=1, quantization=quantization)
    executor = core.runner.executor
    assert isinstance(executor, NativeExecutor if quantization == "gguf" else TorchExecutor)
    layers = linear_blocks(core)
    if quantization == "none":
        assert not layers  # every weight a float32 tensor of torch's nn.Linear
        return
    experts = _experts(core).values()
    assert experts and all(b is not None and b.type == 2 and file_backed(b.rows) for b in experts)
    assert all(b is not None and b.type == 8 for n, b in layers.items() if ".self_attn." in n)
    routers = [w for n, w in executor.weights.items() if n.endswith("mlp.gate.weight")]
    assert routers and all(w.dtype == np.float32 for w in routers)


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_the_native_executor_refuses_experts_it_cannot_read_in_place(checkpoints, tmp_path, arch):
    """Experts of 48-wide down rows (not whole 32-weight F16 groups): the
    torch-free executor names the tensor from the file's header and refuses
    before reading any (the runner then takes the torch executor)."""
    model, _ = checkpoints[arch]
    path = save_gguf(model, str(tmp_path / f"{arch}.gguf"), f16=True)
    config = make_engine_config(path, max_model_len=64, device="cpu", dtype="float32", block_size=8,
                                kv_cache_memory_bytes=1 << 20, quantization="gguf")  # fmt: skip
    with pytest.raises(
        NativeStepUnsupported, match=r"the kernel does not read blk\.\d\.ffn_down_exps\.weight's F16 in place"
    ):
        NativeExecutor(config)


def _gguf(path: str, arch: str, metadata: dict[str, int]) -> str:
    writer = gguf.GGUFWriter(path, arch)
    dense = {"block_count": 1, "embedding_length": 4, "attention.head_count": 1, "feed_forward_length": 8}
    for key, value in {**dense, **metadata}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("arch", "metadata", "message"),
    [("qwen3moe", {"expert_used_count": 2}, r"GGUF metadata has no qwen3moe\.expert_count"),
     ("qwen2moe", {"expert_count": 4, "expert_used_count": 6}, r"qwen2moe\.expert_used_count 6 with 4 experts"),
     ("olmoe", {"expert_count": 4, "expert_used_count": 2, "expert_gating_func": 2},
      r"olmoe\.expert_gating_func 2 is not supported \(supported: softmax\)"),
     ("llama", {"expert_count": 8}, r"GGUF metadata has no llama\.expert_used_count"),
     ("deepseek2", {}, r"GGUF architecture 'deepseek2' is not supported \(supported: .*qwen2moe, qwen3moe, olmoe\)")],
)  # fmt: skip
def test_moe_gguf_metadata_errors_are_named(tmp_path, arch, metadata, message):
    path = _gguf(str(tmp_path / f"{arch}.gguf"), arch, metadata)
    with pytest.raises(ModelPathError, match=rf"{arch}\.gguf: {message}"):
        resolve_model(path)
