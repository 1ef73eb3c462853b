"""GGUF weights of every type the Rust kernel reads, for tests and benches:
the `gguf` package's quantizers where it has one (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, F16, BF16), else random blocks with valid f16 scales whose weights
have the spread of a real layer's (|w| mostly under 0.3)."""

from __future__ import annotations

import numpy as np

#: ggml type name -> (type id, weights per block as the kernel reads them).
KERNEL_TYPES = {
    "Q8_0": (8, 32), "Q4_0": (2, 32), "Q4_1": (3, 32), "Q5_0": (6, 32), "Q5_1": (7, 32), "IQ4_NL": (20, 32),
    "F16": (1, 32), "BF16": (30, 32), "Q2_K": (10, 256), "Q3_K": (11, 256), "Q4_K": (12, 256),
    "Q5_K": (13, 256), "Q6_K": (14, 256), "IQ4_XS": (23, 256),
}  # fmt: skip
#: Types the `gguf` package quantizes itself.
GGUF_QUANTIZES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16")
#: Random-block types: bytes per block and (offset, typical magnitude) of
#: each f16 scale, so that scale x sub-scale x quant stays near 0.3.
_RANDOM = {
    "IQ4_NL": (18, ((0, 2e-3),)),
    "Q2_K": (84, ((80, 5e-3), (82, 5e-3))),
    "Q3_K": (110, ((108, 2e-3),)),
    "Q4_K": (144, ((0, 3e-4), (2, 3e-4))),
    "Q5_K": (176, ((0, 1.5e-4), (2, 1.5e-4))),
    "Q6_K": (210, ((208, 6e-5),)),
    "IQ4_XS": (136, ((0, 6e-5),)),
}


def random_blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """`[rows, bytes per row]` uint8 blocks of type `name` for a `rows x
    cols` weight: random quants, each f16 scale its type's magnitude times
    0.5..1.5 (Q8_0, Q4_0, ... and F16/BF16 come from random weights through
    the `gguf` package's quantizers)."""
    rng = np.random.default_rng(seed)
    if name in GGUF_QUANTIZES:
        return quantize(name, (rng.standard_normal((rows, cols)) * 0.15).astype(np.float32))
    block_bytes, scales = _RANDOM[name]
    per_row = cols // KERNEL_TYPES[name][1]
    blocks = rng.integers(0, 256, (rows * per_row, block_bytes), dtype=np.uint8)
    for offset, magnitude in scales:
        values = (magnitude * rng.uniform(0.5, 1.5, rows * per_row)).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, per_row * block_bytes)


def quantize(name: str, weight: np.ndarray) -> np.ndarray:
    """`weight` (`[rows, cols]` float32) as `[rows, bytes per row]` uint8
    blocks of type `name`: random blocks of the same shape (seeded by the
    weight) for the kernel's types the `gguf` package cannot quantize, else
    its quantization (also of types the kernel does not read, as TQ2_0)."""
    import gguf

    if name in _RANDOM:
        return random_blocks(name, *weight.shape, seed=int(abs(weight).sum() * 1e3) % (1 << 32))
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType[name])
    return np.ascontiguousarray(blocks).view(np.uint8).reshape(weight.shape[0], -1)
