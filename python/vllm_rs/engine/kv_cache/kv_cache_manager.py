"""Between the scheduler and the block pools: which KV blocks each request
holds (`Request.block_ids`, one table per KV-cache group), the hashes of
its full blocks (`Request.block_hashes`), the prefix-cache lookup when a
request is admitted, and the lookups' counts for the metrics.

Blocks are taken as the tokens that fill them are scheduled, as vLLM's
scheduler takes them: a request is admitted with blocks for its known tokens
(`allocate`), then grows block by block (`grow`). A block is registered in
the prefix cache once its tokens are computed (`cache_full_blocks`).

Layers with a sliding window read only the keys of their window: a block
that lies wholly before the window of a request's next query is read by no
later query, and goes back to the pool as soon as the window passes it
(`free_skipped_blocks`, as vLLM's SlidingWindowManager), its entry in the
request's table becoming NULL_BLOCK, so a long conversation holds the blocks
of its window, not of its length. A prefix-cache hit then needs only the
blocks its window reads cached (`BlockPool.find_cached_window`). Where
every layer has the window (Mistral's `sliding_window`) the model has one
KV-cache group; where global layers read every key beside windowed ones
(Gemma 3), the two kinds are two groups (`KVCacheGroup`), each with its own
pool, its own table per request and its own layers' caches, and only the
windowed group's blocks are freed.

A sequence past LongRoPE's original context (Phi-3) has keys rotated by the
long factors from its first token on, so its blocks are hashed apart from a
shorter sequence's blocks of the same tokens (`LONG_ROPE_SALT`), and a
sequence that grows past it is computed again (`crossed_long_rope`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_rs.engine.kv_cache.block_pool import NULL_BLOCK, BlockHasher, BlockPool
from vllm_rs.engine.stats import PrefixCacheStats

if TYPE_CHECKING:
    from vllm_rs.engine.sched.request import Request


def blocks_held_at_most(num_tokens: int, block_size: int, window: int | None, step_tokens: int) -> int:
    """The most blocks a request of `num_tokens` tokens holds at once when a
    step computes at most `step_tokens` of it: all of them, or with a
    sliding `window`, the blocks that the `window - 1` keys before a step
    and the step's tokens span (starting anywhere in a block)."""
    every = -(-num_tokens // block_size)
    if window is None:
        return every
    spanned = window - 1 + step_tokens
    return min(every, -(-(spanned + block_size - 1) // block_size))


@dataclass
class KVCacheGroup:
    """Layers that share one block table per request (vLLM's KV-cache
    group): the pool of their blocks, their sliding window (None: they read
    every key) and how many layers they are (what one of their blocks weighs
    in the cache's memory)."""

    block_pool: BlockPool
    window: int | None = None
    num_layers: int = 1


#: Added to the cache salt of a sequence longer than `long_rope_after`.
LONG_ROPE_SALT = "\x00longrope"


class KVCacheManager:
    """The blocks of every request in each KV-cache group (`groups`: the
    global one first, if any, then at most one windowed; each group holds
    as many blocks); with a `block_hasher` (and pools that cache), full
    blocks are shared through the prefix cache; in a windowed group, blocks
    every later query's window has passed are freed. `long_rope_after`: the
    original context of a model with LongRoPE's long factors
    (`rope_frequencies.long_rope_after`)."""

    def __init__(
        self,
        groups: Sequence[KVCacheGroup],
        block_size: int,
        block_hasher: BlockHasher | None = None,
        long_rope_after: int | None = None,
    ):
        self.groups = list(groups)
        self.block_size = block_size
        self.block_hasher = block_hasher if self.block_pool.enable_caching else None
        self.long_rope_after = long_rope_after
        # Only where every group frees blocks does a table cover less than the request's known tokens.
        self._every_group_windowed = all(group.window is not None for group in self.groups)
        #: Prefix-cache lookups since the last `take_prefix_cache_stats`.
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def block_pool(self) -> BlockPool:
        """The first group's pool (a model's only one, unless its global and
        windowed layers are two groups)."""
        return self.groups[0].block_pool

    @property
    def num_blocks(self) -> int:
        """Blocks in each group's pool."""
        return self.block_pool.num_blocks

    @property
    def usage(self) -> float:
        """Fraction of the cache held by requests: each group's share of
        blocks held, weighted by its layers."""
        layers = sum(group.num_layers for group in self.groups)
        return sum(group.block_pool.usage * group.num_layers for group in self.groups) / layers

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def blocks_held_at_most(self, num_tokens: int, step_tokens: int) -> int:
        """The most blocks a request of `num_tokens` tokens holds at once in
        any group, `step_tokens` computed per step at most (`blocks_held_at_most`)."""
        return max(blocks_held_at_most(num_tokens, self.block_size, g.window, step_tokens) for g in self.groups)

    def allocate(self, request: Request, step_tokens: int) -> bool:
        """Gives a request its cached prefix blocks and blocks for the rest of
        its known tokens (its prompt, and its output after a preemption) in
        every group, and sets its computed tokens to the cached ones; False
        (nothing taken) when there are not enough free blocks yet. With a
        window in every group, blocks only for its first step's tokens (at
        most `step_tokens`): the window frees blocks as it moves on, so a
        long prompt never needs all of its blocks at once. Blocks for the
        tokens it computes later come with `grow`, step by step."""
        cached: list[list[int]] = [[] for _ in self.groups]
        hashes: list[bytes] = []
        if self.block_hasher is not None:
            # At least the last prompt token is computed again: it yields the first sample.
            full_blocks = (request.num_prompt_tokens - 1) // self.block_size
            hashes = self._prompt_block_hashes(request, full_blocks)
            # Prompt logprobs need every prompt position computed, so such a
            # request reads nothing from the cache (as vLLM skips it).
            if request.sampling.prompt_logprobs is None:
                cached = self._find_cached(hashes)
        hit = len(cached[0])
        end = request.num_tokens
        if self._every_group_windowed:
            end = min(end, hit * self.block_size + step_tokens)
        needed = self.blocks_for(end) - hit
        held = [[block for block in blocks if block != NULL_BLOCK] for blocks in cached]
        if not all(g.block_pool.can_allocate(h, needed) for g, h in zip(self.groups, held, strict=True)):
            return False
        request.block_ids = [
            [*blocks, *g.block_pool.allocate(h, needed)[len(h) :]]
            for g, blocks, h in zip(self.groups, cached, held, strict=True)
        ]
        request.block_hashes = hashes[:hit]
        request.num_computed_tokens = hit * self.block_size
        if request.num_preemptions:
            if self.block_hasher is not None:
                self.prefix_cache_stats.record_preempted(request.num_prompt_tokens, request.num_computed_tokens)
            return True
        request.num_cached_tokens = request.num_computed_tokens
        if self.block_hasher is not None:
            self.prefix_cache_stats.record(request.num_prompt_tokens, request.num_cached_tokens)
        return True

    def grow(self, request: Request, num_tokens: int) -> bool:
        """Gives `request` blocks for its first `num_tokens` tokens in every
        group; False (nothing taken) when there are not enough free blocks."""
        # Every group's table covers the same positions.
        needed = self.blocks_for(num_tokens) - len(request.block_ids[0])
        if needed <= 0:
            return True
        if not all(group.block_pool.can_allocate([], needed) for group in self.groups):
            return False
        for group, table in zip(self.groups, request.block_ids, strict=True):
            table.extend(group.block_pool.allocate([], needed))
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Hashes the request's blocks whose tokens are all computed and
        registers them in the prefix cache (of every group)."""
        if self.block_hasher is None:
            return
        full = request.num_computed_tokens // self.block_size
        while len(request.block_hashes) < full:
            i = len(request.block_hashes)
            parent = request.block_hashes[-1] if request.block_hashes else None
            tokens = request.tokens(i * self.block_size, (i + 1) * self.block_size)
            block_hash = self.block_hasher(parent, tokens, self._salt(request))
            request.block_hashes.append(block_hash)
            for group, table in zip(self.groups, request.block_ids, strict=True):
                group.block_pool.register(table[i], block_hash)

    def free_skipped_blocks(self, request: Request) -> None:
        """Frees the request's blocks in each windowed group that lie wholly
        before the window of its next query (at `num_computed_tokens`, which
        sees the keys from `num_computed_tokens - window + 1` on): no later
        query reads them. They become NULL_BLOCK in its table and go back
        to the pool, in the prefix cache until reused. Call it after
        `cache_full_blocks`, so that they are registered first."""
        for group, table in zip(self.groups, request.block_ids, strict=True):
            if group.window is None:
                continue
            skipped = max(0, request.num_computed_tokens - group.window + 1) // self.block_size
            freed = []
            for i in range(min(skipped, len(table)) - 1, -1, -1):
                if table[i] == NULL_BLOCK:
                    break  # and so are all before it, freed by an earlier call
                freed.append(table[i])
                table[i] = NULL_BLOCK
            group.block_pool.release(freed)

    def free(self, request: Request) -> None:
        """Releases the request's blocks (its block hashes stay: its prefill
        stats read them after it finished)."""
        for group, table in zip(self.groups, request.block_ids, strict=True):
            group.block_pool.release([block for block in table if block != NULL_BLOCK])
        request.block_ids = []

    def free_preempted(self, request: Request) -> None:
        """Releases a preempted request's blocks and forgets their hashes: it
        is computed again from scratch when admitted again."""
        self.free(request)
        request.block_hashes = []

    def crossed_long_rope(self, request: Request) -> bool:
        """Whether the token just appended took the request past LongRoPE's
        original context: its keys so far rotated by the short factors, so
        it must be computed again (`recompute`) with the long ones."""
        after = self.long_rope_after
        return after is not None and request.num_tokens == after + 1 and request.num_prompt_tokens <= after

    def recompute(self, request: Request) -> None:
        """Releases a running request's blocks and hashes so that its next
        steps compute every token again, from the first."""
        self.free_preempted(request)
        request.block_ids = [[] for _ in self.groups]
        request.num_computed_tokens = 0

    def reset_prefix_cache(self) -> bool:
        """Forgets the prefix cache; True when done."""
        self.prefix_cache_stats.reset = True
        return all([group.block_pool.reset_prefix_cache() for group in self.groups])

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache lookups since the last call (vLLM reports deltas)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def _find_cached(self, hashes: list[bytes]) -> list[list[int]]:
        """Each group's blocks of the longest prefix of `hashes` that every
        group has cached: a global group needs every block of it, a
        windowed one only those its next query's window reads
        (`BlockPool.find_cached_window`; the others are NULL_BLOCK)."""
        found: list[list[int]] = []
        hit = len(hashes)
        # A global group's hit stays one when cut shorter; a windowed one's
        # may not, so the windowed group (the last) is asked last.
        for group in self.groups:
            if group.window is None:
                blocks = group.block_pool.find_cached_prefix(hashes[:hit])
            else:
                # The query after a hit of whole blocks sees its `window - 1` keys before it.
                blocks = group.block_pool.find_cached_window(hashes[:hit], max(1, self.blocks_for(group.window - 1)))
            found.append(blocks)
            hit = len(blocks)
        return [blocks[:hit] for blocks in found]

    def _prompt_block_hashes(self, request: Request, count: int) -> list[bytes]:
        hashes: list[bytes] = []
        parent = None
        for i in range(count):
            tokens = request.prompt_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = self.block_hasher(parent, tokens, self._salt(request))
            hashes.append(parent)
        return hashes

    def _salt(self, request: Request) -> str | None:
        """The salt of the request's first block hash: its cache salt, marked
        for a sequence whose keys rotate by LongRoPE's long factors."""
        after = self.long_rope_after
        if after is not None and request.num_tokens > after:
            return (request.cache_salt or "") + LONG_ROPE_SALT
        return request.cache_salt
