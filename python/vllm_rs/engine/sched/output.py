"""What passes between the scheduler and a model runner each step: the plan
(`StepPlan`: which requests compute how many tokens, and which left since
the last plan) and what the runner computed (`ModelOutput`).

A step's plan has the attributes `compute_iteration_details` reads
(`scheduled_new_reqs`, `scheduled_cached_reqs`, `num_scheduled_tokens`,
`scheduled_encoder_input_stats`), so it can be measured without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.sample.logprobs import LogprobsRows
from vllm_rs.engine.sched.request import Request


@dataclass(frozen=True)
class NewRequest:
    """A request scheduled for the first time."""

    req_id: str
    num_computed_tokens: int


@dataclass(frozen=True)
class CachedRequests:
    """Requests scheduled before; `context_phase_req_ids` have no output yet
    (a later prefill chunk)."""

    req_ids: list[str]
    context_phase_req_ids: frozenset[str]

    def is_context_phase(self, req_id: str) -> bool:
        """True when `req_id` is still prefilling."""
        return req_id in self.context_phase_req_ids


@dataclass
class StepPlan:
    """What one step computes: tokens per request id, in batch order."""

    scheduled_new_reqs: list[NewRequest] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequests = field(default_factory=lambda: CachedRequests([], frozenset()))
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_encoder_input_stats: None = None
    #: The scheduled requests, in the order of `num_scheduled_tokens` (the
    #: runner reads them and never changes them).
    requests: list[Request] = field(default_factory=list)
    #: Requests that left the scheduler (finished, aborted) since the last
    #: plan: the runner drops what it keeps of them (vLLM's `finished_req_ids`).
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Tokens computed this step."""
        return sum(self.num_scheduled_tokens.values())


@dataclass
class ModelOutput:
    """What a runner computed in one step: the sampled token of each request
    that reached the end of its known tokens and, for requests that asked,
    the sampled token's logprobs and the prompt logprobs computed this step."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, LogprobsRows] = field(default_factory=dict)
    prompt_logprobs: dict[str, LogprobsRows] = field(default_factory=dict)
    #: A pooling model's vector of each request it finished (a torch tensor).
    pooled: dict[str, Any] = field(default_factory=dict)
