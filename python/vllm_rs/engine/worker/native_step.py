"""The native step: a Llama-family model (`llama.CausalLM`: Llama, Mistral,
Qwen2, Qwen3, Granite, SmolLM3, Phi-3, the mixtures of experts and their
kin) or a Gemma 3 text model (`gemma3.Gemma3ForCausalLM`) whose every linear
layer the Rust kernel reads in place runs a whole forward pass in one call
of `vllm_rs._core.DecoderStack` (rust/kernels/src/decoder.rs): the same
weights (a GGUF file's blocks, or a half-precision checkpoint's rows), the
same paged KV cache, the same arithmetic as the torch modules, but no
Python between its ~400 operations. No torch here: the weights come by
their Hugging Face names (`decoder_weight_shapes` lists them, and a test
holds it equal to `llama.CausalLM`'s), from the torch modules
(`torch_executor`) or straight from a GGUF file (`native_executor`).
docs/real-model-speed.md, "The native step", has the measurements."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.layers.rope_frequencies import local_rope_inv_freq, long_rope_inv_freq, rope_attention_factor
from vllm_rs.engine.model_loader.checkpoint import TransformerConfig

#: A layer's attention projections, in the order `DecoderStack` takes them.
ATTENTION_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
#: A gated MLP's projections (a dense layer's `mlp.`, each expert's), in that order.
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


#: A Gemma 3 layer's norms beyond Llama's two, each `hidden` wide.
GEMMA3_LAYER_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def is_gemma3(config: TransformerConfig) -> bool:
    """Whether `config` is a Gemma 3 text model (`gemma3.Gemma3ForCausalLM`)."""
    return config.model_type == "gemma3_text"


def is_sparse(config: TransformerConfig, index: int) -> bool:
    """Whether layer `index`'s MLP is routed experts (`MoeConfig.sparse_layers`)."""
    return config.moe is not None and config.moe.sparse_layers[index]


def _mlp_shapes(prefix: str, intermediate: int, hidden: int) -> dict[str, tuple[int, int]]:
    """A gated MLP's weights under `prefix`, with their shapes."""
    return {f"{prefix}.gate_proj.weight": (intermediate, hidden), f"{prefix}.up_proj.weight": (intermediate, hidden),
            f"{prefix}.down_proj.weight": (hidden, intermediate)}  # fmt: skip


def _mlp_prefixes(config: TransformerConfig, index: int) -> list[str]:
    """Layer `index`'s gated MLPs: its dense one, or each expert and the shared one."""
    layer = f"model.layers.{index}.mlp"
    if not is_sparse(config, index):
        return [layer]
    moe = config.moe
    shared = [f"{layer}.shared_expert"] if moe.shared_expert_intermediate_size else []
    return [*(f"{layer}.experts.{e}" for e in range(moe.num_experts)), *shared]


def decoder_weight_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a `llama.CausalLM` (or a `gemma3.Gemma3ForCausalLM`) of
    `config` holds, by Hugging Face name, with its shape (`lm_head.weight`
    only when not tied)."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        layer = f"model.layers.{i}"
        projections = {
            "self_attn.q_proj": (q, c.hidden_size), "self_attn.k_proj": (kv, c.hidden_size),
            "self_attn.v_proj": (kv, c.hidden_size), "self_attn.o_proj": (c.hidden_size, q),
        }  # fmt: skip
        for name, shape in projections.items():
            shapes[f"{layer}.{name}.weight"] = shape
        if is_sparse(c, i):
            moe, h = c.moe, c.hidden_size
            shapes[f"{layer}.mlp.gate.weight"] = (moe.num_experts, h)
            for e in range(moe.num_experts):
                shapes.update(_mlp_shapes(f"{layer}.mlp.experts.{e}", moe.intermediate_size, h))
            if moe.shared_expert_intermediate_size:
                shapes.update(_mlp_shapes(f"{layer}.mlp.shared_expert", moe.shared_expert_intermediate_size, h))
                shapes[f"{layer}.mlp.shared_expert_gate.weight"] = (1, h)
        else:
            shapes.update(_mlp_shapes(f"{layer}.mlp", c.intermediate_size, c.hidden_size))
        if c.qkv_bias:
            for p in "qkv":
                shapes[f"{layer}.self_attn.{p}_proj.bias"] = (projections[f"self_attn.{p}_proj"][0],)
        if c.o_bias:
            shapes[f"{layer}.self_attn.o_proj.bias"] = (c.hidden_size,)
        if c.qk_norm and c.qk_norm_whole:
            # OLMoE norms all heads at once.
            shapes[f"{layer}.self_attn.q_norm.weight"], shapes[f"{layer}.self_attn.k_norm.weight"] = (q,), (kv,)
        elif c.qk_norm:
            shapes[f"{layer}.self_attn.q_norm.weight"] = shapes[f"{layer}.self_attn.k_norm.weight"] = (c.head_dim,)
        norms = ("input_layernorm", "post_attention_layernorm", *(GEMMA3_LAYER_NORMS if is_gemma3(c) else ()))
        for norm in norms:
            shapes[f"{layer}.{norm}.weight"] = (c.hidden_size,)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def head_name(config: TransformerConfig) -> str:
    """The weight the output head multiplies by: `lm_head.weight`, or the
    embeddings when they are tied."""
    return "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"


