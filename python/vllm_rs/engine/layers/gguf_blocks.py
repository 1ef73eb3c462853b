"""A GGUF tensor as the Rust kernel reads it, with no torch: `GgufBlocks`
(a weight left in the file's blocks, multiplied in place by
`vllm_rs._core.gguf_matmul`), which types and row widths the kernel reads
(`kernel_reads`), and `GgufRows`, the token embeddings looked up in the
memory-mapped file. The torch modules (`packed_weights`) and the torch-free
native step (`worker/native_step.py`) share them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_rs import _core
from vllm_rs.engine.model_loader.gguf_file import KERNEL_BLOCKS, GgufTensor

#: The ggml type id of float32 (rows read as they are).
_F32 = 0


def kernel_reads(ggml_type: int, in_features: int) -> bool:
    """Whether the Rust kernel multiplies a weight of `ggml_type` with rows
    of `in_features` in place (its type, rows of whole blocks)."""
    block = KERNEL_BLOCKS.get(ggml_type)
    return block is not None and in_features % block == 0


@dataclass(frozen=True)
class GgufBlocks:
    """A 2-D GGUF tensor of a type the kernel reads, not dequantized: `rows`
    is `[out, bytes per row]` uint8 (a view of the file's memory map, or a
    row-permuted copy), `shape` the weight's `(out, in)`."""

    type: int
    shape: tuple[int, int]
    rows: np.ndarray


class GgufRows:
    """A GGUF embedding table read from the memory-mapped file: the rows
    asked for are dequantized when looked up (by the Rust kernel's
    dequantization where it reads the type, else the `gguf` package's, as
    the dequantized path loads them), so only the pages of tokens seen are
    resident."""

    def __init__(self, path: str, tensor: GgufTensor):
        self.type = tensor.type
        self.num_embeddings, self.embedding_dim = tensor.shape
        data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        self._rows = data[tensor.offset : tensor.offset + tensor.num_bytes].reshape(self.num_embeddings, -1)

    def lookup(self, input_ids: np.ndarray) -> np.ndarray:
        """`[tokens]` int64 ids -> `[tokens, hidden]` float32 rows (a new,
        writable array)."""
        rows = self._rows[input_ids]
        if self.type == _F32:
            return np.array(rows.view(np.float32), dtype=np.float32).reshape(-1, self.embedding_dim)
        if kernel_reads(self.type, self.embedding_dim):
            values = np.empty((rows.shape[0], self.embedding_dim), np.float32)
            _core.gguf_dequantize(rows, values, self.type)
            return values
        import gguf

        values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(self.type))
        return np.array(values, dtype=np.float32).reshape(-1, self.embedding_dim)
