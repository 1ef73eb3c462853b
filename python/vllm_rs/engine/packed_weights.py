"""A GGUF model's weights kept compact on the CPU (`--quantization gguf`).
Every linear layer's weight (and the output head, tied or not) whose GGUF
tensor is Q8_0, Q4_0 or Q4_1 stays in the file's own blocks (the memory
map, zero-copy) and is multiplied by `vllm_rs._core.gguf_matmul` (the Rust
kernel of rust/kernels/: float32 activations, weights dequantized in
registers, float32 accumulation); a weight of another type (Q4_K, F16, ...)
is packed in half precision for fbgemm's fp16 GEMM
(`quantized::linear_dynamic_fp16`). The token embeddings are read row by
row from the file and dequantized when a token is looked up. No float32
copy of a weight is kept. Why these kernels and not torch's int8/int4
weight-only ones, with the measurements: docs/real-model-speed.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads
from vllm_rs.engine.gguf_file import GgufTensor

#: ggml type ids the Rust kernel reads in place: Q4_0, Q4_1, Q8_0.
KERNEL_TYPES = frozenset({2, 3, 8})


@dataclass(frozen=True)
class GgufBlocks:
    """A 2-D GGUF tensor of a KERNEL_TYPES type, not dequantized: `rows` is
    `[out, bytes per row]` uint8 (a view of the file's memory map, or a
    row-permuted copy), `shape` the weight's `(out, in)`."""

    type: int
    shape: tuple[int, int]
    rows: np.ndarray


class PackedLinear(nn.Module):
    """`y = x @ W.T (+ b)` with `W` held compact: as GGUF blocks read by the
    Rust kernel, or as fbgemm's packed fp16 matrix; `x` and `y` are float32.
    Built empty (with a meta bias when it has one); the weight arrives with
    `load_weight`, the bias through `load_state_dict`. The kernel runs on
    `cpu_threads.kernel_threads()` threads."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, device="meta")) if bias else None
        self.packed: torch.ScriptObject | None = None
        self.blocks: GgufBlocks | None = None

    @property
    def weight_shape(self) -> tuple[int, int]:
        """The shape of the checkpoint's weight tensor, `(out, in)`."""
        return (self.out_features, self.in_features)

    def load_weight(self, weight: torch.Tensor | GgufBlocks) -> None:
        """Keeps GGUF blocks as they are (for the kernel), or packs a dense
        `weight` (`[out, in]`, any float dtype) as fp16 (the argument is
        not kept)."""
        if isinstance(weight, GgufBlocks):
            self.blocks = weight
        else:
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer applied to the last dimension of `x` (float32)."""
        if self.blocks is None:
            out = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        else:
            out = self._kernel(x)
        return out if self.bias is None else out.add_(self.bias)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        # The output is allocated by numpy and wrapped, and a 2-D contiguous
        # input used as it is: measured 11-17 us of Python around each call
        # against 21-30 us with torch.empty, reshape and view (211 calls per
        # SmolLM2 step).
        two_d = x.dim() == 2 and x.is_contiguous()
        rows = (x if two_d else x.reshape(-1, self.in_features).contiguous()).numpy()
        out = np.empty((rows.shape[0], self.out_features), np.float32)
        blocks = self.blocks
        _core.gguf_matmul(rows, blocks.rows, out, blocks.type, self.out_features, self.in_features,
                          kernel_threads())  # fmt: skip
        result = torch.from_numpy(out)
        return result if two_d else result.view(*x.shape[:-1], self.out_features)


def every_matmul_in_kernels(model: nn.Module) -> bool:
    """Whether `model` multiplies only through the Rust kernel: it has
    `PackedLinear` layers, each holding GGUF blocks, and no `nn.Linear`."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    return (
        bool(packed)
        and all(m.blocks is not None for m in packed)
        and not any(isinstance(m, nn.Linear) for m in model.modules())
    )


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
