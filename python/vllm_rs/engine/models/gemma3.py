"""Gemma 3's text decoder (`Gemma3ForCausalLM`), following transformers'
modeling code step for step so that float32 logits agree to rounding:
embeddings scaled by `sqrt(hidden)` (in the activations' dtype), RMSNorms
that scale by `1 + weight` in float32 (also over each head of q and k),
norms before and after both the attention and the MLP, a GeGLU MLP (tanh
GELU), scores scaled by `query_pre_attn_scalar ** -0.5`, and layers that
alternate a sliding window with its own RoPE base (`local_rope_theta`,
unscaled) and global attention (`rope_theta`, with `rope_scaling`); the
output head tied to the embeddings unless the checkpoint has one, with
`final_logit_softcapping` when the config sets it.

It subclasses `llama.CausalLM` (`build`, `attention_layers`, the output
head, HF parameter names), so weights load and linear layers pack
(`packed_weights.pack_linears`) as for the other models."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.layers.attention import AttentionMetadata, PagedAttention
from vllm_rs.engine.layers.layernorm import GemmaRMSNorm
from vllm_rs.engine.layers.rope_frequencies import local_rope_inv_freq, rope_inv_freq
from vllm_rs.engine.layers.rotary_embedding import apply_rope, rope_tables
from vllm_rs.engine.model_loader.checkpoint import TransformerConfig
from vllm_rs.engine.models.llama import CausalLM


class Attention(nn.Module):
    """Grouped-query attention with q/k norms and RoPE over the paged KV
    cache, windowed when the layer is a local one."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.q_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(c.head_dim, c.rms_norm_eps)
        window = c.layer_windows[index] if c.layer_windows else None
        scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.attn = PagedAttention(
            f"model.layers.{index}.self_attn.attn", c.num_heads, c.head_dim, c.num_kv_heads, scale, window
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """`x`: `[tokens, hidden]`; `cos`/`sin`: this layer's `rope_tables`."""
        q = self.q_norm.forward(self.q_proj.forward(x).view(-1, self.num_heads, self.head_dim))
        k = self.k_norm.forward(self.k_proj.forward(x).view(-1, self.num_kv_heads, self.head_dim))
        v = self.v_proj.forward(x).view(-1, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj.forward(self.attn.forward(q, k, v, meta))


class MLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP of each row."""
        # In place: the product is this call's own fresh tensor.
        gate = F.gelu(self.gate_proj.forward(x), approximate="tanh")
        return self.down_proj.forward(gate.mul_(self.up_proj.forward(x)))


class DecoderLayer(nn.Module):
    """Attention and MLP blocks, each normed before and after, with residuals."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.is_local = self.self_attn.attn.sliding_window is not None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One layer over the flattened batch."""
        attended = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, meta)
        x = x + self.post_attention_layernorm.forward(attended)
        mlp = self.mlp.forward(self.pre_feedforward_layernorm.forward(x))
        return x + self.post_feedforward_layernorm.forward(mlp)


class Backbone(nn.Module):
    """Embeddings, layers, final norm (`model.` in checkpoints)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        # An explicit weight skips `reset_parameters` (see llama.Backbone).
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(CausalLM):
    """`llama.CausalLM` with Gemma 3's backbone: RoPE tables for both layer
    kinds (`init_rope`), scaled embeddings and the logits' softcapping."""

    backbone = Backbone

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.local_inv_freq: torch.Tensor | None = None

    def init_rope(self, device: torch.device, factors: np.ndarray | None = None) -> None:
        """Computes both layer kinds' RoPE inverse frequencies on `device`
        (float32): the global layers' with the config's scaling (or a GGUF's
        `factors`), the local layers' from `local_rope_theta`, unscaled."""
        self.inv_freq = torch.from_numpy(rope_inv_freq(self.config, factors)).to(device)
        self.local_inv_freq = torch.from_numpy(local_rope_inv_freq(self.config)).to(device)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_indices: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[len(logits_indices), vocab]` (float32) for the given rows of the batch."""
        x = self.model.embed_tokens(input_ids)
        x = x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)
        global_rope = rope_tables(positions, self.inv_freq, x.dtype)
        local_rope = rope_tables(positions, self.local_inv_freq, x.dtype)
        for layer in self.model.layers:
            x = layer.forward(x, *(local_rope if layer.is_local else global_rope), meta)
        logits = self.logits(x.index_select(0, logits_indices))
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
