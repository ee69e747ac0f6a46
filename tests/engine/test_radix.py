"""RadixCache: prefix match with node splits, insert, lock counts, LRU eviction; ChunkCache."""
from __future__ import annotations

import numpy as np
import pytest

from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.chunk_cache import ChunkCache
from srtscope.engine.mem.radix_cache import RadixCache
from srtscope.engine.mem.req_to_token import ReqToTokenPool
from srtscope.engine.request import Req, SamplingParams


def make(size: int = 64):
    a = TokenSlotAllocator(size)
    return RadixCache(a, ReqToTokenPool(4, 64)), a


def put(tree: RadixCache, a: TokenSlotAllocator, key: list[int]) -> np.ndarray:
    slots = a.alloc(len(key))
    dup = tree.insert(key, slots)
    a.free(slots[:dup])
    return slots


def test_match_splits_node_on_partial_hit():
    tree, a = make()
    slots = put(tree, a, [1, 2, 3, 4, 5])
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.length == 3 and m.indices.tolist() == slots[:3].tolist()
    assert len(m.last_node.key) == 3                    # the node was split at the hit
    assert [len(c.key) for c in m.last_node.children.values()] == [2]
    assert tree.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert tree.match_prefix([7]).length == 0
    assert tree.total_size() == 5


def test_insert_returns_cached_prefix_len():
    tree, a = make()
    put(tree, a, [1, 2, 3])
    slots = a.alloc(5)
    assert tree.insert([1, 2, 3, 4, 5], slots) == 3
    assert tree.insert([1, 2], slots[:2]) == 2
    assert tree.evictable_size() == 5


def test_lock_walks_to_root_and_protects_from_eviction():
    tree, a = make(16)
    put(tree, a, [1, 2, 3, 4])
    put(tree, a, [1, 2, 7, 8])
    leaf = tree.match_prefix([1, 2, 3, 4]).last_node
    tree.inc_lock_ref(leaf)
    assert leaf.parent.lock_ref == 1                    # the shared [1, 2] is locked too
    assert (tree.protected_size(), tree.evictable_size()) == (4, 2)
    assert tree.evict(100) == 2                         # only the unlocked [7, 8] leaf goes
    assert tree.match_prefix([1, 2, 3, 4]).length == 4
    assert tree.match_prefix([1, 2, 7, 8]).length == 2
    tree.dec_lock_ref(leaf)
    assert (tree.protected_size(), tree.evictable_size()) == (0, 4)
    with pytest.raises(AssertionError, match="unbalanced"):
        tree.dec_lock_ref(leaf)


def test_lru_order_of_eviction():
    tree, a = make(32)
    for first in (10, 20, 30):
        put(tree, a, [first, first + 1, first + 2])
    tree.match_prefix([10, 11])                          # touch 10: now 20 is the oldest
    assert tree.evict(1) == 3                            # 20 goes first
    assert tree.evict(1) == 3                            # then 30 (10 was used more recently)
    assert tree.match_prefix([20]).length == 0 and tree.match_prefix([30]).length == 0
    assert tree.match_prefix([10, 11, 12]).length == 3


def test_eviction_frees_parents_that_become_leaves():
    tree, a = make(16)
    put(tree, a, [1, 2, 3])
    put(tree, a, [1, 2, 4])
    assert a.available_size() == 16 - 4
    assert tree.evict(4) == 4
    assert tree.total_size() == 0 and a.available_size() == 16
    a.check(in_use=tree.all_values())


def _resident(tree, a, ids, outputs):
    req = Req(list(ids), SamplingParams(max_new_tokens=8))
    req.output_ids = list(outputs)
    req.req_pool_idx = tree.req_to_token.alloc()
    req.kv_len = len(ids) + len(outputs) - 1
    tree.req_to_token.write(req.req_pool_idx, 0, a.alloc(req.kv_len))
    return req


def test_cache_finished_req_dedups_and_frees_row():
    tree, a = make(32)
    put(tree, a, [1, 2, 3])
    req = _resident(tree, a, [1, 2, 3, 4], [5, 6])       # kv for 1,2,3,4,5; 6 has no KV
    tree.cache_finished_req(req)
    assert tree.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert tree.total_size() == 5
    a.check(in_use=tree.all_values())                    # the duplicate [1,2,3] slots were freed
    tree.req_to_token.check_all_free()


def test_cache_unfinished_req_moves_lock_and_repoints_row():
    tree, a = make(32)
    shared = put(tree, a, [1, 2, 3])
    req = _resident(tree, a, [1, 2, 3, 4, 5], [9])       # computed [1..5] privately
    tree.cache_unfinished_req(req)
    assert req.prefix_len == 5 and req.last_node.lock_ref == 1
    assert tree.req_to_token.cpu[req.req_pool_idx, :3].tolist() == shared.tolist()
    assert tree.protected_size() == 5
    tree.cache_finished_req(req)
    assert tree.protected_size() == 0 and tree.evictable_size() == 5
    a.check(in_use=tree.all_values())


def test_chunk_cache_shares_nothing():
    a = TokenSlotAllocator(16)
    cache = ChunkCache(a, ReqToTokenPool(2, 32))
    req = Req([1, 2, 3], SamplingParams())
    req.output_ids = [4]
    req.req_pool_idx = cache.req_to_token.alloc()
    req.kv_len = 3
    cache.req_to_token.write(req.req_pool_idx, 0, a.alloc(3))
    assert cache.match_prefix([1, 2, 3]).length == 0
    cache.cache_finished_req(req)
    assert a.available_size() == 16 and cache.evictable_size() == 0
