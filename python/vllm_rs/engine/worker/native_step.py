"""The native step: a Llama-family model (`llama.CausalLM`: Llama, Mistral,
Qwen2, Qwen3, Granite, SmolLM3, Phi-3 and their kin) whose every linear
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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.layers.rope_frequencies import rope_attention_factor
from vllm_rs.engine.model_loader.checkpoint import TransformerConfig

#: A layer's linear projections, in the order `DecoderStack` takes them.
LAYER_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)  # fmt: skip


def decoder_weight_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a `llama.CausalLM` of `config` holds, by Hugging Face
    name, with its shape (`lm_head.weight` only when not tied)."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        layer = f"model.layers.{i}"
        projections = {
            "self_attn.q_proj": (q, c.hidden_size), "self_attn.k_proj": (kv, c.hidden_size),
            "self_attn.v_proj": (kv, c.hidden_size), "self_attn.o_proj": (c.hidden_size, q),
            "mlp.gate_proj": (c.intermediate_size, c.hidden_size), "mlp.up_proj": (c.intermediate_size, c.hidden_size),
            "mlp.down_proj": (c.hidden_size, c.intermediate_size),
        }  # fmt: skip
        for name, shape in projections.items():
            shapes[f"{layer}.{name}.weight"] = shape
        if c.qkv_bias:
            for p in "qkv":
                shapes[f"{layer}.self_attn.{p}_proj.bias"] = (projections[f"self_attn.{p}_proj"][0],)
        if c.o_bias:
            shapes[f"{layer}.self_attn.o_proj.bias"] = (c.hidden_size,)
        if c.qk_norm:
            shapes[f"{layer}.self_attn.q_norm.weight"] = shapes[f"{layer}.self_attn.k_norm.weight"] = (c.head_dim,)
        shapes[f"{layer}.input_layernorm.weight"] = (c.hidden_size,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (c.hidden_size,)
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
    run: every layer's projections and the output head."""
    names = [f"model.layers.{i}.{p}.weight" for i in range(config.num_layers) for p in LAYER_LINEARS]
    return [*names, head_name(config)]


def _floats(array: Any) -> np.ndarray | None:
    return None if array is None else np.ascontiguousarray(array, dtype=np.float32)


def _linear(weights: Mapping[str, Any], prefix: str, weight: str | None = None) -> tuple[Any, ...]:
    blocks: GgufBlocks = weights[weight or f"{prefix}.weight"]
    out_features, in_features = blocks.shape
    return (blocks.type, blocks.rows, out_features, in_features, _floats(weights.get(f"{prefix}.bias")))


class NativeStep:
    """A `llama.CausalLM`'s decoder layers, final norm and output head over
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
        scale = c.attention_multiplier if c.attention_multiplier is not None else 1.0 / math.sqrt(c.head_dim)
        layers = []
        for i in range(c.num_layers):
            layer = f"model.layers.{i}"
            norms = (None, None)
            if c.qk_norm:
                norms = (weights[f"{layer}.self_attn.q_norm.weight"], weights[f"{layer}.self_attn.k_norm.weight"])
            layers.append((
                _floats(weights[f"{layer}.input_layernorm.weight"]),
                _floats(weights[f"{layer}.post_attention_layernorm.weight"]),
                _floats(norms[0]), _floats(norms[1]),
                [_linear(weights, f"{layer}.{p}") for p in LAYER_LINEARS],
                c.layer_window(i), not c.rope_layers or c.rope_layers[i],
            ))  # fmt: skip
        shape = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size,
                 c.rms_norm_eps, scale, c.residual_multiplier, c.rotary_dim or c.head_dim,
                 rope_attention_factor(c))  # fmt: skip
        self.embedding_multiplier, self.logits_scaling = c.embedding_multiplier, c.logits_scaling
        self.vocab = c.vocab_size
        self._embed = embed
        self._stack = _core.DecoderStack(
            shape, _floats(inv_freq), layers, _floats(weights["model.norm.weight"]),
            _linear(weights, "lm_head", head_name(c)), caches, cache_dtype, precision,
        )  # fmt: skip

    def forward(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        key_starts: np.ndarray,
        key_slots: np.ndarray,
        logits_rows: np.ndarray,
    ) -> np.ndarray:
        """The logits (float32 `[len(logits_rows), vocab]`) of the step whose
        tokens are `input_ids` at `positions`, writing their keys and values
        to `slot_mapping`; token t's key at position p is in slot
        `key_slots[key_starts[t] + p]` (every array int64)."""
        x = self._embed(input_ids)
        if not x.flags.writeable or not x.flags.c_contiguous:
            x = np.array(x, dtype=np.float32, order="C")
        if self.embedding_multiplier != 1.0:
            x *= np.float32(self.embedding_multiplier)
        logits = np.empty((len(logits_rows), self.vocab), np.float32)
        self._stack.forward(x, positions, slot_mapping, key_starts, key_slots, logits_rows, logits, kernel_threads())
        if self.logits_scaling != 1.0:
            logits /= np.float32(self.logits_scaling)
        return logits
