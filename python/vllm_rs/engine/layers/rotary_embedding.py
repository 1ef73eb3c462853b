"""Rotary position embeddings (RoPE) as transformers computes them: the
inverse frequencies with a config's scaling (linear, llama3, LongRoPE), the
cos/sin tables of a step's positions, and their application to queries and
keys."""

from __future__ import annotations

import math

import torch

from vllm_rs.engine.model_loader.checkpoint import TransformerConfig


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
