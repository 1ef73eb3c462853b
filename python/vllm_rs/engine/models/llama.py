"""The real models: one decoder for Llama (Llama 2/3.x, SmolLM, TinyLlama),
Mistral, Qwen2, Qwen3, Granite, SmolLM3 and Phi-3, and the mixtures of
experts Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE, which differ only in
flags of `TransformerConfig` (q/k/v bias, q/k RMSNorm, tied embeddings, RoPE
scaling, Granite's multipliers, SmolLM3's layers without RoPE, Phi-3's
partial rotary and LongRoPE, its fused projections split when loaded; the
routed experts of `moe` in place of the MLP, `layers/moe.py`). Parameter names
are the Hugging Face checkpoints' (`model.layers.N.self_attn.q_proj.weight`,
...), so safetensors load by name; attention runs over the paged KV cache
(`attention.PagedAttention`). The arithmetic follows transformers' modeling
code step for step, so fp32 logits agree to rounding.

Inside the model, submodules are run with `module.forward(...)`, not
`module(...)`: nothing registers hooks on them, and `nn.Module.__call__`'s
hook checks cost 3-4 us on each of about 400 calls per step, 5% of a
batch-1 decode step of SmolLM2 (docs/real-model-speed.md)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.layers.attention import AttentionMetadata, PagedAttention
from vllm_rs.engine.layers.layernorm import RMSNorm
from vllm_rs.engine.layers.moe import SparseMoeBlock
from vllm_rs.engine.layers.rope_frequencies import long_rope_inv_freq, rope_attention_factor, rope_inv_freq
from vllm_rs.engine.layers.rotary_embedding import apply_rope, rope_tables
from vllm_rs.engine.model_loader.checkpoint import TransformerConfig


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE over the paged KV cache,
    windowed when the layer has a sliding window (Mistral's `sliding_window`)."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            # OLMoE's norms span the whole projections, the others' each head.
            whole = c.qk_norm_whole
            self.q_norm = RMSNorm(c.num_heads * c.head_dim if whole else c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.num_kv_heads * c.head_dim if whole else c.head_dim, c.rms_norm_eps)
        self.qk_norm = c.qk_norm and not c.qk_norm_whole
        self.qk_norm_whole = c.qk_norm and c.qk_norm_whole
        self.rope = not c.rope_layers or c.rope_layers[index]
        self.attn = PagedAttention(
            f"model.layers.{index}.self_attn.attn", c.num_heads, c.head_dim, c.num_kv_heads, c.attention_multiplier,
            c.layer_window(index),
        )  # fmt: skip

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """`x`: `[tokens, hidden]`; `cos`/`sin`: `[tokens, 1, head_dim]` (`rope_tables`)."""
        q, k = self.q_proj.forward(x), self.k_proj.forward(x)
        if self.qk_norm_whole:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        q, k = q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj.forward(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj.forward(self.attn.forward(q, k, v, meta))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), of the config's
    `intermediate_size` unless given another (an expert's)."""

    def __init__(self, config: TransformerConfig, intermediate_size: int | None = None):
        super().__init__()
        inter = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP of each row."""
        # In place: both products are this call's own fresh tensors.
        return self.down_proj.forward(F.silu(self.gate_proj.forward(x), inplace=True).mul_(self.up_proj.forward(x)))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals; the MLP is the
    routed experts (`SparseMoeBlock`) in a mixture of experts' sparse layers."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.moe is not None and config.moe.sparse_layers[index]:
            self.mlp = SparseMoeBlock(config.hidden_size, config.moe, lambda size: MLP(config, size))
        else:
            self.mlp = MLP(config)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One layer over the flattened batch."""
        r = self.residual_multiplier
        attended = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, meta)
        x = x + (attended if r == 1.0 else attended * r)
        out = self.mlp.forward(self.post_attention_layernorm.forward(x))
        return x + (out if r == 1.0 else out * r)


class Backbone(nn.Module):
    """Embeddings, layers, final norm (`model.` in checkpoints)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        # An explicit weight skips `reset_parameters`: its `normal_` on the
        # meta device goes through torch's decompositions, which import
        # `torch._dynamo` and with it `triton` (66 MiB resident, ~1 s).
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """The decoder and its output head (the embeddings when tied). Built on
    the `meta` device by `build`; weights arrive with `load_state_dict(...,
    assign=True)` and RoPE's table with `init_rope`. Other families
    (`gemma3.Gemma3ForCausalLM`) subclass it with their own `Backbone`."""

    #: The embeddings, layers and final norm (`model.` in the checkpoint).
    backbone = Backbone

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.model = self.backbone(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.inv_freq: torch.Tensor | None = None
        #: LongRoPE's long factors' table (Phi-3), for `AttentionMetadata.long_rope`'s tokens.
        self.long_inv_freq: torch.Tensor | None = None

    @classmethod
    def build(cls, config: TransformerConfig) -> CausalLM:
        """The module with meta (storage-free) parameters."""
        with torch.device("meta"):
            return cls(config)

    def init_rope(self, device: torch.device, factors: np.ndarray | None = None) -> None:
        """Computes RoPE's inverse frequencies on `device` (float32), and
        LongRoPE's long ones where the config has them."""
        self.inv_freq = torch.from_numpy(rope_inv_freq(self.config, factors)).to(device)
        long = long_rope_inv_freq(self.config)
        self.long_inv_freq = None if long is None else torch.from_numpy(long).to(device)

    def attention_layers(self) -> dict[str, PagedAttention]:
        """Layer name -> attention module (the forward context)."""
        return {layer.self_attn.attn.layer_name: layer.self_attn.attn for layer in self.model.layers}

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_indices: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[len(logits_indices), vocab]` (float32) for the given rows of the batch."""
        x = self.model.embed_tokens(input_ids)
        if self.config.embedding_multiplier != 1.0:
            x = x * self.config.embedding_multiplier
        cos, sin = rope_tables(positions, self.inv_freq, x.dtype, rope_attention_factor(self.config))
        if meta.long_rope is not None:
            long_cos, long_sin = rope_tables(positions, self.long_inv_freq, x.dtype, rope_attention_factor(self.config))
            rows = meta.long_rope[:, None, None]
            cos, sin = torch.where(rows, long_cos, cos), torch.where(rows, long_sin, sin)
        for layer in self.model.layers:
            x = layer.forward(x, cos, sin, meta)
        return self.logits(x.index_select(0, logits_indices))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm and the output head of `hidden` rows, in float32."""
        hidden = self.model.norm.forward(hidden)
        # A packed model has its own lm_head even when the embeddings are tied.
        head = getattr(self, "lm_head", None)
        logits = hidden @ self.model.embed_tokens.weight.t() if head is None else head(hidden)
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        return logits.float()
