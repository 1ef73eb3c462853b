"""RoPE's inverse frequencies with a config's scaling (linear, llama3,
LongRoPE) and LongRoPE's attention factor, as transformers computes them, in
float32 numpy: the torch modules and the torch-free native step read the
same table."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from vllm_rs.engine.model_loader.checkpoint import TransformerConfig


def rope_inv_freq(config: TransformerConfig, factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE's inverse frequencies (float32) with the config's scaling
    (`linear`: all divided by the factor; `llama3`: low frequencies divided,
    high kept, the band between interpolated). `factors` (a GGUF's
    `rope_freqs`) divide the frequencies instead of a scaling config."""
    scaling = config.rope_scaling
    powers = _powers(config)
    one = np.float32(1.0)
    if scaling is not None and scaling["rope_type"] == "longrope":
        # transformers' LongRoPE: the factors (a GGUF's `rope_factors_short`,
        # else the config's `short_factor`) multiply the base's powers.
        short = np.asarray(factors if factors is not None else scaling["short_factor"], dtype=np.float32)
        return one / (short * powers)
    inv_freq = one / powers
    if factors is not None:
        return inv_freq / np.asarray(factors, dtype=np.float32)
    if scaling is None:
        return inv_freq
    factor = np.float32(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (np.float32(old_len) / wavelen - np.float32(low)) / np.float32(high - low)
    smoothed = (one - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def long_rope_inv_freq(config: TransformerConfig) -> np.ndarray | None:
    """LongRoPE's inverse frequencies for the tokens of a sequence past the
    original context (`long_rope_after`): the config's long factors times
    the base's powers, as transformers computes them; None for a model
    without them."""
    scaling = config.rope_scaling
    if scaling is None or scaling["rope_type"] != "longrope" or not scaling.get("long_factor"):
        return None
    return np.float32(1.0) / (np.asarray(scaling["long_factor"], dtype=np.float32) * _powers(config))


def long_rope_after(config: TransformerConfig) -> int | None:
    """The original context of a model with LongRoPE's long factors (None
    for the others): every token of a sequence longer than this rotates by
    the long factors, as transformers picks them for a forward pass whose
    longest position is past it (a sequence that grows past it is computed
    again, as transformers' Phi-3 `generate` does:
    `KVCacheManager.crossed_long_rope`)."""
    if long_rope_inv_freq(config) is None:
        return None
    return int(config.rope_scaling["original_max_position_embeddings"])


def local_rope_inv_freq(config: TransformerConfig) -> np.ndarray:
    """The inverse frequencies of Gemma 3's windowed layers: their own base
    (`local_rope_theta`), never scaled."""
    return rope_inv_freq(replace(config, rope_theta=config.local_rope_theta or config.rope_theta, rope_scaling=None))


def _powers(config: TransformerConfig) -> np.ndarray:
    """`rope_theta ** (2i / rotary_dim)` in float32, as transformers forms them."""
    dim = config.rotary_dim or config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return np.float32(config.rope_theta) ** exponents


def rope_attention_factor(config: TransformerConfig) -> float:
    """The factor of RoPE's cosines and sines (LongRoPE's attention factor; else 1)."""
    scaling = config.rope_scaling
    return scaling["attention_factor"] if scaling and scaling["rope_type"] == "longrope" else 1.0
