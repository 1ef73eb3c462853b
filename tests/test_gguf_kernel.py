"""`vllm_rs._core.gguf_matmul`, the Rust kernel that multiplies float32
activations by GGUF blocks read in place (every type of it:
test_gguf_formats.py): on real SmolLM2
tensors it equals the `gguf` package's dequantization followed by
`F.linear` within float32 summation error, for decode and prefill row
counts and several thread counts; bad buffers raise a clear Python error
naming the argument, never a crash."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from vllm_rs import _core
from vllm_rs.engine.model_loader.gguf_file import read_header
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

Q4_0, Q4_1, Q8_0 = 2, 3, 8


@pytest.fixture(scope="module")
def smollm2_tensors() -> dict[str, tuple[int, np.ndarray, tuple[int, int]]]:
    """name -> (ggml type, `[out, bytes per row]` uint8 view of the file, shape)."""
    try:
        path = packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}")
    header = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    out = {}
    for name in ("blk.0.ffn_down.weight", "blk.7.attn_k.weight", "token_embd.weight"):
        t = header.tensors[name]
        out[name] = (t.type, data[t.offset : t.offset + t.num_bytes].reshape(t.shape[0], -1), t.shape)
    return out


def dequantize(kind: int, rows: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(kind)).reshape(shape).copy())


def kernel(x: torch.Tensor, kind: int, rows: np.ndarray, n: int, threads: int = 1) -> torch.Tensor:
    out = torch.full((x.shape[0], n), float("nan"))
    _core.gguf_matmul(x.numpy(), rows, out.numpy(), kind, n, x.shape[1], threads)
    return out


def assert_matches_dequantized(x: torch.Tensor, weight: torch.Tensor, got: torch.Tensor) -> None:
    """Within float32 summation error of the float64 product."""
    exact = F.linear(x.double(), weight.double())
    bound = F.linear(x.double().abs(), weight.double().abs()) * (4 * torch.finfo(torch.float32).eps * x.shape[1] ** 0.5)
    assert torch.all((got.double() - exact).abs() <= bound + 1e-30)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 5, 16, 33])
@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.7.attn_k.weight", "token_embd.weight"])
def test_the_kernel_equals_dequantize_then_linear(smollm2_tensors, name, m):
    kind, rows, (n, k) = smollm2_tensors[name]
    assert kind in (Q4_1, Q8_0)
    weight = dequantize(kind, rows, (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
    for threads in (1, 2, 3):
        assert_matches_dequantized(x, weight, kernel(x, kind, rows, n, threads))


@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0])
def test_every_type_on_a_real_weight_requantized(smollm2_tensors, kind):
    """SmolLM2 has no Q4_0 tensor: its down projection, quantized by the
    `gguf` package to each type, checks the three block layouts."""
    import gguf

    source, rows, shape = smollm2_tensors["blk.0.ffn_down.weight"]
    blocks = gguf.quants.quantize(dequantize(source, rows, shape).numpy(), gguf.GGMLQuantizationType(kind))
    x = torch.randn(7, shape[1], generator=torch.Generator().manual_seed(0))
    got = kernel(x, kind, blocks, shape[0], threads=2)
    assert_matches_dequantized(x, dequantize(kind, blocks, shape), got)


def test_bad_buffers_raise_clear_errors():
    w = np.zeros((4, 34), np.uint8)  # 4 rows of one Q8_0 block: n = 4, k = 32
    x, out = np.zeros((2, 32), np.float32), np.zeros((2, 4), np.float32)
    _core.gguf_matmul(x, w, out, Q8_0, 4, 32, 1)
    cases = [
        ((x.astype(np.float64), w, out, Q8_0, 4, 32, 1), TypeError, "x must be a buffer of float32"),
        ((x, w.view(np.int8), out, Q8_0, 4, 32, 1), TypeError, "w must be a buffer of uint8"),
        ((x, w, [0.0] * 8, Q8_0, 4, 32, 1), TypeError, "out must be a buffer of float32"),
        ((np.zeros((32, 2), np.float32).T, w, out, Q8_0, 4, 32, 1), ValueError, "x must be C-contiguous"),
        ((x, w, out, 16, 4, 32, 1), ValueError, "quant_type 16 is not one the kernel reads: Q8_0 (8), Q4_0 (2)"),
        ((x, w, out, Q8_0, 4, 30, 1), ValueError, "x has 64 elements, not a whole number of rows of k = 30"),
        ((x, w, out, Q8_0, 4, 16, 1), ValueError, "k = 16 is not a positive multiple of 32 (the Q8_0 block size)"),
        ((x, w, out, Q4_0, 4, 32, 1), ValueError, "w has 136 bytes, m = 2, n = 4, k = 32 need 72"),
        ((x, w, out, Q8_0, 3, 32, 1), ValueError, "w has 136 bytes"),
        ((x, w, np.zeros(7, np.float32), Q8_0, 4, 32, 1), ValueError, "y has 7 elements"),
        ((x, w, out, Q8_0, 4, 32, 0), ValueError, "threads must be at least 1"),
        ((x, w, out, Q8_0, 4, 32, -1), OverflowError, "negative"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            _core.gguf_matmul(*args)
    readonly = out.copy()
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        _core.gguf_matmul(x, w, readonly, Q8_0, 4, 32, 1)
    both = np.zeros(2 * 32 + 8, np.float32)
    with pytest.raises(ValueError, match="out overlaps x"):
        _core.gguf_matmul(both[:64], w, both[56:64], Q8_0, 4, 32, 1)
    assert not np.isnan(out).any()


def test_torch_tensors_pass_zero_copy():
    w = np.zeros((3, 34), np.uint8)
    w[:, 1] = 0x3C  # d = 1
    w[:, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    x = torch.ones(2, 32)
    out = torch.zeros(2, 3)
    _core.gguf_matmul(x.numpy(), w, out.numpy(), Q8_0, 3, 32, 1)
    assert torch.equal(out, torch.full((2, 3), float(sum(range(32)))))
