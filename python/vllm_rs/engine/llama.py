"""The real models: one decoder for Llama (Llama 2/3.x, SmolLM, TinyLlama),
Mistral, Qwen2, Qwen3, Granite, SmolLM3 and Phi-3, which differ only in
flags of `TransformerConfig` (q/k/v bias, q/k RMSNorm, tied embeddings, RoPE
scaling, Granite's multipliers, SmolLM3's layers without RoPE, Phi-3's
partial rotary and LongRoPE; its fused projections are split when loaded). Parameter names
are the Hugging Face checkpoints' (`model.layers.N.self_attn.q_proj.weight`,
...), so safetensors load by name; attention runs over the paged KV cache
(`attention.PagedAttention`). The arithmetic follows transformers' modeling
code step for step, so fp32 logits agree to rounding.

Inside the model, submodules are run with `module.forward(...)`, not
`module(...)`: nothing registers hooks on them, and `nn.Module.__call__`'s
hook checks cost 3-4 us on each of about 400 calls per step, 5% of a
batch-1 decode step of SmolLM2 (docs/real-model-speed.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.attention import AttentionMetadata, PagedAttention
from vllm_rs.engine.model_loader.checkpoint import TransformerConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 as transformers does."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalizes the last dimension."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One call instead of six operators, the same float32 arithmetic
            # bit for bit (61 of them in a SmolLM2 step; docs/real-model-speed.md).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config: TransformerConfig, factors: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies with the config's scaling (`linear`: all
    divided by the factor; `llama3`: low frequencies divided, high kept,
    the band between interpolated). `factors` (a GGUF's `rope_freqs`)
    divide the frequencies instead of a scaling config."""
    dim = config.rotary_dim or config.head_dim
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "longrope":
        # transformers' LongRoPE: the factors (a GGUF's `rope_factors_short`,
        # else the config's `short_factor`) multiply the base's powers.
        short = factors.float() if factors is not None else torch.tensor(scaling["short_factor"], dtype=torch.float32)
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (short * config.rope_theta**shape)
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if factors is not None:
        return inv_freq / factors.float()
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_attention_factor(config: TransformerConfig) -> float:
    """The factor of RoPE's cosines and sines (LongRoPE's attention factor; else 1)."""
    scaling = config.rope_scaling
    return scaling["attention_factor"] if scaling and scaling["rope_type"] == "longrope" else 1.0


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's `cos` and sign-folded `sin` for `positions`, `[tokens, 1,
    rotary_dim]`: the first half of `sin` negated, so that `apply_rope` needs
    no negation per layer (negating a factor is exact: the same values as
    transformers' `rotate_half`); both times `scale` (LongRoPE's attention
    factor) where it is not 1."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    sin[..., : freqs.shape[-1]].neg_()
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin` over the first `rotary_dim` (the
    tables' width) dimensions of each head, the rest passed through, with
    `signed_sin` from `rope_tables`."""
    rotary = cos.shape[-1]
    if rotary != x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotary], cos, signed_sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).add_(swapped.mul_(signed_sin))


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE over the paged KV cache."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.qk_norm = c.qk_norm
        self.rope = not c.rope_layers or c.rope_layers[index]
        self.attn = PagedAttention(
            f"model.layers.{index}.self_attn.attn", c.num_heads, c.head_dim, c.num_kv_heads, c.attention_multiplier
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """`x`: `[tokens, hidden]`; `cos`/`sin`: `[tokens, 1, head_dim]` (`rope_tables`)."""
        q = self.q_proj.forward(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj.forward(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj.forward(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj.forward(self.attn.forward(q, k, v, meta))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP of each row."""
        # In place: both products are this call's own fresh tensors.
        return self.down_proj.forward(F.silu(self.gate_proj.forward(x), inplace=True).mul_(self.up_proj.forward(x)))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals."""

    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
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

    @classmethod
    def build(cls, config: TransformerConfig) -> CausalLM:
        """The module with meta (storage-free) parameters."""
        with torch.device("meta"):
            return cls(config)

    def init_rope(self, device: torch.device, factors: torch.Tensor | None = None) -> None:
        """Computes RoPE's inverse frequencies on `device` (float32)."""
        self.inv_freq = rope_inv_freq(self.config, factors).to(device)

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
