"""A GGUF model's weights kept compact on the CPU (`--quantization gguf`):
every linear layer's weight (and the output head, tied or not) packed in
half precision for fbgemm's fp16 GEMM (`quantized::linear_dynamic_fp16`:
fp16 weights, float32 activations and accumulation), and the token
embeddings read row by row from the GGUF file's own bytes (memory-mapped)
and dequantized when a token is looked up. No float32 copy of a weight is
kept. Why fp16 packs and not torch's int8/int4 weight-only kernels, with the
measurements: docs/real-model-speed.md."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vllm_rs.engine.gguf_file import GgufTensor


class PackedLinear(nn.Module):
    """`y = x @ W.T (+ b)` with `W` held as fbgemm's packed fp16 matrix; `x`
    and `y` are float32. Built empty (with a meta bias when it has one); the
    weight arrives with `load_weight`, the bias through `load_state_dict`."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, device="meta")) if bias else None
        self.packed: torch.ScriptObject | None = None

    @property
    def weight_shape(self) -> tuple[int, int]:
        """The shape of the checkpoint's weight tensor, `(out, in)`."""
        return (self.out_features, self.in_features)

    def load_weight(self, weight: torch.Tensor) -> None:
        """Packs `weight` (`[out, in]`, any float dtype) as fp16; the
        argument is not kept."""
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer applied to the last dimension of `x` (float32)."""
        out = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return out if self.bias is None else out.add_(self.bias)


class GgufEmbedding(nn.Module):
    """Token embeddings looked up in the GGUF file itself: the rows asked
    for are dequantized from the memory-mapped file (exactly as the
    dequantized path loads them), so only the pages of tokens seen are
    resident, and they are the file's (shared, reclaimable) pages."""

    def __init__(self, path: str, tensor: GgufTensor):
        super().__init__()
        import gguf

        self._type = gguf.GGMLQuantizationType(tensor.type)
        self.num_embeddings, self.embedding_dim = tensor.shape
        data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        self._rows = data[tensor.offset : tensor.offset + tensor.num_bytes].reshape(self.num_embeddings, -1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[tokens]` ids -> `[tokens, hidden]` float32 rows."""
        import gguf

        rows = self._rows[input_ids.numpy()]
        if self._type == gguf.GGMLQuantizationType.F32:
            values = rows.view(np.float32)
        elif self._type == gguf.GGMLQuantizationType.F16:
            values = rows.view(np.float16)
        else:
            values = gguf.quants.dequantize(rows, self._type)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(-1, self.embedding_dim)


def pack_linears(model: nn.Module, path: str, embeddings: GgufTensor) -> dict[str, PackedLinear]:
    """Swaps the (meta) `nn.Linear` layers of a `llama.CausalLM` for
    PackedLinear ones, gives it a packed `lm_head` (loaded from the
    embeddings when they are tied) and the file-backed GgufEmbedding.
    Returns checkpoint weight name -> the layer that takes it."""
    takes: dict[str, PackedLinear] = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                packed = PackedLinear(child.in_features, child.out_features, child.bias is not None)
                setattr(module, child_name, packed)
                takes[f"{name}.{child_name}.weight" if name else f"{child_name}.weight"] = packed
    backbone = model.model
    backbone.embed_tokens = GgufEmbedding(path, embeddings)
    if model.config.tie_word_embeddings:
        model.lm_head = PackedLinear(backbone.embed_tokens.embedding_dim, backbone.embed_tokens.num_embeddings, False)
        takes["model.embed_tokens.weight"] = model.lm_head
    return takes
