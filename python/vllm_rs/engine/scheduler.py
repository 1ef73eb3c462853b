"""Continuous batching: every step, running requests get their next token (or
the next chunk of their prompt) first, then waiting requests join while
`max_num_seqs` and the `max_num_batched_tokens` budget allow and their KV
blocks can be had. Long prompts are prefilled in chunks.

KV blocks are taken as the tokens that fill them are scheduled, as vLLM's
scheduler takes them. When a running request's next tokens find no free
block, the most recently admitted running request is preempted (its blocks
freed, to be computed again from its prompt and output so far when it is
admitted again, first in line), with a PREEMPTED event.

A step's plan has the attributes `compute_iteration_details` reads
(`scheduled_new_reqs`, `scheduled_cached_reqs`, `num_scheduled_tokens`,
`scheduled_encoder_input_stats`), so it can be measured without copying.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.block_pool import BlockHasher, BlockPool
from vllm_rs.engine.protocol import EngineCoreEventType, FinishReason
from vllm_rs.engine.request import InvalidRequestError, Request, RequestStatus
from vllm_rs.engine.sample.logprobs import LogprobsRows
from vllm_rs.engine.stats import PrefixCacheStats


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
    #: The scheduled requests, in the order of `num_scheduled_tokens`.
    requests: list[Request] = field(default_factory=list)

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


class Scheduler:
    """Waiting and running requests, the block pool, and the step plan."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_pool: BlockPool | None,
        block_size: int,
        block_hasher: BlockHasher | None = None,
        record_events: bool = True,
        whole_prompts: bool = False,
    ):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_pool = block_pool
        self.block_size = block_size
        self.block_hasher = block_hasher if block_pool is not None and block_pool.enable_caching else None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        #: Whether requests get QUEUED/SCHEDULED events (vLLM: with log_stats).
        self.record_events = record_events
        #: A pooling model's inputs are scheduled whole, never in chunks.
        self.whole_prompts = whole_prompts
        #: Prefix-cache lookups since the last `take_prefix_cache_stats`.
        self.prefix_cache_stats = PrefixCacheStats()
        #: Ids finished (any reason) since the last `take_finished`, by client.
        self.finished_ids: dict[int, list[str]] = {}
        #: Preemptions so far.
        self.num_preemptions = 0

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting to join."""
        return len(self.waiting)

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        """Queues `request`; raises InvalidRequestError when it can never run."""
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id} is already in the engine")
        if request.num_prompt_tokens == 0:
            raise InvalidRequestError("the prompt is empty")
        # A pooled input may fill the model; a generated one needs room for a token.
        if request.num_prompt_tokens >= self.max_model_len + self.whole_prompts:
            raise InvalidRequestError(
                f"the prompt has {request.num_prompt_tokens} tokens; max_model_len is {self.max_model_len}"
            )
        if self.block_pool is not None and self._blocks_needed(request) > self.block_pool.num_blocks:
            raise InvalidRequestError(
                f"the request needs {self._blocks_needed(request)} KV blocks; the cache has {self.block_pool.num_blocks}"
            )
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if self.record_events:
            request.record_event(EngineCoreEventType.QUEUED)

    def abort(self, request_ids: Iterable[str]) -> list[Request]:
        """Removes these requests (unknown ids are ignored); returns the removed."""
        removed = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.WAITING:
                self.waiting.remove(request)
            request.finish(FinishReason.ABORT)
            self._free(request)
            removed.append(request)
        if removed:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return removed

    def schedule(self, admit: bool = True) -> StepPlan:
        """Plans the next step (empty when there is nothing to do); waiting
        requests join only when `admit` (False while paused)."""
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        cached_ids: list[str] = []
        context_ids: set[str] = set()
        # Preemption pops victims off the end of `running`: the iteration stops before them.
        for request in self.running:
            if budget == 0:
                break
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            # (A model without a KV cache, `echo`, takes no blocks: its step stays bookkeeping only.)
            if self.block_pool is not None and not self._make_room(request, request.num_computed_tokens + n):
                break  # it was preempted itself, and every request after it
            plan.num_scheduled_tokens[request.request_id] = n
            plan.requests.append(request)
            cached_ids.append(request.request_id)
            if not request.output_token_ids:
                context_ids.add(request.request_id)
            budget -= n
        while admit and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.whole_prompts and request.num_tokens > budget:
                break  # the next step has the budget for it
            if not self._allocate(request):
                break  # first come, first served: nobody overtakes
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            if self.record_events:
                request.record_event(EngineCoreEventType.SCHEDULED)
            self.running.append(request)
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            self._grow(request, request.num_computed_tokens + n)
            plan.num_scheduled_tokens[request.request_id] = n
            plan.requests.append(request)
            plan.scheduled_new_reqs.append(NewRequest(request.request_id, request.num_computed_tokens))
            budget -= n
        plan.scheduled_cached_reqs = CachedRequests(cached_ids, frozenset(context_ids))
        return plan

    def update(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        """Advances the planned requests by what was computed; appends the
        sampled tokens of those that reached the end of their known tokens,
        applies the stop checks. Returns the requests with a new token, each
        finished one already removed from the scheduler."""
        advanced = []
        for request in plan.requests:
            if request.status != RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += plan.num_scheduled_tokens[request.request_id]
            self._register_full_blocks(request)
            token = sampled.get(request.request_id)
            if token is None:
                continue
            advanced.append(request)
            if request.append_token(token, self.max_model_len):
                self._free(request)
        if any(r.status == RequestStatus.FINISHED for r in advanced):
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return advanced

    def finish_pooled(self, requests: Iterable[Request]) -> None:
        """Ends pooled requests (their one output is out) and removes them."""
        for request in requests:
            request.finish(FinishReason.STOP)
            self._free(request)
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]

    def reset_prefix_cache(self) -> bool:
        """Forgets the prefix cache; True when done."""
        if self.block_pool is None:
            return True
        self.prefix_cache_stats.reset = True
        return self.block_pool.reset_prefix_cache()

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache lookups since the last call (vLLM reports deltas)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def take_finished(self, client_index: int) -> list[str]:
        """Ids of `client_index`'s requests finished since the last call."""
        return self.finished_ids.pop(client_index, [])

    def note_finished(self, client_index: int, request_id: str) -> None:
        """Remembers a finished id for the next message to its client."""
        self.finished_ids.setdefault(client_index, []).append(request_id)

    def _blocks_needed(self, request: Request) -> int:
        total = min(request.max_total_tokens, self.max_model_len)
        return -(-total // self.block_size)

    def _grow(self, request: Request, num_tokens: int) -> bool:
        """Gives `request` blocks for its first `num_tokens` tokens; False
        (nothing taken) when there are not enough free blocks."""
        pool = self.block_pool
        if pool is None:
            return True
        needed = -(-num_tokens // self.block_size) - len(request.block_ids)
        if needed <= 0:
            return True
        if not pool.can_allocate([], needed):
            return False
        request.block_ids.extend(pool.allocate([], needed))
        return True

    def _make_room(self, request: Request, num_tokens: int) -> bool:
        """Gives running `request` blocks for `num_tokens` tokens, preempting
        the most recently admitted running requests while blocks are short;
        False when `request` itself had to be preempted."""
        if num_tokens <= len(request.block_ids) * self.block_size:
            return True  # a decode inside its last block: most steps
        while not self._grow(request, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        """Frees a running request's blocks and puts it first in line, to be
        computed again from scratch (its output so far kept)."""
        if self.block_pool is not None and request.block_ids:
            self.block_pool.release(request.block_ids)
        request.block_ids = []
        request.block_hashes = []
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        if self.record_events:
            request.record_event(EngineCoreEventType.PREEMPTED)
        self.waiting.appendleft(request)

    def _allocate(self, request: Request) -> bool:
        """Gives a request its cached prefix blocks and blocks for the rest of
        its known tokens (its prompt, and its output after a preemption);
        False when there are not enough free blocks yet. Blocks for the tokens
        it generates come with `_grow`, step by step."""
        pool = self.block_pool
        if pool is None:
            return True
        cached: list[int] = []
        hashes: list[bytes] = []
        if self.block_hasher is not None:
            # At least the last prompt token is computed again: it yields the first sample.
            full_blocks = (request.num_prompt_tokens - 1) // self.block_size
            hashes = self._prompt_block_hashes(request, full_blocks)
            # Prompt logprobs need every prompt position computed, so such a
            # request reads nothing from the cache (as vLLM skips it).
            if request.sampling.prompt_logprobs is None:
                cached = pool.find_cached_prefix(hashes)
        needed = -(-request.num_tokens // self.block_size) - len(cached)
        if not pool.can_allocate(cached, needed):
            return False
        request.block_ids = pool.allocate(cached, needed)
        request.block_hashes = hashes[: len(cached)]
        request.num_computed_tokens = len(cached) * self.block_size
        if request.num_preemptions:
            if self.block_hasher is not None:
                self.prefix_cache_stats.record_preempted(request.num_prompt_tokens, request.num_computed_tokens)
            return True
        request.num_cached_tokens = request.num_computed_tokens
        if self.block_hasher is not None:
            self.prefix_cache_stats.record(request.num_prompt_tokens, request.num_cached_tokens)
        return True

    def _prompt_block_hashes(self, request: Request, count: int) -> list[bytes]:
        hashes: list[bytes] = []
        parent = None
        for i in range(count):
            tokens = request.prompt_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = self.block_hasher(parent, tokens, request.cache_salt)
            hashes.append(parent)
        return hashes

    def _register_full_blocks(self, request: Request) -> None:
        if self.block_hasher is None:
            return
        full = request.num_computed_tokens // self.block_size
        while len(request.block_hashes) < full:
            i = len(request.block_hashes)
            parent = request.block_hashes[-1] if request.block_hashes else None
            tokens = request.tokens(i * self.block_size, (i + 1) * self.block_size)
            block_hash = self.block_hasher(parent, tokens, request.cache_salt)
            request.block_hashes.append(block_hash)
            self.block_pool.register(request.block_ids[i], block_hash)

    def _free(self, request: Request) -> None:
        if self.requests.pop(request.request_id, None) is not None:
            self.note_finished(request.client_index, request.request_id)
        if self.block_pool is not None and request.block_ids:
            self.block_pool.release(request.block_ids)
            request.block_ids = []
