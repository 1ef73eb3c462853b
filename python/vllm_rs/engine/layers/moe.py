"""Mixture-of-experts MLP: a router picks each token's top-k experts, and
only those run, the step's tokens grouped by expert (one gather of every
(token, expert) pair's row, sorted by expert; one pass of each expert that
has tokens over its contiguous run; one gather back to the pairs' order).
Each token's weighted expert outputs are summed in ascending expert order,
as transformers' eager experts loop adds them, so float32 outputs agree to
rounding. Parameter names are the Hugging Face checkpoints'
(`mlp.gate.weight`, `mlp.experts.E.gate_proj.weight`, Qwen2-MoE's
`mlp.shared_expert.*` and `mlp.shared_expert_gate.weight`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vllm_rs.engine.model_loader.checkpoint import MoeConfig


class SparseMoeBlock(nn.Module):
    """The routed experts of one layer (`MoeConfig`), each built by
    `expert(intermediate_size)` (the decoder's own MLP), with the shared
    expert when the config has one."""

    def __init__(self, hidden_size: int, moe: MoeConfig, expert: Callable[[int], nn.Module]):
        super().__init__()
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(expert(moe.intermediate_size) for _ in range(moe.num_experts))
        self.shared_expert = (
            expert(moe.shared_expert_intermediate_size) if moe.shared_expert_intermediate_size else None
        )
        if self.shared_expert is not None:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
        self.top_k, self.norm_topk_prob, self.float32_weights = moe.top_k, moe.norm_topk_prob, moe.float32_weights

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's routing weights and experts (`[tokens, top_k]` each,
        the largest first): softmax in float32 over all experts, then the
        top k, renormalized when `norm_topk_prob`."""
        probs = torch.softmax(self.gate.forward(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.float32_weights else weights.to(x.dtype)), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MoE output of each row of `x` (`[tokens, hidden]`)."""
        weights, experts = self.route(x)
        # Each row's experts in ascending order, so that pair (token, slot)
        # i = token * top_k + slot is summed in transformers' order below.
        experts, slots = experts.sort(dim=-1)
        weights = weights.gather(1, slots)
        # The pairs sorted by expert: each expert's tokens are one
        # contiguous run of `order`.
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        rows = x.index_select(0, order // self.top_k)
        pair_weights = weights.flatten().index_select(0, order).unsqueeze(1)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        outputs, start = [], 0
        for expert, count in zip(self.experts, counts, strict=True):
            if count:
                outputs.append(expert.forward(rows[start : start + count]) * pair_weights[start : start + count])
                start += count
        # Back to the pairs' order by a gather: `index_add_` (the scatter it
        # replaces) opens a parallel region even for one row, and on a CPU
        # shared with other work each such region waited milliseconds for
        # its second thread (a MoE step 10x slower than the dense model's).
        pairs = torch.cat(outputs).index_select(0, torch.argsort(order)).to(x.dtype).view(-1, self.top_k, x.shape[1])
        out = pairs[:, 0]
        for slot in range(1, self.top_k):
            out = out + pairs[:, slot]
        if self.shared_expert is not None:
            gate = torch.sigmoid(self.shared_expert_gate.forward(x))
            out = out + gate * self.shared_expert.forward(x)
        return out
