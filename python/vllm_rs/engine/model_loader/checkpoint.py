"""Reading a real model's checkpoint without torch: the decoder's
hyperparameters (`TransformerConfig`) from a Hugging Face `config.json` or
from a GGUF file's metadata, and the checks that its weight files are whole
(every safetensors header's tensors inside the file, every GGUF tensor of a
type the loader dequantizes and inside the file). `serve` runs these before
it starts anything, so a bad checkpoint is an exit 2 naming the file."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, replace
from typing import Any

from vllm_rs.engine.model_loader.gguf_file import (
    GGML_TYPES,
    GgufArray,
    GgufFormatError,
    GgufHeader,
    GgufTensor,
    read_header,
)

#: Hugging Face architecture -> its `model_type`; Gemma 3 runs `models/gemma3.py`,
#: the others `models/llama.py` (the mixtures of experts with its MLPs
#: replaced by `layers/moe.py`'s routed experts).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GraniteForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3_text",
    # Its text part only: `text_config`, the `language_model.` weights.
    "Gemma3ForConditionalGeneration": "gemma3_text",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
#: The mixture-of-experts `model_type`s (each runs with a `MoeConfig`).
MOE_MODEL_TYPES = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe")
#: transformers' Gemma3TextConfig defaults, which the `text_config` of a
#: multimodal Gemma 3 checkpoint leaves out (the 4B model's lists 5 keys).
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "sliding_window": 4096,
}
#: GGUF `general.architecture` -> Hugging Face architecture.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
#: llama.cpp's mixture-of-experts architectures (Mixtral is its `llama`
#: with `llama.expert_count`: GGUF_MIXTRAL).
GGUF_MOE_ARCHITECTURES = {
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}
GGUF_MIXTRAL = "MixtralForCausalLM"
#: Whether llama.cpp renormalizes each architecture's top-k routing weights
#: where the file has no `{arch}.expert_weights_norm` (its converter writes
#: none for these: the choice is fixed in its code, as transformers' is for
#: Mixtral and the checkpoints' `norm_topk_prob` of the others).
GGUF_MOE_NORM_TOPK = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False}
#: `{arch}.expert_gating_func` of a softmax router (gguf's ExpertGatingFuncType).
GGUF_SOFTMAX_GATING = 1
#: llama.cpp runs every 4th layer of a `smollm3` GGUF without RoPE (its
#: metadata does not say; transformers' default `no_rope_layer_interval`).
GGUF_SMOLLM3_NO_ROPE_INTERVAL = 4
#: Gemma 3's one global layer in 6: transformers' default where a config
#: has neither `layer_types` nor `sliding_window_pattern`, and what llama.cpp
#: assumes of every `gemma3` GGUF (whose metadata does not say), with the
#: windowed layers' RoPE base.
GEMMA3_SLIDING_PATTERN = 6
GGUF_GEMMA3_LOCAL_ROPE_THETA = 10000.0
#: GGUF tensor types the loader dequantizes (the `gguf` package's names).
GGUF_TYPES = tuple(name for name, _, _ in GGML_TYPES.values())
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: Bytes per element of each `--dtype`.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class CheckpointError(ValueError):
    """A checkpoint this engine cannot run (names the file and the problem)."""


@dataclass(frozen=True)
class MoeConfig:
    """The routed experts of a mixture-of-experts decoder, as transformers'
    modeling code of each defines them: the router's softmax over all
    `num_experts`, the `top_k` largest kept (renormalized to sum to 1 when
    `norm_topk_prob`), each expert a SwiGLU MLP of `intermediate_size`."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    #: Whether each layer's MLP is the routed experts (Qwen-MoE's
    #: `decoder_sparse_step` and `mlp_only_layers`); False: a dense MLP of
    #: the config's `intermediate_size`.
    sparse_layers: tuple[bool, ...]
    #: The MLP every token also runs, scaled by the sigmoid of its own gate
    #: (Qwen2-MoE's `shared_expert` and `shared_expert_gate`); 0: none.
    shared_expert_intermediate_size: int = 0
    #: Mixtral keeps the routing weights in float32 (the others cast them
    #: to the activations' dtype before scaling the experts' outputs).
    float32_weights: bool = False


