"""Between the scheduler and the block pool: which KV blocks each request
holds (`Request.block_ids`), the hashes of its full blocks
(`Request.block_hashes`), the prefix-cache lookup when a request is admitted,
and the lookups' counts for the metrics.

A sequence past LongRoPE's original context (Phi-3) has keys rotated by the
long factors from its first token on, so its blocks are hashed apart from a
shorter sequence's blocks of the same tokens (`LONG_ROPE_SALT`), and a
sequence that grows past it is computed again (`crossed_long_rope`).

Blocks are taken as the tokens that fill them are scheduled, as vLLM's
scheduler takes them: a request is admitted with blocks for its known tokens
(`allocate`), then grows block by block (`grow`). A block is registered in
the prefix cache once its tokens are computed (`cache_full_blocks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_rs.engine.kv_cache.block_pool import BlockHasher, BlockPool
from vllm_rs.engine.stats import PrefixCacheStats

if TYPE_CHECKING:
    from vllm_rs.engine.sched.request import Request


#: Added to the cache salt of a sequence longer than `long_rope_after`.
LONG_ROPE_SALT = "\x00longrope"


class KVCacheManager:
    """The blocks of every request in one block pool; with a `block_hasher`
    (and a pool that caches), full blocks are shared through the prefix
    cache. `long_rope_after`: the original context of a model with
    LongRoPE's long factors (`rope_frequencies.long_rope_after`)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        block_hasher: BlockHasher | None = None,
        long_rope_after: int | None = None,
    ):
        self.block_pool = block_pool
        self.block_size = block_size
        self.block_hasher = block_hasher if block_pool.enable_caching else None
        self.long_rope_after = long_rope_after
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

    def allocate(self, request: Request) -> bool:
        """Gives a request its cached prefix blocks and blocks for the rest of
        its known tokens (its prompt, and its output after a preemption),
        and sets its computed tokens to the cached ones; False (nothing
        taken) when there are not enough free blocks yet. Blocks for the
        tokens it generates come with `grow`, step by step."""
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
                cached = pool.find_cached_prefix(hashes)
        needed = self.blocks_for(request.num_tokens) - len(cached)
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
            block_hash = self.block_hasher(parent, tokens, self._salt(request))
            request.block_hashes.append(block_hash)
            self.block_pool.register(request.block_ids[i], block_hash)

    def free(self, request: Request) -> None:
        """Releases the request's blocks (its block hashes stay: its prefill
        stats read them after it finished)."""
        if request.block_ids:
            self.block_pool.release(request.block_ids)
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

    def _prompt_block_hashes(self, request: Request, count: int) -> list[bytes]:
        hashes: list[bytes] = []
        parent = None
        for i in range(count):
            tokens = request.prompt_token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = self.block_hasher(parent, tokens, self._salt(request))
            hashes.append(parent)
        return hashes

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
        request.num_computed_tokens = 0

    def _salt(self, request: Request) -> str | None:
        """The salt of the request's first block hash: its cache salt, marked
        for a sequence whose keys rotate by LongRoPE's long factors."""
        after = self.long_rope_after
        if after is not None and request.num_tokens > after:
            return (request.cache_salt or "") + LONG_ROPE_SALT
        return request.cache_salt
