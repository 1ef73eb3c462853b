"""A GGUF model's weights kept as the file stores them on the CPU
(`--quantization gguf`). Every linear layer's weight (and the output head,
tied or not) whose GGUF type the Rust kernel reads (KERNEL_BLOCKS: the
legacy blocks Q4_0..Q8_0, Q5_0, Q5_1, IQ4_NL, the K-quants Q2_K..Q6_K,
IQ4_XS, F16 and BF16) stays in the file's own blocks (the memory map,
zero-copy) and is multiplied by `vllm_rs._core.gguf_matmul` (the kernel of
rust/kernels/: float32 activations, weights dequantized in registers to the
bits the `gguf` package gives, float32 accumulation). A weight of another
type (F32, the other i-quants) is held in float32, dequantized by the
`gguf` package, as `--quantization none` holds it. The token embeddings are
read row by row from the file and dequantized when a token is looked up.
Why these kernels, with the measurements: docs/real-model-speed.md."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks, GgufRows, kernel_reads
from vllm_rs.engine.model_loader.gguf_file import GgufTensor


class PackedLinear(nn.Module):
    """`y = x @ W.T (+ b)` with `W` held as GGUF blocks read by the Rust
    kernel, or (a type the kernel does not read) as a dense float32 matrix;
    `x` and `y` are float32. Built empty (with a meta bias when it has
    one); the weight arrives with `load_weight`, the bias through
    `load_state_dict`. The kernel runs on `cpu_threads.kernel_threads()`
    threads."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, device="meta")) if bias else None
        self.dense: torch.Tensor | None = None
        self.blocks: GgufBlocks | None = None

    @property
    def weight_shape(self) -> tuple[int, int]:
        """The shape of the checkpoint's weight tensor, `(out, in)`."""
        return (self.out_features, self.in_features)

    def load_weight(self, weight: torch.Tensor | GgufBlocks) -> None:
        """Keeps GGUF blocks as they are (for the kernel), or a dense
        `weight` (`[out, in]`) in float32."""
        if isinstance(weight, GgufBlocks):
            self.blocks = weight
        else:
            self.dense = weight.float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer applied to the last dimension of `x` (float32)."""
        out = F.linear(x, self.dense) if self.blocks is None else self._kernel(x)
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
    """Token embeddings looked up in the GGUF file itself (`GgufRows`): only
    the pages of tokens seen are resident, and they are the file's (shared,
    reclaimable) pages."""

    def __init__(self, path: str, tensor: GgufTensor):
        super().__init__()
        self.rows = GgufRows(path, tensor)
        self.num_embeddings, self.embedding_dim = self.rows.num_embeddings, self.rows.embedding_dim

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[tokens]` ids -> `[tokens, hidden]` float32 rows."""
        return torch.from_numpy(self.rows.lookup(input_ids.numpy()))


class HalfEmbedding(nn.Module):
    """Token embeddings kept in the checkpoint's float16/bfloat16: the rows
    looked up are widened to float32 (exactly) when a token is looked up."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.half_weight = weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[tokens]` ids -> `[tokens, hidden]` float32 rows."""
        return self.half_weight.index_select(0, input_ids).float()


def half_blocks(weight: torch.Tensor) -> GgufBlocks | torch.Tensor:
    """A float16/bfloat16 `[out, in]` weight as the kernel's F16/BF16 rows
    (a view of the same memory, no copy), where the kernel reads it (rows
    of whole 32-weight groups); else the tensor itself."""
    kind = {torch.float16: 1, torch.bfloat16: 30}.get(weight.dtype)
    if kind is None or weight.dim() != 2 or not kernel_reads(kind, weight.shape[1]):
        return weight
    rows = weight.contiguous().view(torch.uint8).numpy()
    return GgufBlocks(kind, tuple(weight.shape), rows)


def pack_linears(model: nn.Module, path: str | None, embeddings: GgufTensor | None) -> dict[str, PackedLinear]:
    """Swaps the (meta) `nn.Linear` layers of a `llama.CausalLM` for
    PackedLinear ones and gives it a packed `lm_head` (loaded from the
    embeddings when they are tied); with a GGUF `path`, the file-backed
    GgufEmbedding. Returns checkpoint weight name -> the layer that takes it."""
    takes: dict[str, PackedLinear] = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                packed = PackedLinear(child.in_features, child.out_features, child.bias is not None)
                setattr(module, child_name, packed)
                takes[f"{name}.{child_name}.weight" if name else f"{child_name}.weight"] = packed
    backbone = model.model
    if path is not None:
        backbone.embed_tokens = GgufEmbedding(path, embeddings)
    if model.config.tie_word_embeddings:
        model.lm_head = PackedLinear(model.config.hidden_size, model.config.vocab_size, False)
        takes["model.embed_tokens.weight"] = model.lm_head
    return takes