def linear_names(config: TransformerConfig) -> list[str]:
    """The weights the kernel must read in place for the native step to
    run: every layer's projections (each expert's) and the output head (a
    router and a shared expert's gate may be float32)."""
    names = []
    for i in range(config.num_layers):
        names += [f"model.layers.{i}.{p}.weight" for p in ATTENTION_LINEARS]
        names += [f"{prefix}.{p}.weight" for prefix in _mlp_prefixes(config, i) for p in MLP_LINEARS]
    return [*names, head_name(config)]


def _floats(array: Any) -> np.ndarray | None:
    return None if array is None else np.ascontiguousarray(array, dtype=np.float32)


def _linear(weights: Mapping[str, Any], prefix: str, weight: str | None = None) -> tuple[Any, ...]:
    blocks: GgufBlocks = weights[weight or f"{prefix}.weight"]
    out_features, in_features = blocks.shape
    return (blocks.type, blocks.rows, out_features, in_features, _floats(weights.get(f"{prefix}.bias")))


def _dense(weight: Any) -> np.ndarray:
    """A small weight as float32 rows: a router or a shared expert's gate,
    float32 in a GGUF, else the blocks of a half or quantized checkpoint
    (dequantized as the kernel reads them)."""
    if not isinstance(weight, GgufBlocks):
        return np.ascontiguousarray(weight, dtype=np.float32)
    values = np.empty(weight.shape, np.float32)
    _core.gguf_dequantize(np.ascontiguousarray(weight.rows), values, weight.type)
    return values


def _experts(config: TransformerConfig, weights: Mapping[str, Any], index: int) -> tuple[Any, ...]:
    """Layer `index`'s routed experts as `DecoderStack` takes them: the
    router (float32), each expert's projections, top k, whether the top
    weights are renormalized, and the shared expert with its gate's float32
    row (or None)."""
    moe, layer = config.moe, f"model.layers.{index}.mlp"
    experts = [[_linear(weights, f"{layer}.experts.{e}.{p}") for p in MLP_LINEARS] for e in range(moe.num_experts)]
    shared = None
    if moe.shared_expert_intermediate_size:
        gate = _dense(weights[f"{layer}.shared_expert_gate.weight"]).reshape(-1)
        shared = ([_linear(weights, f"{layer}.shared_expert.{p}") for p in MLP_LINEARS], gate)
    return (_dense(weights[f"{layer}.gate.weight"]), experts, moe.top_k, moe.norm_topk_prob, shared)


def _gemma_norm(weight: Any) -> np.ndarray:
    """A Gemma norm's factors: its weight is stored as the offset from 1
    (`layernorm.GemmaRMSNorm` adds it in float32, as here)."""
    return np.float32(1.0) + np.asarray(weight, dtype=np.float32)


