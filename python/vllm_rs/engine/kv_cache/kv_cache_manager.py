"""Between the scheduler and the block pool: which KV blocks each request
holds (`Request.block_ids`), the hashes of its full blocks
(`Request.block_hashes`), the prefix-cache lookup when a request is admitted,
and the lookups' counts for the metrics.

Blocks are taken as the tokens that fill them are scheduled, as vLLM's
scheduler takes them: a request is admitted with blocks for its known tokens
(`allocate`), then grows block by block (`grow`). A block is registered in
the prefix cache once its tokens are computed (`cache_full_blocks`).

With a sliding window on every layer (Mistral's `sliding_window`), a block
that lies wholly before the window of a request's next query is read by no
later query: it goes back to the pool as soon as the window passes it
(`free_skipped_blocks`, as vLLM's SlidingWindowManager), its entry in the
request's table becoming NULL_BLOCK, so a long conversation holds the blocks
of its window, not of its length. A prefix-cache hit then needs only the
blocks its window reads cached (`BlockPool.find_cached_window`)."""

from __future__ import annotations

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


class KVCacheManager:
    """The blocks of every request in one block pool; with a `block_hasher`
    (and a pool that caches), full blocks are shared through the prefix
    cache; with a `window` (the attention window of every layer), blocks
    every later query's window has passed are freed."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        block_hasher: BlockHasher | None = None,
        window: int | None = None,
    ):
        self.block_pool = block_pool
        self.block_size = block_size
        self.block_hasher = block_hasher if block_pool.enable_caching else None
        #: The sliding window of every layer (None: some layer reads every key).
        self.window = window
        #: Prefix-cache lookups since the last `take_prefix_cache_stats`.
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self.block_pool.num_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests."""
        return self.block_pool.usage

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def blocks_held_at_most(self, num_tokens: int, step_tokens: int) -> int:
        """The most blocks a request of `num_tokens` tokens holds at once,
        `step_tokens` computed per step at most (`blocks_held_at_most`)."""
        return blocks_held_at_most(num_tokens, self.block_size, self.window, step_tokens)

    def allocate(self, request: Request, step_tokens: int) -> bool:
        """Gives a request its cached prefix blocks and blocks for the rest of
        its known tokens (its prompt, and its output after a preemption),
        and sets its computed tokens to the cached ones; False (nothing
        taken) when there are not enough free blocks yet. With a window,
        blocks only for its first step's tokens (at most `step_tokens`):
        the window frees blocks as it moves on, so a long prompt never
        needs all of its blocks at once. Blocks for the tokens it computes
        later come with `grow`, step by step."""
        pool = self.block_pool
        cached: list[int] = []
        hashes: list[bytes] = []
        if self.block_hasher is not None:
            # At least the last prompt token is computed again: it yields the first sample.
            full_blocks = (request.num_prompt_tokens - 1) // self.block_size
            hashes = self._prompt_block_hashes(request, full_blocks)
            # Prompt logprobs need every prompt position computed, so such a
            # request reads nothing from the cache (as vLLM skips it).
            if request.sampling.prompt_logprobs is None:
                cached = self._find_cached(hashes)
        end = request.num_tokens
        if self.window is not None:
            end = min(end, len(cached) * self.block_size + step_tokens)
        held = [block for block in cached if block != NULL_BLOCK]
        needed = self.blocks_for(end) - len(cached)
        if not pool.can_allocate(held, needed):
            return False
        request.block_ids = [*cached, *pool.allocate(held, needed)[len(held) :]]
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

    def grow(self, request: Request, num_tokens: int) -> bool:
        """Gives `request` blocks for its first `num_tokens` tokens; False
        (nothing taken) when there are not enough free blocks."""
        needed = self.blocks_for(num_tokens) - len(request.block_ids)
        if needed <= 0:
            return True
        if not self.block_pool.can_allocate([], needed):
            return False
        request.block_ids.extend(self.block_pool.allocate([], needed))
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Hashes the request's blocks whose tokens are all computed and
        registers them in the prefix cache."""
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

    def free_skipped_blocks(self, request: Request) -> None:
        """Frees the request's blocks that lie wholly before the window of
        its next query (at `num_computed_tokens`, which sees the keys from
        `num_computed_tokens - window + 1` on): no later query reads them.
        They become NULL_BLOCK in its table and go back to the pool, in the
        prefix cache until reused. Call it after `cache_full_blocks`, so
        that they are registered first. Nothing happens without a window."""
        if self.window is None:
            return
        skipped = max(0, request.num_computed_tokens - self.window + 1) // self.block_size
        blocks = request.block_ids
        freed = []
        for i in range(min(skipped, len(blocks)) - 1, -1, -1):
            if blocks[i] == NULL_BLOCK:
                break  # and so are all before it, freed by an earlier call
            freed.append(blocks[i])
            blocks[i] = NULL_BLOCK
        self.block_pool.release(freed)

    def free(self, request: Request) -> None:
        """Releases the request's blocks (its block hashes stay: its prefill
        stats read them after it finished)."""
        if request.block_ids:
            self.block_pool.release([block for block in request.block_ids if block != NULL_BLOCK])
            request.block_ids = []

    def free_preempted(self, request: Request) -> None:
        """Releases a preempted request's blocks and forgets their hashes: it
        is computed again from scratch when admitted again."""
        self.free(request)
        request.block_hashes = []

    def reset_prefix_cache(self) -> bool:
        """Forgets the prefix cache; True when done."""
        self.prefix_cache_stats.reset = True
        return self.block_pool.reset_prefix_cache()

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache lookups since the last call (vLLM reports deltas)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def _find_cached(self, hashes: list[bytes]) -> list[int]:
        """The blocks of the longest cached prefix of `hashes`; with a
        window, only the blocks its next query's window reads need be
        cached (`BlockPool.find_cached_window`; the others are NULL_BLOCK)."""
        if self.window is None:
            return self.block_pool.find_cached_prefix(hashes)
        # The query after a hit of whole blocks sees its `window - 1` keys before it.
        return self.block_pool.find_cached_window(hashes, max(1, self.blocks_for(self.window - 1)))

    def _prompt_block_hashes(self, request: Request, count: int) -> list[bytes]:
        hashes: list[bytes] = []
        parent = None
        for i in range(count):
            tokens = request.prompt_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = self.block_hasher(parent, tokens, request.cache_salt)
            hashes.append(parent)
        return hashes
