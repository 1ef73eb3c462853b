"""Sampling the next token from logits: greedy at temperature 0, else
temperature, top-k, top-p and min-p, drawn from the request's own generator
(seeded when the request has a seed, so the same seed gives the same text
whatever else is in the batch). Stop tokens are masked until `min_tokens`."""

from __future__ import annotations

import os

import torch

from vllm_rs.engine.sched.request import Request


class Sampler:
    """Draws one token per row of logits."""

    def __init__(self, device: torch.device):
        self.device = device
        self._unseeded = torch.Generator(device=device).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def generator_for(self, request: Request) -> torch.Generator:
        """The request's generator: its own when seeded, else the shared one."""
        if request.sampling.seed is None:
            return self._unseeded
        if request.runner_state is None:
            request.runner_state = torch.Generator(device=self.device).manual_seed(request.sampling.seed)
        return request.runner_state

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """One token id per row of `logits` (`[len(requests), vocab]`)."""
        logits = logits.float()
        for row, request in enumerate(requests):
            if len(request.output_token_ids) < request.sampling.min_tokens:
                stop_ids = [t for t in request.sampling.stop_ids_for_min_tokens() if 0 <= t < logits.shape[1]]
                if stop_ids:
                    logits[row, stop_ids] = float("-inf")
        if all(r.sampling.is_greedy for r in requests):
            return logits.argmax(dim=-1).tolist()
        return [self._sample_row(logits[row], request) for row, request in enumerate(requests)]

    def _sample_row(self, logits: torch.Tensor, request: Request) -> int:
        params = request.sampling
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
        noise = torch.empty_like(probs).exponential_(generator=self.generator_for(request))
        return int((probs / noise).argmax())
