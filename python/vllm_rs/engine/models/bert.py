"""BERT encoders: `BertModel` (sentence embeddings) and
`BertForSequenceClassification` (cross-encoder rerankers). Parameter names
are the Hugging Face checkpoints' (`encoder.layer.N.attention.self.query.weight`,
with or without the `bert.` prefix), so safetensors load by name. A batch is the inputs' tokens
one after another, unpadded: the linear layers (most of the work) see no
padding, and each input's tokens attend to every token of that input alone
(bidirectional, no KV cache), the inputs of similar length padded together
for one attention call (a call per input cost more in overhead than the
attention itself: a fifth of a MiniLM step). The arithmetic follows transformers' modeling
code, so fp32 outputs agree to rounding."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.layers.linear import Linear
from vllm_rs.engine.model_loader.bert_config import BertConfig
from vllm_rs.engine.model_loader.checkpoint import CheckpointError

#: transformers' name of each activation -> the function.
_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class BertEmbeddings(nn.Module):
    """Word, position and token-type embeddings, summed and normed."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`[tokens, hidden]` for `[tokens]` ids, token types and positions."""
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(positions))


class AttentionGroup(NamedTuple):
    """Inputs of similar length, padded to the longest for one attention call."""

    #: `[inputs, longest]`: the row of each input's position; past its end, its first row.
    gather: torch.Tensor
    #: `[inputs, longest]`: True where the position is one of the input's tokens.
    valid: torch.Tensor
    #: `[inputs, 1, 1, longest]`: `valid` as SDPA's key mask.
    key_mask: torch.Tensor
    #: `[tokens]`: the rows of the valid positions, in their order in `valid`.
    rows: torch.Tensor


def attention_groups(bounds: list[tuple[int, int]], device: torch.device) -> list[AttentionGroup]:
    """The inputs (`bounds`: each one's rows) grouped longest first, a new
    group where an input is under half the group's longest, so padding at
    most doubles a group's attention."""
    spans = sorted(bounds, key=lambda span: span[1] - span[0], reverse=True)
    groups: list[list[tuple[int, int]]] = []
    for start, end in spans:
        if not groups or 2 * (end - start) < groups[-1][0][1] - groups[-1][0][0]:
            groups.append([])
        groups[-1].append((start, end))
    return [_padded(group, device) for group in groups]


def _padded(spans: list[tuple[int, int]], device: torch.device) -> AttentionGroup:
    """One group's gather indices and masks (`spans` longest first)."""
    starts = torch.tensor([start for start, _ in spans])
    lengths = torch.tensor([end - start for start, end in spans])
    offsets = torch.arange(spans[0][1] - spans[0][0])
    valid = offsets[None, :] < lengths[:, None]
    gather = torch.where(valid, starts[:, None] + offsets[None, :], starts[:, None])
    return AttentionGroup(
        gather.to(device), valid.to(device), valid[:, None, None, :].to(device), gather[valid].to(device)
    )


class BertLayer(nn.Module):
    """Post-norm self-attention and feed-forward blocks (transformers'
    module names flattened into this one class)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        h = c.hidden_size
        self.num_heads, self.head_dim = c.num_heads, h // c.num_heads
        self.query, self.key, self.value = Linear(h, h), Linear(h, h), Linear(h, h)
        self.attention_dense = Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = Linear(h, c.intermediate_size)
        self.output_dense = Linear(c.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.act = _ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor, groups: list[AttentionGroup]) -> torch.Tensor:
        """`x`: `[tokens, hidden]`, the inputs one after another; `groups`: them for attention."""
        n, h = x.shape
        q, k, v = (t.view(n, self.num_heads, self.head_dim) for t in (self.query(x), self.key(x), self.value(x)))
        attended = torch.empty(n, self.num_heads, self.head_dim, dtype=x.dtype, device=x.device)
        for group in groups:
            # [inputs, longest, heads, dim] -> [inputs, heads, longest, dim]
            padded = (t[group.gather].transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(*padded, attn_mask=group.key_mask)
            attended[group.rows] = out.transpose(1, 2)[group.valid]
        x = self.attention_norm(self.attention_dense(attended.reshape(n, h)) + x)
        return self.output_norm(self.output_dense(self.act(self.intermediate(x))) + x)


#: Checkpoint names of a layer's parameters -> this module's.
_LAYER_NAMES = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attention_dense",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "intermediate",
    "output.dense": "output_dense",
    "output.LayerNorm": "output_norm",
}


class BertEncoder(nn.Module):
    """The encoder, and for a classifier its pooler and classification head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_layers))
        if config.num_labels:
            self.pooler = Linear(config.hidden_size, config.hidden_size)
            self.classifier = Linear(config.hidden_size, config.num_labels)

    @classmethod
    def build(cls, config: BertConfig) -> BertEncoder:
        """The module with meta (storage-free) parameters."""
        with torch.device("meta"):
            return cls(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        positions: torch.Tensor,
        bounds: list[tuple[int, int]],
    ) -> torch.Tensor:
        """Hidden states `[tokens, hidden]` of inputs laid one after another
        (`bounds`: each input's rows; `positions` restart at 0 in each)."""
        x = self.embeddings(input_ids, token_type_ids, positions)
        groups = attention_groups(bounds, x.device)
        for layer in self.layers:
            x = layer(x, groups)
        return x

    def classify(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[batch, num_labels]` of the first ([CLS]) token's hidden states."""
        return self.classifier(torch.tanh(self.pooler(cls_hidden)))


def checkpoint_name_to_module(name: str) -> str | None:
    """This module's parameter name for a checkpoint tensor's, None for a
    tensor it has no use for (`position_ids`, an embedding model's pooler)."""
    name = name.removeprefix("bert.")
    if name.startswith("embeddings."):
        return None if name.endswith("position_ids") else name
    if name.startswith("encoder.layer."):
        index, rest = name.removeprefix("encoder.layer.").split(".", 1)
        module, _, kind = rest.rpartition(".")
        return f"layers.{index}.{_LAYER_NAMES[module]}.{kind}" if module in _LAYER_NAMES else None
    if name.startswith("pooler.dense."):
        return "pooler." + name.removeprefix("pooler.dense.")
    if name.startswith("classifier."):
        return name
    return None


def load_bert(config: BertConfig, files: list[str], dtype: torch.dtype, device: torch.device) -> BertEncoder:
    """The encoder with its weights from safetensors `files`; raises
    CheckpointError naming the files when a tensor is missing or misshapen."""
    from safetensors import safe_open

    model = BertEncoder.build(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    state: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                target = checkpoint_name_to_module(name)
                if target is None or target not in expected:
                    continue
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != expected[target]:
                    raise CheckpointError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, "
                                          f"the config needs {expected[target]}")  # fmt: skip
                state[target] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        where = ", ".join(files)
        raise CheckpointError(f"{where}: missing tensors {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    model.load_state_dict(state, assign=True)
    return model.eval()
