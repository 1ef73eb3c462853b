"""Sampling the next token from logits: greedy at temperature 0, else
temperature, top-k, top-p and min-p, drawn from the request's own generator
when it has a seed (kept in the runner's state of the request, so the same
seed gives the same text whatever else is in the batch), else from one
shared generator. Stop tokens are masked until `min_tokens`. Works on host
float32 arrays (numpy), so the torch-free runner and the torch one sample
alike; a CUDA step's logits come to the host first."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from vllm_rs.engine.sched.request import SamplingParams

if TYPE_CHECKING:
    from vllm_rs.engine.worker.request_state import CachedRequestState


class Sampler:
    """Draws one token per row of logits."""

    def __init__(self):
        self._unseeded = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))

    def seeded_generator(self, sampling: SamplingParams) -> np.random.Generator | None:
        """A new request's own generator: seeded with its seed, None without one."""
        if sampling.seed is None:
            return None
        return np.random.default_rng(sampling.seed)

    def sample(self, logits: np.ndarray, states: list[CachedRequestState]) -> list[int]:
        """One token id per row of `logits` (float32 `[len(states), vocab]`:
        one row per request; the stop tokens of rows under `min_tokens` are
        set to -inf in place)."""
        for row, state in enumerate(states):
            if state.num_output_tokens < state.sampling.min_tokens:
                stop_ids = [t for t in state.sampling.stop_ids_for_min_tokens() if 0 <= t < logits.shape[1]]
                if stop_ids:
                    logits[row, stop_ids] = -np.inf
        if all(s.sampling.is_greedy for s in states):
            return logits.argmax(axis=-1).tolist()
        return [self._sample_row(logits[row], state) for row, state in enumerate(states)]

    def _sample_row(self, logits: np.ndarray, state: CachedRequestState) -> int:
        params = state.sampling
        if params.is_greedy:
            return int(logits.argmax())
        logits = logits / np.float32(params.temperature)
        if 0 < params.top_k < logits.shape[0]:
            kth = np.partition(logits, logits.shape[0] - params.top_k)[logits.shape[0] - params.top_k]
            logits = np.where(logits < kth, np.float32(-np.inf), logits)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if params.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            sorted_probs = probs[order]
            # Keep the smallest set whose mass reaches top_p (always the first).
            drop = (np.cumsum(sorted_probs) - sorted_probs) >= params.top_p
            probs[order[drop]] = 0.0
        if params.min_p > 0.0:
            probs[probs < params.min_p * probs.max()] = 0.0
        # The exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
        generator = self._unseeded if state.generator is None else state.generator
        noise = generator.standard_exponential(probs.shape[0], dtype=np.float32)
        return int((probs / noise).argmax())
