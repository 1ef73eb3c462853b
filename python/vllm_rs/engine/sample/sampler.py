"""Sampling the next token from logits: greedy at temperature 0, else
temperature, top-k, top-p and min-p, drawn from the request's own generator
when it has a seed (kept in the runner's state of the request, so the same
seed gives the same text whatever else is in the batch), else from one
shared generator. Stop tokens are masked until `min_tokens`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from vllm_rs.engine.sched.request import SamplingParams

if TYPE_CHECKING:
    from vllm_rs.engine.worker.request_state import CachedRequestState


class Sampler:
    """Draws one token per row of logits."""

    def __init__(self, device: torch.device):
        self.device = device
        self._unseeded = torch.Generator(device=device).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def seeded_generator(self, sampling: SamplingParams) -> torch.Generator | None:
        """A new request's own generator: seeded with its seed, None without one."""
        if sampling.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(sampling.seed)

    def sample(self, logits: torch.Tensor, states: list[CachedRequestState]) -> list[int]:
        """One token id per row of `logits` (`[len(states), vocab]`: one row per request)."""
        logits = logits.float()
        for row, state in enumerate(states):
            if state.num_output_tokens < state.sampling.min_tokens:
                stop_ids = [t for t in state.sampling.stop_ids_for_min_tokens() if 0 <= t < logits.shape[1]]
                if stop_ids:
                    logits[row, stop_ids] = float("-inf")
        if all(s.sampling.is_greedy for s in states):
            return logits.argmax(dim=-1).tolist()
        return [self._sample_row(logits[row], state) for row, state in enumerate(states)]

    def _sample_row(self, logits: torch.Tensor, state: CachedRequestState) -> int:
        params = state.sampling
        if params.is_greedy:
            return int(logits.argmax())
        logits = logits / params.temperature
        if 0 < params.top_k < logits.shape[0]:
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest set whose mass reaches top_p (always the first).
            drop = (sorted_probs.cumsum(0) - sorted_probs) >= params.top_p
            probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
        if params.min_p > 0.0:
            probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        # The exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
        noise = torch.empty_like(probs).exponential_(
            generator=self._unseeded if state.generator is None else state.generator
        )
        return int((probs / noise).argmax())
