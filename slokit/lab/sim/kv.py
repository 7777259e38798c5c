"""Paged KV blocks with a prefix cache, shaped like vLLM V1's KVCacheManager.

* The pool has ``num_blocks`` blocks of ``block_size`` tokens. A request holds a list of
  blocks; blocks can be shared (reference counted) when prompts share a prefix.
* Every *full* block gets a hash chained on its parent's hash and its token ids, so two
  prompts with the same first ``k * block_size`` tokens map to the same ``k`` blocks.
* Freed blocks go to the tail of a free queue but keep their hash: they stay reusable as
  prefix-cache hits until a new allocation takes them from the head (LRU eviction).
  A request frees its blocks tail first so its last blocks are evicted first.
* ``usage`` is ``1 - free / capacity`` (vLLM's ``kv_cache_usage_perc``): cached but
  unreferenced blocks count as free.
* ``shrink_to(n)`` models a KV pool that lost capacity at run time: ``capacity - n``
  free blocks are held back; allocations fail (and the scheduler preempts) until enough
  blocks are free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def chain_hashes(token_ids: Sequence[int], block_size: int, start: int, parent: int) -> list[int]:
    """Hashes of the full blocks of ``token_ids`` from block index ``start`` on.

    ``parent`` is the hash of block ``start - 1`` (0 for the first block)."""
    out: list[int] = []
    h = parent
    n_full = len(token_ids) // block_size
    for b in range(start, n_full):
        h = hash((h, tuple(token_ids[b * block_size : (b + 1) * block_size])))
        out.append(h)
    return out


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.capacity = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    # ---- capacity -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation may take now (free, possibly holding evictable cache)."""
        return max(0, len(self._free) - (self.num_blocks - self.capacity))

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.capacity

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self._free)

    def shrink_to(self, capacity: int) -> None:
        """Limit the pool to ``capacity`` blocks (at most the physical ``num_blocks``)."""
        self.capacity = max(1, min(capacity, self.num_blocks))

    # ---- prefix cache ---------------------------------------------------------------
    def lookup(self, block_hashes: Sequence[int], max_blocks: int) -> list[int]:
        """The longest run of cached blocks matching ``block_hashes`` (at most ``max_blocks``)."""
        if not self.enable_prefix_caching:
            return []
        hit: list[int] = []
        for h in block_hashes[:max_blocks]:
            b = self._cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def cache_blocks(self, blocks: Sequence[int], block_hashes: Sequence[int], start: int) -> None:
        """Register the hashes of ``blocks[start:len(block_hashes)]`` (now full and computed)."""
        if not self.enable_prefix_caching:
            return
        for i in range(start, min(len(block_hashes), len(blocks))):
            b = blocks[i]
            if self._hash[b] is not None:
                continue
            h = block_hashes[i]
            if h in self._cached:  # identical content already cached under another block
                continue
            self._hash[b] = h
            self._cached[h] = b

    # ---- allocation -----------------------------------------------------------------
    def allocate(self, held: list[int], hit: Sequence[int], num_tokens_total: int) -> bool:
        """Grow ``held`` (in place) so it covers ``num_tokens_total`` tokens, first taking
        the prefix-cache ``hit`` blocks. Returns False, changing nothing, when the pool is short."""
        need = -(-num_tokens_total // self.block_size) - len(held) - len(hit)
        touched_free = sum(1 for b in hit if self._ref[b] == 0)
        if need > self.num_free - touched_free:
            return False
        for b in hit:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            held.append(b)
        for _ in range(max(0, need)):
            b, _unused = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                self._hash[b] = None
                if self._cached.get(h) == b:
                    del self._cached[h]
            self._ref[b] = 1
            held.append(b)
        return True

    def free(self, held: list[int]) -> None:
        """Release a request's blocks, tail first, keeping their cache entries."""
        for b in reversed(held):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
        held.clear()

    def reset_prefix_cache(self) -> None:
        for h, b in list(self._cached.items()):
            if self._ref[b] == 0:
                self._hash[b] = None
                del self._cached[h]
