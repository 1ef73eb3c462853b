"""What a model runner keeps of each request (vLLM's `CachedRequestState`):
created when the request first appears in a step, dropped when a step's plan
lists it in `finished_req_ids`, so it outlives a preemption. The scheduler's
`Request` is read through it, never written."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_rs.engine.sched.request import Request, SamplingParams


@dataclass
class CachedRequestState:
    """One request as the runner sees it."""

    request_id: str
    #: The scheduler's request: its tokens, blocks and sampling settings (read only).
    request: Request
    #: The request's own generator when it has a seed (None: the sampler's shared one).
    generator: np.random.Generator | None
    #: Prompt positions whose logprobs were computed already (a preempted
    #: request computes its prompt again; they are not scored twice).
    num_prompt_scored: int = 0

    @property
    def sampling(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.sampling

    @property
    def num_output_tokens(self) -> int:
        """Tokens the request has produced so far."""
        return len(self.request.output_token_ids)