@dataclass(frozen=True)
class TransformerConfig:
    """The hyperparameters of a Llama-shaped decoder (Llama, Mistral, Qwen2,
    Qwen3, ..., and the mixtures of experts: `moe`)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: Bias on the q/k/v projections (Qwen2; Llama's `attention_bias`).
    qkv_bias: bool = False
    #: Bias on the output projection (Llama's `attention_bias`).
    o_bias: bool = False
    #: RMSNorm over each head of q and k (Qwen3).
    qk_norm: bool = False
    #: With `qk_norm`: over the whole q and k projections instead, before
    #: they are split into heads (OLMoE).
    qk_norm_whole: bool = False
    #: `rope_scaling` of config.json (`rope_type` `llama3` or `linear`), or None.
    rope_scaling: dict[str, Any] | None = None
    #: The dtype the checkpoint was saved in (`torch_dtype`), when it says.
    checkpoint_dtype: str | None = None
    #: Attention window of every layer (Mistral's `sliding_window`), when one applies.
    sliding_window: int | None = None
    #: Each layer's own attention window, None for a global layer (Gemma 3's
    #: `layer_types`); empty when no layer has one. A key is visible to a
    #: query when `query_pos - key_pos < window`.
    layer_windows: tuple[int | None, ...] = ()
    #: RoPE base of the windowed layers (Gemma 3's `rope_local_base_freq`),
    #: never scaled; None: every layer uses `rope_theta` and `rope_scaling`.
    local_rope_theta: float | None = None
    #: Attention scores are scaled by its inverse square root (Gemma's
    #: `query_pre_attn_scalar`); None: by `head_dim`'s.
    query_pre_attn_scalar: float | None = None
    #: Granite's multipliers: of the token embeddings, of each attention and
    #: MLP output before the residual sum, of the attention scores (instead
    #: of `head_dim ** -0.5`, when set), and the divisor of the logits.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    #: Whether each layer rotates q and k (SmolLM3's `no_rope_layers`: 0 for
    #: a layer without RoPE); empty: every layer does.
    rope_layers: tuple[bool, ...] = ()
    #: The leading dimensions of each head RoPE rotates (Phi's
    #: `partial_rotary_factor`); None: all of them.
    rotary_dim: int | None = None
    #: `cap * tanh(logits / cap)` on the output logits (Gemma's
    #: `final_logit_softcapping`), when set.
    final_logit_softcapping: float | None = None
    #: The routed experts that replace the MLPs (`MoeConfig.sparse_layers`);
    #: None for a dense model.
    moe: MoeConfig | None = None

    @property
    def model_type(self) -> str:
        """The Hugging Face `model_type` of the architecture."""
        return ARCHITECTURES[self.architecture]

    def layer_window(self, index: int) -> int | None:
        """The attention window of layer `index` (None: it sees every key before its query)."""
        return self.layer_windows[index] if self.layer_windows else self.sliding_window

    @property
    def kv_window(self) -> int | None:
        """The widest window of any layer when every layer has one (the KV
        cache may then drop the keys that fall out of it); None when some
        layer sees every key."""
        windows = [self.layer_window(i) for i in range(self.num_layers)]
        return None if None in windows else max(windows)

    @property
    def kv_groups(self) -> tuple[int | None, ...]:
        """The window of each KV-cache group (layers that share one block
        table per request): one group where every layer or none has a
        window (`kv_window`); else two, the global layers' (None) and then
        the windowed layers' (their widest window), so that the windowed
        group can free what its window passed while the global one keeps
        every block (Gemma 3)."""
        windows = {self.layer_window(i) for i in range(self.num_layers)}
        if None not in windows or windows == {None}:
            return (self.kv_window,)
        return (None, max(w for w in windows if w is not None))

    def kv_group(self, index: int) -> int:
        """The KV-cache group of layer `index` (an index of `kv_groups`)."""
        return 0 if len(self.kv_groups) == 1 or self.layer_window(index) is None else 1

    def kv_bytes_per_token(self, dtype: str) -> int:
        """KV-cache bytes one token takes over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def num_parameters(self) -> int:
        """Parameters of the decoder (for the memory check)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qk_norms = (q + kv if self.qk_norm_whole else 2 * self.head_dim) if self.qk_norm else 0
        attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.qkv_bias else 0) + qk_norms
        # Gemma 3 norms the attention and MLP outputs too.
        layer = attn + (4 if self.model_type == "gemma3_text" else 2) * h
        dense = 3 * h * self.intermediate_size
        moe = self.moe
        if moe is None:
            mlps = self.num_layers * dense
        else:
            sparse = moe.num_experts * (3 * h * moe.intermediate_size + h)
            if moe.shared_expert_intermediate_size:
                sparse += 3 * h * moe.shared_expert_intermediate_size + h
            mlps = sum(sparse if s else dense for s in moe.sparse_layers)
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + mlps + embeddings + h


def supported_architectures() -> str:
    """The supported architectures, for error messages."""
    return ", ".join(ARCHITECTURES)


def config_from_hf(config: dict[str, Any], where: str) -> TransformerConfig:
    """A TransformerConfig from a parsed `config.json`; raises CheckpointError
    naming `where` for an unsupported architecture or a missing key."""
    architectures = config.get("architectures") or []
    architecture = next((a for a in architectures if a in ARCHITECTURES), None)
    if architecture is None:
        named = ", ".join(map(str, architectures)) or f"model_type {config.get('model_type')!r}"
        raise CheckpointError(
            f"{where}: architecture {named} is not supported (supported: {supported_architectures()})"
        )
    if architecture == "Gemma3ForConditionalGeneration":
        dtype = {"torch_dtype": config.get("torch_dtype") or config.get("dtype")}
        config = {**GEMMA3_TEXT_DEFAULTS, **dtype, **(config.get("text_config") or {})}
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        model_type = ARCHITECTURES[architecture]
        sliding = config.get("sliding_window")
        if model_type in ("qwen2", "qwen2_moe", "qwen3_moe") and not config.get("use_sliding_window", False):
            sliding = None
        gemma = _gemma3_settings(config, where) if model_type == "gemma3_text" else {}
        if not gemma and (config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias")):
            raise CheckpointError(f"{where}: only SiLU MLPs without bias are supported")
        settings = dict(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            o_bias=model_type in ("llama", "qwen3", "qwen3_moe", "olmoe") and bool(config.get("attention_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe", "olmoe"),
            # Phi-3's LongRoPE is read by _phi3_settings.
            rope_scaling=None if model_type == "phi3" else _check_rope_scaling(scaling, where),
            checkpoint_dtype=config.get("torch_dtype") or config.get("dtype"),
            sliding_window=int(sliding) if sliding else None,
        )
        if model_type == "qwen2" and sliding:
            settings.update(_qwen2_windows(config, int(sliding)))
        if model_type == "granite":
            settings.update(
                embedding_multiplier=float(config.get("embedding_multiplier", 1.0)),
                residual_multiplier=float(config.get("residual_multiplier", 1.0)),
                attention_multiplier=float(config.get("attention_multiplier", 1.0)),
                logits_scaling=float(config.get("logits_scaling", 1.0)),
                o_bias=bool(config.get("attention_bias", False)),
            )
        if model_type == "phi3":
            settings.update(_phi3_settings(config, settings, where))
        if model_type == "smollm3":
            settings.update(_smollm3_settings(config, where), o_bias=bool(config.get("attention_bias", False)))
        if model_type in MOE_MODEL_TYPES:
            settings.update(_moe_settings(config, model_type, where))
        return TransformerConfig(**{**settings, **gemma})
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{where}: missing or invalid setting {e}") from None


def _qwen2_windows(config: dict[str, Any], window: int) -> dict[str, Any]:
    """Qwen2's windowed layers with `use_sliding_window`: those of its
    `layer_types`, else (as transformers reads it) those from
    `max_window_layers` on (28 by default); the others see every key."""
    layers = int(config["num_hidden_layers"])
    first = int(config.get("max_window_layers", 28))
    types = config.get("layer_types") or [
        "sliding_attention" if i >= first else "full_attention" for i in range(layers)
    ]
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    if len(set(windows)) == 1:
        return {"sliding_window": windows[0]}  # every layer alike
    return {"sliding_window": None, "layer_windows": windows}


def _phi3_settings(config: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Phi-3's partial rotary dimensions and its LongRoPE scaling (`rope_type`
    `longrope`, or the older `su`): the short factors (sequences within
    `original_max_position_embeddings`), the long ones (beyond it) and the
    attention factor, as transformers computes them."""
    rope = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
    factor = float(config.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0)))
    head_dim = settings["head_dim"]
    out: dict[str, Any] = {"rotary_dim": int(head_dim * factor), "rope_scaling": None}
    kind = rope.get("rope_type", rope.get("type"))
    if kind in ("longrope", "su"):
        original = int(config.get("original_max_position_embeddings") or rope["original_max_position_embeddings"])
        scale = rope.get("factor") or settings["max_position_embeddings"] / original
        attention = rope.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
        for which in ("short_factor", "long_factor"):
            if len(rope[which]) != out["rotary_dim"] // 2:
                raise CheckpointError(f"{where}: rope_scaling {which} has {len(rope[which])} entries, "
                                      f"not {out['rotary_dim'] // 2}")  # fmt: skip
        out["rope_scaling"] = {"rope_type": "longrope", "short_factor": [float(f) for f in rope["short_factor"]],
                               "long_factor": [float(f) for f in rope["long_factor"]],
                               "attention_factor": float(attention),
                               "original_max_position_embeddings": original}  # fmt: skip
    elif kind not in (None, "default"):
        raise CheckpointError(f"{where}: Phi-3 rope_scaling type {kind!r} is not supported (supported: longrope)")
    return out


