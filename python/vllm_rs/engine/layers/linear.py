"""`Linear`: `nn.Linear` whose CPU matmul goes through oneDNN.

torch's `F.linear` on the CPU calls MKL's sgemm, and MKL runs its AVX2 code
on AMD processors even where they have AVX-512. oneDNN (bundled with torch
as `mkldnn`) picks its code by the processor's features. On the 2-core AMD
EPYC (AVX-512) the benchmarks run on, BERT's linears over a 2,048-token step
ran 1.6x faster through oneDNN (docs/pooling.md, "Exactness and speed"); the
outputs agree with `F.linear` to float32 rounding (another summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: dtypes oneDNN's CPU linear computes (others keep torch's own kernel).
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


def uses_onednn(x: torch.Tensor) -> bool:
    """Whether `Linear` runs `x` through oneDNN: a CPU tensor of a dtype it
    computes, in a torch built with it."""
    return x.device.type == "cpu" and x.dtype in _ONEDNN_DTYPES and torch.backends.mkldnn.is_available()


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state-dict names) whose forward on
    the CPU is oneDNN's linear; elsewhere `F.linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ weight.T + bias`."""
        if uses_onednn(x):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
