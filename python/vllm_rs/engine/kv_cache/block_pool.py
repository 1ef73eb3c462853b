"""KV-cache blocks: allocation with reference counts, and the prefix cache
(full blocks found again by the hash of their tokens and everything before
them). Free blocks keep their cached contents until they are reused, least
recently freed first. Blocks never handed out are taken only when no freed
one is left: the cache's pages become resident when a block is first
written, so its resident memory is the most blocks ever held at once (what
the live sequences needed at their peak), not the budget."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

#: The block-table entry of a block a request no longer holds because no
#: query of its sliding window will read it again: the blocks after it keep
#: their positions in the table.
NULL_BLOCK = -1


class BlockPool:
    """`num_blocks` KV-cache blocks; with `enable_caching`, full blocks are
    registered under their hash and reused by later requests."""

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks
        # Freed blocks (written before), least recently freed first.
        self._free: OrderedDict[int, None] = OrderedDict()
        # Blocks from here on were never handed out (never written).
        self._next_unused = 0
        self._hash_to_block: dict[bytes, int] = {}
        self._block_hash: list[bytes | None] = [None] * num_blocks
        self.queries = 0
        self.hits = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request (cached, freed or never used)."""
        return len(self._free) + self.num_blocks - self._next_unused

    @property
    def num_blocks_ever_used(self) -> int:
        """Blocks handed out at least once (those whose pages may be resident)."""
        return self._next_unused

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    def find_cached_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks holding the longest cached prefix of `hashes`."""
        found: list[int] = []
        if self.enable_caching:
            for block_hash in hashes:
                block = self._hash_to_block.get(block_hash)
                if block is None:
                    break
                found.append(block)
        self.queries += len(hashes)
        self.hits += len(found)
        return found

    def find_cached_window(self, hashes: Sequence[bytes], contiguous: int) -> list[int]:
        """The blocks of the longest prefix of `hashes` whose last
        `contiguous` (at least 1) blocks are all cached, or that is cached
        whole when shorter: what a sliding window reads from a hit. The
        blocks before those `contiguous` are NULL_BLOCK, cached or not."""
        start = end = 0
        if self.enable_caching:
            run = 0
            # From the longest prefix down: the first run long enough is the longest hit.
            for i in range(len(hashes) - 1, -1, -1):
                if hashes[i] not in self._hash_to_block:
                    run = 0
                    continue
                run += 1
                if run >= contiguous or i == 0:
                    start, end = i, i + run
                    break
        self.queries += len(hashes)
        self.hits += end
        return [NULL_BLOCK] * start + [self._hash_to_block[h] for h in hashes[start:end]]

    def can_allocate(self, cached: Sequence[int], num_new: int) -> bool:
        """True when `cached` can be taken and `num_new` fresh blocks found."""
        reclaimed_from_free = sum(1 for b in cached if b in self._free)
        return self.num_free_blocks - reclaimed_from_free >= num_new

    def allocate(self, cached: Sequence[int], num_new: int) -> list[int]:
        """Takes the `cached` blocks and `num_new` fresh ones (freed blocks
        first, evicting the least recently freed; then blocks never used);
        the caller checked `can_allocate`."""
        for block in cached:
            self._ref_counts[block] += 1
            self._free.pop(block, None)
        fresh = []
        for _ in range(num_new):
            if self._free:
                block, _ = self._free.popitem(last=False)
                self._evict(block)
            else:
                block = self._next_unused
                self._next_unused += 1
            self._ref_counts[block] = 1
            fresh.append(block)
        return [*cached, *fresh]

    def release(self, blocks: Sequence[int]) -> None:
        """Drops one reference to each block; unreferenced ones become free
        (last in line for reuse, so their cached contents live longest)."""
        for block in reversed(blocks):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self._free[block] = None

    def register(self, block: int, block_hash: bytes) -> None:
        """Records that `block` holds the full block with `block_hash`."""
        if self.enable_caching and block_hash not in self._hash_to_block and self._block_hash[block] is None:
            self._hash_to_block[block_hash] = block
            self._block_hash[block] = block_hash

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block (blocks in use keep their contents but
        are no longer shared). Returns True."""
        self._hash_to_block.clear()
        self._block_hash = [None] * self.num_blocks
        return True

    def _evict(self, block: int) -> None:
        block_hash = self._block_hash[block]
        if block_hash is not None:
            self._block_hash[block] = None
            if self._hash_to_block.get(block_hash) == block:
                del self._hash_to_block[block_hash]


#: Computes a block's hash from its parent's hash and its token ids.
BlockHasher = Callable[[bytes | None, Sequence[int], str | None], bytes]
