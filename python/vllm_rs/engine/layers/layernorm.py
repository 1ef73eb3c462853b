"""The decoders' root-mean-square norms: Llama's (`weight * x`) and Gemma's
(`(1 + weight) * x`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


class GemmaRMSNorm(nn.Module):
    """`x / rms(x) * (1 + weight)`, in float32 and then cast back, as
    transformers' Gemma3RMSNorm computes it (the weight is stored as the
    offset from 1)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalizes the last dimension."""
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).to(x.dtype)
