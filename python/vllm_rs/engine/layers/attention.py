"""Attention over a paged KV cache, shared by the toy model and the real
(Llama-shaped) models: each step's new keys and values are written to their
cache slots (`slot_mapping`), then each request's queries attend over its
keys gathered from the cache by slot (`key_slots`), causally within a
prefill chunk; a layer with a sliding window (Gemma 3's local layers) reads
the step's windowed view instead, whose sequences hold only the keys some
query of theirs sees and mask the older ones. The one-query sequences (decodes) of a float32 cache on the
CPU attend without a gather: the Rust kernel
`vllm_rs._core.paged_decode_attention` reads each key and value where it
lies in the cache (docs/real-model-speed.md, "Attention over the paged cache")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads


@dataclass
class SequenceSlice:
    """One request's part of a step: its rows in the flattened batch, where
    its keys live in the cache, and its causal mask (None for one query)."""

    start: int
    end: int
    key_slots: torch.Tensor
    mask: torch.Tensor | None


def attends_in_place(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a cache of `dtype` on `device` has its decodes attended by the
    Rust kernel (a float32 cache on the CPU) rather than gathered for torch's
    `scaled_dot_product_attention`."""
    return device.type == "cpu" and dtype == torch.float32


@dataclass
class DecodeBatch:
    """The step's one-query sequences attended together: their rows in the
    batch `[n]` (increasing), their key slots padded to the longest `[n,
    keys]`, their key counts `[n]`, and, for torch's attention (a cache that
    `attends_in_place` refuses), the mask of real keys `[n, 1, 1, keys]`;
    None for the kernel, which reads only each sequence's own keys."""

    rows: torch.Tensor
    key_slots: torch.Tensor
    lens: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """Where this step's new keys go (`slot_mapping`), each request's slice,
    the one-query sequences batched together (when there are several, or
    one whose cache is attended in place), for each sliding window of
    the model's layers the same step seen through it (`windows`, in the
    slots of the KV-cache group of that window's layers), and the tokens
    whose keys and queries rotate by LongRoPE's long factors."""

    slot_mapping: torch.Tensor
    sequences: list[SequenceSlice]
    decodes: DecodeBatch | None = None
    windows: dict[int, AttentionMetadata] = field(default_factory=dict)
    #: Per token (bool), True where LongRoPE's long factors apply; None: nowhere.
    long_rope: torch.Tensor | None = None


class PagedAttention(nn.Module):
    """Scaled dot-product attention over a paged KV cache, with grouped
    queries when `num_kv_heads < num_heads`. The cache, shaped
    `[2, num_blocks, block_size, num_kv_heads, head_dim]`, is bound by
    `vllm_rs.tensor_utils.bind_kv_cache` through this layer's own
    `bind_kv_cache` method, as vLLM binds its attention layers. Scores are
    scaled by `scale` (default `1 / sqrt(head_dim)`); with `sliding_window`
    a query sees only the keys less than that many positions before it."""

    def __init__(
        self,
        layer_name: str,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        scale: float | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = head_dim
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.sliding_window = sliding_window
        self.kv_cache = torch.empty(0)
        self._key_cache = self._value_cache = torch.empty(0)
        self._key_array = self._value_array = None

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Makes `kv_cache` this layer's cache (the tensor itself, not a copy),
        with its key and value halves viewed as `[slots, kv_heads, head_dim]`
        once here rather than in every step (four operators fewer per layer
        and step), and as numpy arrays for the decode kernel when it applies
        (`attends_in_place`)."""
        self.kv_cache = kv_cache
        shape = (-1, self.num_kv_heads, self.head_dim)
        self._key_cache, self._value_cache = kv_cache[0].view(shape), kv_cache[1].view(shape)
        if attends_in_place(kv_cache.device, kv_cache.dtype):
            self._key_array, self._value_array = self._key_cache.numpy(), self._value_cache.numpy()
        else:
            self._key_array = self._value_array = None

    def cache_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The bound (CPU) cache's key and value halves as numpy arrays
        `[slots, kv_heads, head_dim]` sharing its memory: float32, or the
        bits of a 16-bit cache as uint16."""
        keys, values = self._key_cache, self._value_cache
        if keys.dtype in (torch.float16, torch.bfloat16):
            keys, values = keys.view(torch.uint16), values.view(torch.uint16)
        return keys.numpy(), values.numpy()

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """The shape of this layer's KV cache."""
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: `[tokens, heads, head_dim]`, k and v: `[tokens, kv_heads,
        head_dim]`; returns `[tokens, heads * head_dim]`."""
        key_cache, value_cache = self._key_cache, self._value_cache
        gqa = self.num_kv_heads != self.num_heads
        if self.sliding_window is not None:
            # Its slots too: a windowed layer's blocks may be its KV-cache group's own.
            meta = meta.windows[self.sliding_window]
        # A 16-bit cache (`--kv-cache-dtype`) holds the values rounded; they
        # are read back as the queries' dtype.
        key_cache.index_copy_(0, meta.slot_mapping, k.to(key_cache.dtype))
        value_cache.index_copy_(0, meta.slot_mapping, v.to(value_cache.dtype))
        if meta.decodes is None and len(meta.sequences) == 1:
            seq = meta.sequences[0]
            if seq.start == 0 and seq.end == q.shape[0]:
                # One request (a batch-1 decode, a lone prefill) is the whole batch: no scatter.
                return self._attend(q, seq, gqa).transpose(0, 1).reshape(q.shape[0], -1)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        for seq in meta.sequences:
            out[seq.start : seq.end] = self._attend(q, seq, gqa).transpose(0, 1)
        batch = meta.decodes
        if batch is not None and batch.mask is None:
            _core.paged_decode_attention(
                q.contiguous().numpy(), self._key_array, self._value_array, batch.rows.numpy(),
                batch.key_slots.numpy(), batch.lens.numpy(), out.numpy(), self.num_heads, self.num_kv_heads,
                self.head_dim, self.scale, kernel_threads(),
            )  # fmt: skip
        elif batch is not None:
            # index_select on the flat slots: twice as fast as indexing with
            # the 2-D slot tensor (docs/real-model-speed.md), same values.
            slots, shape = batch.key_slots.reshape(-1), (*batch.key_slots.shape, self.num_kv_heads, self.head_dim)
            keys = key_cache.index_select(0, slots).view(shape).transpose(1, 2).to(q.dtype)
            values = value_cache.index_select(0, slots).view(shape).transpose(1, 2).to(q.dtype)
            queries = q.index_select(0, batch.rows)[:, :, None, :]
            attended = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=batch.mask, enable_gqa=gqa, scale=self.scale
            )
            out.index_copy_(0, batch.rows, attended[:, :, 0, :])
        return out.reshape(q.shape[0], -1)

    def _attend(self, q: torch.Tensor, seq: SequenceSlice, gqa: bool) -> torch.Tensor:
        """One request's queries over its keys: `[heads, queries, head_dim]`."""
        queries = q[seq.start : seq.end].transpose(0, 1)
        keys = self._key_cache.index_select(0, seq.key_slots).transpose(0, 1).to(q.dtype)
        values = self._value_cache.index_select(0, seq.key_slots).transpose(0, 1).to(q.dtype)
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=seq.mask, enable_gqa=gqa, scale=self.scale
        )