class NativeStep:
    """A `llama.CausalLM`'s (or Gemma 3's) decoder layers, final norm and output head over
    `weights` (Hugging Face names: the linear ones as `GgufBlocks`, the
    norms and biases as float arrays), bound to each layer's KV cache
    (`caches`: key and value arrays `[slots, kv_heads, head_dim]`, float32 or
    a 16-bit cache's bits as uint16, `cache_dtype` naming which), run one
    step at a time by `forward`, its products at `precision` ("exact" or
    "int8", `--kernel-precision`). `embed` looks token ids up."""

    def __init__(
        self,
        config: TransformerConfig,
        weights: Mapping[str, Any],
        inv_freq: np.ndarray,
        embed: Callable[[np.ndarray], np.ndarray],
        caches: list[tuple[np.ndarray, np.ndarray]],
        cache_dtype: str,
        precision: str = "exact",
    ):
        c = config
        gemma = is_gemma3(c)
        norm = _gemma_norm if gemma else _floats
        if gemma:
            scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        else:
            scale = c.attention_multiplier if c.attention_multiplier is not None else 1.0 / math.sqrt(c.head_dim)
        # Gemma 3's windowed layers rotate by a table of their own base (the second).
        inv_freqs = [_floats(inv_freq), *([local_rope_inv_freq(c)] if gemma else [])]
        layers = []
        for i in range(c.num_layers):
            layer = f"model.layers.{i}"

            def w(name: str, layer: str = layer) -> Any:
                return weights[f"{layer}.{name}.weight"]

            q_norm = k_norm = None
            if c.qk_norm:
                q_norm, k_norm = norm(w("self_attn.q_norm")), norm(w("self_attn.k_norm"))
            window = c.layer_window(i)
            if gemma:
                rope = 0 if window is None else 1
                # Gemma's post_attention_layernorm norms the attention's output;
                # its pre_feedforward_layernorm is the norm before the MLP.
                pre_mlp = w("pre_feedforward_layernorm")
                outputs = (norm(w("post_attention_layernorm")), norm(w("post_feedforward_layernorm")))
            else:
                pre_mlp, outputs = w("post_attention_layernorm"), (None, None)
                rope = 0 if not c.rope_layers or c.rope_layers[i] else None
            linears = [_linear(weights, f"{layer}.{p}") for p in ATTENTION_LINEARS]
            experts = _experts(c, weights, i) if is_sparse(c, i) else None
            if experts is None:
                linears += [_linear(weights, f"{layer}.mlp.{p}") for p in MLP_LINEARS]
            layers.append((
                norm(w("input_layernorm")), norm(pre_mlp), q_norm, k_norm, linears, window, rope, *outputs,
                c.kv_group(i), experts,
            ))  # fmt: skip
        shape = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size,
                 c.rms_norm_eps, scale, c.residual_multiplier, c.rotary_dim or c.head_dim,
                 rope_attention_factor(c))  # fmt: skip
        # Gemma scales its embeddings by sqrt(hidden) in their float32 (gemma3.py).
        self.embedding_multiplier = np.float32(c.hidden_size**0.5) if gemma else c.embedding_multiplier
        self.logits_scaling, self.logits_softcap = c.logits_scaling, c.final_logit_softcapping
        self.vocab = c.vocab_size
        self._embed = embed
        self._stack = _core.DecoderStack(
            shape, inv_freqs, layers, norm(weights["model.norm.weight"]),
            _linear(weights, "lm_head", head_name(c)), caches, cache_dtype, precision,
            "gelu_tanh" if gemma else "silu", _floats(long_rope_inv_freq(c)),
        )  # fmt: skip

    def forward(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        key_starts: np.ndarray,
        key_slots: np.ndarray,
        logits_rows: np.ndarray,
        long_rope: np.ndarray | None = None,
        group_slots: Sequence[tuple[np.ndarray, np.ndarray]] = (),
    ) -> np.ndarray:
        """The logits (float32 `[len(logits_rows), vocab]`) of the step whose
        tokens are `input_ids` at `positions`, writing their keys and values
        to `slot_mapping`; token t's key at position p is in slot
        `key_slots[key_starts[t] + p]` (every array int64); `long_rope`
        (uint8) marks the tokens rotated by LongRoPE's long factors;
        `group_slots` are the further KV-cache groups' `(slot_mapping,
        key_slots)`, laid out as the first group's."""
        x = self._embed(input_ids)
        if not x.flags.writeable or not x.flags.c_contiguous:
            x = np.array(x, dtype=np.float32, order="C")
        if self.embedding_multiplier != 1.0:
            x *= np.float32(self.embedding_multiplier)
        logits = np.empty((len(logits_rows), self.vocab), np.float32)
        self._stack.forward(
            x, positions, slot_mapping, key_starts, key_slots, logits_rows, logits, kernel_threads(), long_rope,
            list(group_slots),
        )  # fmt: skip
        if self.logits_scaling != 1.0:
            logits /= np.float32(self.logits_scaling)
        if self.logits_softcap is not None:
            cap = np.float32(self.logits_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits
