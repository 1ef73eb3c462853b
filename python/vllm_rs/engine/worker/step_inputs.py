"""A step's inputs staged in host arrays (numpy, no torch): each scheduled
token's id, position and cache slot, the key slots of every sequence from
position 0 with each token's first key (`key_starts`; the keys a sliding
window passed, whose blocks were freed, stand in as slots of block 0 that
no query reads), each for every KV-cache group, and the rows whose logits
are wanted (one per sampled request, then the prompt positions whose
logprobs were asked for); for a model with LongRoPE's long factors, which
tokens rotate by them (`long_rope`). Both executors read the same staging: the native
one hands the arrays to Rust, the torch one copies them to its device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vllm_rs.engine.kv_cache.block_pool import NULL_BLOCK
from vllm_rs.engine.sched.output import StepPlan
from vllm_rs.engine.sched.request import Request
from vllm_rs.engine.worker.request_state import CachedRequestState


@dataclass
class StagedStep:
    """A step staged in the host arrays: each request's `(first row, end
    row, first key, keys, first position)`, the requests sampled, the
    prompt positions scored, the key slots staged (`num_keys`), the tokens
    and the logits rows wanted."""

    ranges: list[tuple[int, int, int, int, int]]
    sample_requests: list[CachedRequestState]
    prompt_scores: list[tuple[CachedRequestState, list[int]]]
    num_keys: int
    num_tokens: int
    num_rows: int


@dataclass
class StepInputs:
    """The host arrays (int64) a step is staged in, sized for the largest
    step: `max_num_batched_tokens` tokens, `max_num_seqs` full sequences of
    keys. An executor may pass arrays of its own (the host halves of its
    device buffers)."""

    block_size: int
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    key_slots: np.ndarray
    key_starts: np.ndarray
    logits_indices: np.ndarray
    #: Each further KV-cache group's `(slot_mapping, key_slots)` (a model
    #: whose windowed layers keep a block table of their own beside the
    #: global layers', Gemma 3): the same tokens and keys, in its blocks.
    group_slots: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    #: The original context of a model with LongRoPE's long factors
    #: (`rope_frequencies.long_rope_after`), None for the others.
    long_rope_after: int | None = None
    #: 0 .. block_size - 1, made once: a block's slots are `block * block_size + this`.
    block_offsets: np.ndarray = field(init=False)
    #: Per token (uint8), 1 where it rotates by LongRoPE's long factors: its
    #: sequence is longer than `long_rope_after`.
    long_rope: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.block_offsets = np.arange(self.block_size, dtype=np.int64)
        self.long_rope = np.zeros(len(self.input_ids) if self.long_rope_after is not None else 0, np.uint8)

    @classmethod
    def allocate(
        cls,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_model_len: int,
        num_groups: int = 1,
        long_rope_after: int | None = None,
    ) -> StepInputs:
        """Fresh arrays for steps of at most `max_tokens` tokens over
        `max_seqs` sequences of `max_model_len`, in `num_groups` KV-cache groups."""
        sizes = step_array_sizes(max_tokens, max_seqs, max_model_len)
        arrays = [np.empty(n, np.int64) for n in sizes]
        groups = [(np.empty(sizes[2], np.int64), np.empty(sizes[3], np.int64)) for _ in range(num_groups - 1)]
        return cls(block_size, *arrays, group_slots=groups, long_rope_after=long_rope_after)

    def long_rope_flags(self, num_tokens: int) -> np.ndarray | None:
        """The staged step's `long_rope` flags, None where no token has them."""
        if self.long_rope_after is None or not self.long_rope[:num_tokens].any():
            return None
        return self.long_rope[:num_tokens]

    def stage(self, plan: StepPlan, state_of: Callable[[Request], CachedRequestState]) -> StagedStep:
        """Fills the arrays for `plan`; `state_of` gives the runner's state
        of each request (a sampled request's logits row goes first, the
        prompt positions scored after all of them)."""
        ids, positions, key_starts = self.input_ids, self.positions, self.key_starts
        groups = [(self.slot_mapping, self.key_slots), *self.group_slots]
        ranges = []
        sample_requests = []
        # (request, prompt tokens scored): the logits rows of prompt positions
        # go after the sampled rows, so sampling sees a contiguous block.
        prompt_scores: list[tuple[CachedRequestState, list[int]]] = []
        prompt_rows: list[np.ndarray] = []
        row = key_row = 0
        for request in plan.requests:
            state = state_of(request)
            n = plan.num_scheduled_tokens[request.request_id]
            start_pos = request.num_computed_tokens
            end_pos = start_pos + n
            ids[row : row + n] = request.tokens(start_pos, end_pos)
            positions[row : row + n] = np.arange(start_pos, end_pos)
            if self.long_rope_after is not None:
                self.long_rope[row : row + n] = request.num_tokens > self.long_rope_after
            for (slots, key_slots), table in zip(groups, request.block_ids, strict=True):
                blocks = np.asarray(table[: -(-end_pos // self.block_size)], dtype=np.int64)
                if table[0] == NULL_BLOCK:
                    # Blocks its sliding window passed (always the table's
                    # first) are read by no query: block 0 stands in, so
                    # that every staged slot is in the cache.
                    blocks[blocks == NULL_BLOCK] = 0
                all_slots = (blocks[:, None] * self.block_size + self.block_offsets).reshape(-1)[:end_pos]
                slots[row : row + n] = all_slots[start_pos:end_pos]
                key_slots[key_row : key_row + end_pos] = all_slots
            key_starts[row : row + n] = key_row
            ranges.append((row, row + n, key_row, end_pos, start_pos))
            if end_pos == request.num_tokens:
                self.logits_indices[len(sample_requests)] = row + n - 1
                sample_requests.append(state)
            first = max(start_pos, state.num_prompt_scored)
            last = min(end_pos, request.num_prompt_tokens - 1)
            if request.sampling.prompt_logprobs is not None and first < last:
                # Position p scores prompt token p + 1.
                prompt_scores.append((state, request.prompt_token_ids[first + 1 : last + 1]))
                prompt_rows.append(np.arange(row + first - start_pos, row + last - start_pos))
                state.num_prompt_scored = last
            row += n
            key_row += end_pos
        num_rows = len(sample_requests)
        if prompt_rows:
            extra = np.concatenate(prompt_rows)
            self.logits_indices[num_rows : num_rows + len(extra)] = extra
            num_rows += len(extra)
        return StagedStep(ranges, sample_requests, prompt_scores, key_row, row, num_rows)


def step_array_sizes(max_tokens: int, max_seqs: int, max_model_len: int) -> tuple[int, ...]:
    """The lengths of `StepInputs`' arrays after `block_size`: ids,
    positions, slots (one per token), key slots (every sequence's keys), key
    starts (one per token), logits rows (one per sampled request, plus
    every prompt position when prompt logprobs are asked for)."""
    max_keys = max_seqs * max_model_len
    return (max_tokens, max_tokens, max_tokens, max_keys, max_tokens, max_seqs + max_tokens)
