"""The scheduler-step counts of `vllm_rs.utils` ("Tensor utilities"
contract): `compute_iteration_details` and the minimal scheduler-output
dataclasses it reads (any object with the same attributes works). Kept free
of torch, so an engine that never loads torch (the native runner) counts
its steps with the same code; `vllm_rs.tensor_utils` re-exports them."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class IterationDetails:
    """Counts of context (prefill) and generation (decode) requests and
    tokens in one scheduler step, plus encoder inputs and their tokens."""

    num_ctx_requests: int
    num_ctx_tokens: int
    num_generation_requests: int
    num_generation_tokens: int
    num_encoder_inputs: int = 0
    num_encoder_output_tokens: int = 0


@dataclass(frozen=True)
class NewRequestData:
    """A request scheduled for the first time (only `req_id` is read by
    `compute_iteration_details`)."""

    req_id: str
    prompt_token_ids: list[int] | None = None
    num_computed_tokens: int = 0


@dataclass(frozen=True)
class CachedRequestData:
    """Requests scheduled before: `req_ids[i]` has produced
    `num_output_tokens[i]` output tokens so far.

    Built fresh for each scheduler step and not changed afterwards (the
    per-request lookup is cached on first use, as in vLLM).
    """

    req_ids: list[str] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.num_output_tokens) != len(self.req_ids):
            raise ValueError(
                f"num_output_tokens has {len(self.num_output_tokens)} entries for {len(self.req_ids)} req_ids"
            )

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        """No cached requests."""
        return cls()

    @property
    def num_reqs(self) -> int:
        """Number of cached requests."""
        return len(self.req_ids)

    @functools.cached_property
    def context_phase_req_ids(self) -> frozenset[str]:
        """Ids of the cached requests with no output token yet (a later
        chunk of a chunked prefill)."""
        # With duplicate ids the last entry wins, as in is_context_phase.
        out = dict(zip(self.req_ids, self.num_output_tokens))
        return frozenset(rid for rid, n in out.items() if n == 0)

    def is_context_phase(self, req_id: str) -> bool:
        """True when `req_id` is a cached request still without output
        tokens; False for unknown ids."""
        return req_id in self.context_phase_req_ids


@dataclass(frozen=True)
class EncoderInputStats:
    """Encoder inputs scheduled in one step and their output tokens."""

    num_inputs: int = 0
    output_tokens: int = 0


@dataclass
class SchedulerOutput:
    """The parts of a scheduler step that `compute_iteration_details` reads:
    new and cached requests, tokens scheduled per request id, and encoder
    input stats (None when there are none)."""

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_encoder_input_stats: EncoderInputStats | None = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Sum of `num_scheduled_tokens`."""
        return sum(self.num_scheduled_tokens.values())


def compute_iteration_details(scheduler_output: Any) -> IterationDetails:
    """Count context and generation requests and tokens of one scheduler step.

    A request is a context request when it is new
    (`scheduled_new_reqs[*].req_id`) or
    `scheduled_cached_reqs.is_context_phase(req_id)` (no output token yet,
    e.g. a later chunk of a chunked prefill); every other request in
    `num_scheduled_tokens` is a generation request. Encoder counts come from
    `scheduled_encoder_input_stats` (`num_inputs`, `output_tokens`), 0 when
    it is None. Any object with these attributes works.
    """
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    new_req_ids = {req.req_id for req in scheduler_output.scheduled_new_reqs}

    num_reqs = len(num_scheduled_tokens)
    num_tokens = sum(num_scheduled_tokens.values())
    if type(cached) is CachedRequestData and type(num_scheduled_tokens) is dict:
        # Our own dataclass: is_context_phase is set membership, so the whole
        # classification is set intersections done in C.
        ctx_ids: Iterable[str] = num_scheduled_tokens.keys() & (new_req_ids | cached.context_phase_req_ids)
    else:
        # Duck-typed input: one is_context_phase call per request that is not
        # known to be new (same answer as the seed, which calls it for all).
        is_context_phase = cached.is_context_phase
        ctx_ids = [req_id for req_id in num_scheduled_tokens if req_id in new_req_ids or is_context_phase(req_id)]
    num_ctx_requests = len(ctx_ids)
    num_ctx_tokens = sum(map(num_scheduled_tokens.__getitem__, ctx_ids))

    num_encoder_inputs = 0
    num_encoder_output_tokens = 0
    encoder_stats = scheduler_output.scheduled_encoder_input_stats
    if encoder_stats is not None:
        num_encoder_inputs = encoder_stats.num_inputs
        num_encoder_output_tokens = encoder_stats.output_tokens

    return IterationDetails(
        num_ctx_requests,
        num_ctx_tokens,
        num_reqs - num_ctx_requests,
        num_tokens - num_ctx_tokens,
        num_encoder_inputs,
        num_encoder_output_tokens,
    )