def _smollm3_settings(config: dict[str, Any], where: str) -> dict[str, Any]:
    """SmolLM3's layers without RoPE (`no_rope_layers`, else one in
    `no_rope_layer_interval`, transformers' default 4)."""
    if config.get("use_sliding_window"):
        raise CheckpointError(f"{where}: SmolLM3 with use_sliding_window is not supported")
    layers = int(config["num_hidden_layers"])
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = int(config.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise CheckpointError(f"{where}: no_rope_layers has {len(flags)} entries for {layers} layers")
    return {"rope_layers": tuple(bool(f) for f in flags), "sliding_window": None}


def _moe_settings(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """The TransformerConfig fields of a mixture of experts (`moe`, and the
    attention's differences from the Llama reading), as transformers'
    modeling code of each reads its config: Mixtral's routing weights
    always renormalized, the others' by `norm_topk_prob`; Qwen-MoE's dense
    layers (`decoder_sparse_step`, `mlp_only_layers`) and expert size
    (`moe_intermediate_size`); Qwen2-MoE's shared expert and q/k/v bias
    (`qkv_bias`); OLMoE's q/k norms over the whole projections."""
    layers = int(config["num_hidden_layers"])
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    top_k = int(config["num_experts_per_tok"])
    if not 0 < top_k <= experts:
        raise CheckpointError(f"{where}: num_experts_per_tok {top_k} with {experts} experts")
    out: dict[str, Any] = {}
    sparse = [True] * layers
    if model_type in ("qwen2_moe", "qwen3_moe"):
        if config.get("use_sliding_window"):
            raise CheckpointError(f"{where}: {model_type} with use_sliding_window is not supported")
        step = int(config.get("decoder_sparse_step", 1))
        if step < 1:
            raise CheckpointError(f"{where}: decoder_sparse_step {step} is not a positive number of layers")
        dense = {int(i) for i in config.get("mlp_only_layers") or ()}
        sparse = [i not in dense and (i + 1) % step == 0 for i in range(layers)]
    if model_type == "olmoe":
        if config.get("clip_qkv") is not None:
            raise CheckpointError(f"{where}: OLMoE with clip_qkv is not supported")
        out["qk_norm_whole"] = True
    if model_type == "qwen2_moe":
        out["qkv_bias"] = bool(config.get("qkv_bias", True))
    shared = int(config.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
    out["moe"] = MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(config.get("moe_intermediate_size") or config["intermediate_size"]),
        norm_topk_prob=model_type == "mixtral" or bool(config.get("norm_topk_prob", False)),
        sparse_layers=tuple(sparse),
        shared_expert_intermediate_size=shared,
        float32_weights=model_type == "mixtral",
    )
    return out


def _gemma3_settings(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The TransformerConfig fields of a Gemma 3 text config that differ
    from the Llama reading of it, with transformers' defaults for what it
    leaves out; raises CheckpointError for what the engine does not run."""
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(
            f"{where}: Gemma 3 with hidden_activation {config['hidden_activation']!r} is not supported"
        )
    if config.get("attn_logit_softcapping") is not None or config.get("use_bidirectional_attention"):
        raise CheckpointError(
            f"{where}: Gemma 3 with attention softcapping or bidirectional attention is not supported"
        )
    layers = int(config["num_hidden_layers"])
    pattern = int(config.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN))
    types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    window = config.get("sliding_window")
    # transformers 5 nests RoPE per layer type; older configs have flat keys.
    rope = config.get("rope_parameters") or {}
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise CheckpointError(f"{where}: RoPE scaling of Gemma 3's sliding-window layers is not supported")
    scaling = config.get("rope_scaling") or (full if full.get("rope_type", "default") != "default" else None)
    heads = int(config.get("num_attention_heads", 8))
    return dict(
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim", 256)),
        rope_theta=float(full.get("rope_theta", config.get("rope_theta", 1_000_000.0))),
        rope_scaling=_check_rope_scaling(scaling, where),
        local_rope_theta=float(local.get("rope_theta", config.get("rope_local_base_freq", 10_000.0))),
        layer_windows=tuple(int(window) if window and t == "sliding_attention" else None for t in types),
        query_pre_attn_scalar=float(config.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=config.get("final_logit_softcapping"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bool(config.get("attention_bias", False)),
        o_bias=bool(config.get("attention_bias", False)),
        qk_norm=True,
        sliding_window=None,
    )


def _check_rope_scaling(scaling: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in ("llama3", "linear"):
        raise CheckpointError(f"{where}: rope_scaling type {kind!r} is not supported (supported: llama3, linear)")
    return {**scaling, "rope_type": kind}


def safetensors_files(directory: str) -> list[str]:
    """The weight files of a model directory, checked whole; raises
    CheckpointError naming the file that is missing or truncated."""
    index = os.path.join(directory, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index: {e}") from None
    else:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not names:
        raise CheckpointError(f"{directory}: no *.safetensors weight files")
    files = [os.path.join(directory, n) for n in names]
    for path in files:
        check_safetensors(path)
    return files


def check_safetensors(path: str) -> None:
    """Raises CheckpointError naming `path` unless its header parses and
    every tensor's bytes lie inside the file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if 8 + header_len > size:
                raise CheckpointError(f"{path}: truncated safetensors file (header of {header_len} bytes, file {size})")
            header = json.loads(f.read(header_len))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file (bad header: {e})") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise CheckpointError(
            f"{path}: truncated safetensors file: its tensors need {8 + header_len + end} bytes, the file has {size}"
        )


@dataclass
class GgufInfo:
    """What `read_gguf` found: the decoder config, the header, the file."""

    config: TransformerConfig
    header: GgufHeader
    path: str


def read_gguf(path: str) -> GgufInfo:
    """The config from a GGUF file's metadata, with every tensor checked
    (a supported type, inside the file); raises CheckpointError naming the
    file and what is wrong."""
    try:
        header = read_header(path)
    except GgufFormatError as e:
        raise CheckpointError(f"{path}: not a readable GGUF file: {e}") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None
    for tensor in header.tensors.values():
        if tensor.type_name not in GGUF_TYPES:
            raise CheckpointError(
                f"{path}: tensor {tensor.name} has GGUF type {tensor.type_name}, which is not supported "
                f"(supported: {', '.join(GGUF_TYPES)})"
            )
        if tensor.offset + tensor.num_bytes > header.file_size:
            raise CheckpointError(
                f"{path}: truncated GGUF file: tensor {tensor.name} ends at byte "
                f"{tensor.offset + tensor.num_bytes}, the file has {header.file_size}"
            )
    metadata, tensors = header.metadata, header.tensors
    arch = metadata.get("general.architecture")
    moe = GGUF_MOE_ARCHITECTURES.get(arch) or (GGUF_MIXTRAL if arch == "llama" and metadata.get("llama.expert_count") else None)  # fmt: skip
    if moe is None and arch not in GGUF_ARCHITECTURES:
        supported = ", ".join([*GGUF_ARCHITECTURES, *GGUF_MOE_ARCHITECTURES])
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported (supported: {supported})")

    def key(name: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata has no {arch}.{name}")
        return value

    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise CheckpointError(f"{path}: GGUF file has no token_embd.weight tensor")
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    tokens = metadata.get("tokenizer.ggml.tokens")
    scaling = None
    if metadata.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    config = TransformerConfig(
        architecture=moe or GGUF_ARCHITECTURES[arch],
        vocab_size=tokens.count if isinstance(tokens, GgufArray) else int(embed.shape[0]),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        o_bias="blk.0.attn_output.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        rope_scaling=scaling,
        checkpoint_dtype=None,
    )
    if moe is not None:
        config = replace(config, **_gguf_moe_settings(path, metadata, tensors, arch, config))
    elif arch == "gemma3":
        config = replace(config, **_gguf_gemma3_settings(metadata, config))
    elif arch == "granite":
        scale = metadata.get("granite.attention.scale")
        config = replace(
            config,
            embedding_multiplier=float(metadata.get("granite.embedding_scale", 1.0)),
            residual_multiplier=float(metadata.get("granite.residual_scale", 1.0)),
            attention_multiplier=None if scale is None else float(scale),
            logits_scaling=float(metadata.get("granite.logit_scale", 1.0)),
        )
    elif arch == "phi3":
        rotary = int(key("rope.dimension_count", config.head_dim))
        scaling = None
        if "rope_factors_short.weight" in tensors:
            # The short factors are read with the weights (GGUF_ROPE_FACTORS_RUN).
            scaling = {"rope_type": "longrope", "attention_factor": float(key("rope.scaling.attn_factor", 1.0)),
                       "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
                       "long_factor": _gguf_floats(path, tensors.get("rope_factors_long.weight"))}  # fmt: skip
        window = int(metadata.get("phi3.attention.sliding_window") or 0)
        config = replace(config, rotary_dim=rotary, rope_scaling=scaling, sliding_window=window or None)
    elif arch == "smollm3":
        interval = GGUF_SMOLLM3_NO_ROPE_INTERVAL
        config = replace(config, rope_layers=tuple((i + 1) % interval != 0 for i in range(config.num_layers)))
    return GgufInfo(config, header, path)


def _gguf_moe_settings(
    path: str, metadata: dict[str, Any], tensors: dict[str, Any], arch: str, config: TransformerConfig
) -> dict[str, Any]:
    """A mixture of experts' settings as llama.cpp reads them from its GGUF:
    `{arch}.expert_count` experts, `expert_used_count` per token, each of
    `expert_feed_forward_length` (else `feed_forward_length`, Mixtral's and
    OLMoE's); the layers with a router (`ffn_gate_inp`) sparse, the others
    dense MLPs of `feed_forward_length`; Qwen2-MoE's shared expert of
    `expert_shared_feed_forward_length` where the file holds one; the
    top-k weights renormalized by `expert_weights_norm`, else by
    llama.cpp's fixed choice (GGUF_MOE_NORM_TOPK); OLMoE's q/k norms over
    the whole projections."""

    def key(name: str, default: Any = None) -> int:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata has no {arch}.{name}")
        return int(value)

    experts, top_k = key("expert_count"), key("expert_used_count")
    if not 0 < top_k <= experts:
        raise CheckpointError(f"{path}: {arch}.expert_used_count {top_k} with {experts} experts")
    gating = metadata.get(f"{arch}.expert_gating_func", GGUF_SOFTMAX_GATING)
    if gating != GGUF_SOFTMAX_GATING:
        raise CheckpointError(f"{path}: {arch}.expert_gating_func {gating} is not supported (supported: softmax)")
    sparse = tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(config.num_layers))
    has_shared = any(f"blk.{i}.ffn_up_shexp.weight" in tensors for i in range(config.num_layers))
    shared = key("expert_shared_feed_forward_length") if has_shared else 0
    norm = metadata.get(f"{arch}.expert_weights_norm", GGUF_MOE_NORM_TOPK[arch])
    moe = MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=key("expert_feed_forward_length", config.intermediate_size),
        norm_topk_prob=bool(norm),
        sparse_layers=sparse,
        shared_expert_intermediate_size=shared,
        float32_weights=arch == "llama",
    )
    return {"moe": moe, "qk_norm_whole": arch == "olmoe"}


def _gguf_floats(path: str, tensor: GgufTensor | None) -> list[float] | None:
    """A small F32 tensor's values (None when the file has no such tensor)."""
    if tensor is None:
        return None
    if tensor.type_name != "F32":
        raise CheckpointError(f"{path}: tensor {tensor.name} is {tensor.type_name}, not F32")
    with open(path, "rb") as f:
        f.seek(tensor.offset)
        return list(struct.unpack(f"<{tensor.num_elements}f", f.read(4 * tensor.num_elements)))


def _gguf_gemma3_settings(metadata: dict[str, Any], config: TransformerConfig) -> dict[str, Any]:
    """A `gemma3` GGUF's Gemma settings as llama.cpp reads them: the window
    (`gemma3.attention.sliding_window`, none when absent or 0) on every
    layer but each GEMMA3_SLIDING_PATTERN-th, their RoPE base fixed, the
    attention scale of `head_dim` (of `hidden / heads` for the 62-layer
    27B, whose `query_pre_attn_scalar` that is), the final softcapping when
    the metadata has it."""
    window = int(metadata.get("gemma3.attention.sliding_window") or 0)
    layers = range(config.num_layers)
    windows = tuple(window if (i + 1) % GEMMA3_SLIDING_PATTERN else None for i in layers) if window else ()
    scalar = config.hidden_size // config.num_heads if config.num_layers == 62 else config.head_dim
    softcap = metadata.get("gemma3.final_logit_softcapping")
    return dict(
        layer_windows=windows,
        local_rope_theta=GGUF_GEMMA3_LOCAL_ROPE_THETA,
        query_pre_attn_scalar=float(scalar),
        final_logit_softcapping=float(softcap) if softcap else None,
    )
