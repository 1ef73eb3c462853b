"""The `toy` model: a tiny decoder-only transformer over the byte vocabulary
(257 ids: 256 bytes and end-of-sequence) with seeded random weights, and
attention over a paged KV cache. Small enough for a CPU; runs on CUDA too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.layers.attention import AttentionMetadata, PagedAttention
from vllm_rs.engine.model_loader.registry import BYTE_VOCAB_SIZE

#: Byte ids of printable ASCII, and the logit bias they get at initialization.
PRINTABLE_ASCII = slice(0x20, 0x7F)
PRINTABLE_BIAS = 4.0


@dataclass(frozen=True)
class ToyConfig:
    """Hyperparameters of the toy model."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    seed: int = 0
    vocab_size: int = BYTE_VOCAB_SIZE

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hparams(cls, hparams: dict[str, Any]) -> ToyConfig:
        """From a model spec's hyperparameters; raises ValueError when the
        hidden size does not split into the heads."""
        config = cls(**{k: int(v) for k, v in hparams.items() if k in cls.__dataclass_fields__})
        if config.hidden_size % config.num_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not a multiple of num_heads {config.num_heads}")
        return config


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks."""

    def __init__(self, config: ToyConfig, index: int):
        super().__init__()
        self.config = config
        self.input_norm = nn.LayerNorm(config.hidden_size)
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attn = PagedAttention(f"model.layers.{index}.self_attn.attn", config.num_heads, config.head_dim)
        self.post_attention_norm = nn.LayerNorm(config.hidden_size)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One layer over the flattened batch `[tokens, hidden]`."""
        heads, dim = self.config.num_heads, self.config.head_dim
        q, k, v = self.qkv_proj(self.input_norm(x)).view(-1, 3, heads, dim).unbind(1)
        x = x + self.o_proj(self.attn(q, k, v, meta))
        return x + self.down_proj(F.gelu(self.up_proj(self.post_attention_norm(x))))


class ToyDecoder(nn.Module):
    """Embeddings (tied with the output head), learned positions, layers."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size)
        # Added to the logits: random weights then favour printable text.
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def attention_layers(self) -> dict[str, PagedAttention]:
        """Layer name -> attention module (the forward context)."""
        return {layer.attn.layer_name: layer.attn for layer in self.layers}

    @torch.no_grad()
    def init_seeded(self) -> None:
        """Random weights from `config.seed`: the same seed gives the same model."""
        generator = torch.Generator().manual_seed(self.config.seed)
        for name, param in self.named_parameters():
            if name == "output_bias":
                param.zero_()
                param[PRINTABLE_ASCII] = PRINTABLE_BIAS
                continue
            if "norm" in name:
                param.copy_(torch.ones_like(param) if name.endswith("weight") else torch.zeros_like(param))
                continue
            std = 0.15 if name.startswith("embed") else 0.1
            param.copy_(torch.randn(param.shape, generator=generator) * std)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_indices: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[len(logits_indices), vocab]` for the given rows of the batch."""
        x = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer in self.layers:
            x = layer(x, meta)
        hidden = self.final_norm(x.index_select(0, logits_indices))
        return hidden @ self.embed_tokens.weight.t() + self.output_bias
