"""Paged KV blocks and the prefix cache."""

from __future__ import annotations

from slokit.lab.sim.kv import KVCacheManager, chain_hashes


def test_same_prefix_gives_same_block_hashes_and_differs_after() -> None:
    a = chain_hashes(list(range(40)), 16, 0, 0)
    b = chain_hashes([*range(32), 99, 98, 97, 96, 95, 94, 93, 92], 16, 0, 0)
    assert len(a) == 2 and a == b[:2]
    c = chain_hashes([1000, *range(1, 40)], 16, 0, 0)
    assert c[0] != a[0] and c[1] != a[1]  # chained: a different first block changes all


def test_freed_blocks_stay_cached_until_reused() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    hashes = chain_hashes(list(range(8)), 4, 0, 0)
    held: list[int] = []
    assert kv.allocate(held, [], 8)
    kv.cache_blocks(held, hashes, 0)
    kv.free(list(held))
    assert kv.usage == 0.0
    assert kv.lookup(hashes, 2) == held


def test_allocation_evicts_least_recently_freed_cached_blocks_first() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    old, new = chain_hashes(list(range(8)), 4, 0, 0), chain_hashes(list(range(50, 58)), 4, 0, 0)
    a: list[int] = []
    b: list[int] = []
    kv.allocate(a, [], 8)
    kv.cache_blocks(a, old, 0)
    kv.allocate(b, [], 8)
    kv.cache_blocks(b, new, 0)
    kv.free(a)
    kv.free(b)
    c: list[int] = []
    assert kv.allocate(c, [], 8)  # takes the two blocks freed first (those of `old`)
    assert kv.lookup(old, 2) == []
    assert len(kv.lookup(new, 2)) == 2


def test_allocation_fails_without_side_effects_when_pool_is_short() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    held: list[int] = []
    assert not kv.allocate(held, [], 12)
    assert held == [] and kv.num_free == 2


def test_shrink_holds_back_capacity() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    kv.shrink_to(3)
    held: list[int] = []
    assert not kv.allocate(held, [], 16)
    assert kv.allocate(held, [], 12)
    assert kv.usage == 1.0
