"""Rotary position embeddings (RoPE) as transformers computes them: the
cos/sin tables of a step's positions (from `rope_frequencies.rope_inv_freq`)
and their application to queries and keys."""

from __future__ import annotations

import torch


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
