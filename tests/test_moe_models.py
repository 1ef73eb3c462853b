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
They run the torch step (the native one says why not), a bfloat16
checkpoint's experts multiplied as stored, and a MoE GGUF is refused,
naming its architecture."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from vllm_rs.engine.layers.moe import SparseMoeBlock  # noqa: E402
from vllm_rs.engine.model_loader.registry import ModelPathError, resolve_model  # noqa: E402
from vllm_rs.engine.models import llama  # noqa: E402
from vllm_rs.engine.worker.torch_executor import native_step_unsupported  # noqa: E402

from tests.support.tiny_models import make_hf_model, save_safetensors  # noqa: E402
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


@pytest.mark.parametrize("arch", ARCHS)
def test_native_step_names_the_experts(checkpoints, arch):
    """The native step does not run a mixture of experts, and says so."""
    from vllm_rs.engine.model_loader.weights import load_model

    _, path = checkpoints[arch]
    model = load_model(resolve_model(path), torch.float32, torch.device("cpu"))
    assert "mixture-of-experts layers" in native_step_unsupported(model, torch.device("cpu"), torch.float32)


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


def _gguf(path: str, arch: str, **metadata) -> str:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    for key, value in metadata.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("arch", "metadata", "named"),
    [("qwen3moe", {}, "Qwen3MoeForCausalLM"), ("qwen2moe", {}, "Qwen2MoeForCausalLM"), ("olmoe", {}, "OlmoeForCausalLM"),
     ("llama", {"expert_count": 8, "expert_used_count": 2}, "MixtralForCausalLM")],
)  # fmt: skip
def test_moe_gguf_is_refused_naming_the_architecture(tmp_path, arch, metadata, named):
    path = _gguf(str(tmp_path / f"{arch}.gguf"), arch, **metadata)
    message = rf"{arch}\.gguf: GGUF architecture '{arch}' \({named}, a mixture of experts\) is not supported for GGUF"
    with pytest.raises(ModelPathError, match=message):
        resolve_model(path)
