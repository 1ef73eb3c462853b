"""Continuous batching: every step, running requests get their next token (or
the next chunk of their prompt) first, then waiting requests join while
`max_num_seqs` and the `max_num_batched_tokens` budget allow and their KV
blocks can be had. Long prompts are prefilled in chunks.

KV blocks come from the KV cache manager (`kv_cache.kv_cache_manager`), as
the tokens that fill them are scheduled. When a running request's next
tokens find no free block, the most recently admitted running request is
preempted (its blocks freed, to be computed again from its prompt and output
so far when it is admitted again, first in line), with a PREEMPTED event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from vllm_rs.engine.kv_cache.kv_cache_manager import KVCacheManager
from vllm_rs.engine.protocol import EngineCoreEventType, FinishReason
from vllm_rs.engine.sched.output import CachedRequests, NewRequest, StepPlan
from vllm_rs.engine.sched.request import InvalidRequestError, Request, RequestStatus
from vllm_rs.engine.stats import PrefixCacheStats


class Scheduler:
    """Waiting and running requests and the step plan; their KV blocks
    through `kv_cache_manager` (None for a model without a KV cache)."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        kv_cache_manager: KVCacheManager | None,
        record_events: bool = True,
        whole_prompts: bool = False,
    ):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv_cache_manager = kv_cache_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        #: Whether requests get QUEUED/SCHEDULED events (vLLM: with log_stats).
        self.record_events = record_events
        #: A pooling model's inputs are scheduled whole, never in chunks.
        self.whole_prompts = whole_prompts
        #: Ids finished (any reason) since the last `take_finished`, by client.
        self.finished_ids: dict[int, list[str]] = {}
        #: Ids of requests removed since the last plan (the runner forgets them).
        self._finished_req_ids: set[str] = set()
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
        kv = self.kv_cache_manager
        if kv is not None and self._blocks_needed(request) > kv.num_blocks:
            raise InvalidRequestError(
                f"the request needs {self._blocks_needed(request)} KV blocks; the cache has {kv.num_blocks}"
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
        plan = StepPlan(finished_req_ids=self._finished_req_ids)
        self._finished_req_ids = set()
        budget = self.max_num_batched_tokens
        cached_ids: list[str] = []
        context_ids: set[str] = set()
        # Preemption pops victims off the end of `running`: the iteration stops before them.
        for request in self.running:
            if budget == 0:
                break
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            # (A model without a KV cache, `echo`, takes no blocks: its step stays bookkeeping only.)
            if self.kv_cache_manager is not None and not self._make_room(request, request.num_computed_tokens + n):
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
            if self.kv_cache_manager is not None and not self.kv_cache_manager.allocate(request, budget):
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
            if self.kv_cache_manager is not None:
                # Registered before freed: a block the window passed stays in the prefix cache.
                self.kv_cache_manager.cache_full_blocks(request)
                self.kv_cache_manager.free_skipped_blocks(request)
            token = sampled.get(request.request_id)
            if token is None:
                continue
            advanced.append(request)
            if request.append_token(token, self.max_model_len):
                self._free(request)
            elif self.kv_cache_manager is not None and self.kv_cache_manager.crossed_long_rope(request):
                self.kv_cache_manager.recompute(request)
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
        if self.kv_cache_manager is None:
            return True
        return self.kv_cache_manager.reset_prefix_cache()

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache lookups since the last call (vLLM reports deltas)."""
        if self.kv_cache_manager is None:
            return PrefixCacheStats()
        return self.kv_cache_manager.take_prefix_cache_stats()

    def take_finished(self, client_index: int) -> list[str]:
        """Ids of `client_index`'s requests finished since the last call."""
        return self.finished_ids.pop(client_index, [])

    def note_finished(self, client_index: int, request_id: str) -> None:
        """Remembers a finished id for the next message to its client."""
        self.finished_ids.setdefault(client_index, []).append(request_id)

    def _blocks_needed(self, request: Request) -> int:
        """The most blocks `request` holds at once (fewer than its length's
        with a sliding window, which frees them as it moves on)."""
        longest = min(request.max_total_tokens, self.max_model_len)
        return self.kv_cache_manager.blocks_held_at_most(longest, self.max_num_batched_tokens)

    def _grow(self, request: Request, num_tokens: int) -> bool:
        """Gives `request` blocks for its first `num_tokens` tokens (always
        True without a KV cache)."""
        return self.kv_cache_manager is None or self.kv_cache_manager.grow(request, num_tokens)

    def _make_room(self, request: Request, num_tokens: int) -> bool:
        """Gives running `request` blocks for `num_tokens` tokens, preempting
        the most recently admitted running requests while blocks are short;
        False when `request` itself had to be preempted."""
        if num_tokens <= len(request.block_ids[0]) * self.kv_cache_manager.block_size:
            return True  # a decode inside its last block: most steps
        while not self.kv_cache_manager.grow(request, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        """Frees a running request's blocks and puts it first in line, to be
        computed again from scratch (its output so far kept)."""
        self.kv_cache_manager.free_preempted(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        if self.record_events:
            request.record_event(EngineCoreEventType.PREEMPTED)
        self.waiting.appendleft(request)

    def _free(self, request: Request) -> None:
        if self.requests.pop(request.request_id, None) is not None:
            self.note_finished(request.client_index, request.request_id)
            self._finished_req_ids.add(request.request_id)
        if self.kv_cache_manager is not None:
            self.kv_cache_manager.free(request)
