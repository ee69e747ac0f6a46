"""Waiting-queue ordering: fcfs (arrival order) and lpm (longest cached prefix first).

NOTE: lpm matches every waiting request against the tree, so on long queues it falls back to fcfs
(like SGLang) — the ordering then costs O(n log n) comparisons instead of n tree walks.
"""
from __future__ import annotations

import numpy as np

from srtscope.engine.request import Req

LPM_MAX_QUEUE = 128


def sort_waiting(policy: str, waiting: list[Req], tree_cache) -> str:
    """Order ``waiting`` in place for admission; returns the policy actually applied."""
    if policy == "lpm" and tree_cache.enabled and len(waiting) <= LPM_MAX_QUEUE:
        lens = {id(r): tree_cache.match_prefix(r.fill_ids[:-1]).length for r in waiting}
        waiting.sort(key=lambda r: (-lens[id(r)], r.order))
        return "lpm"
    if policy not in ("fcfs", "lpm"):
        raise ValueError(f"schedule_policy: unknown policy {policy!r} (fcfs, lpm)")
    waiting.sort(key=lambda r: r.order)
    return "fcfs"


#: a waiting request sharing at least this many uncached tokens with one admitted in the same
#: round waits a round, so that it reuses that prefix instead of computing it again
IN_BATCH_PREFIX_TOKENS = 32


class InBatchPrefixFilter:
    """lpm's in-batch prefix check: defer requests whose uncached prefix another request of this
    admission round is about to compute (they hit the cache one round later)."""

    def __init__(self, tree_cache, threshold: int = IN_BATCH_PREFIX_TOKENS) -> None:
        from srtscope.engine.mem.allocator import TokenSlotAllocator
        from srtscope.engine.mem.radix_cache import RadixCache

        self.tree_cache = tree_cache
        self.threshold = threshold
        # keys only, values unused: no req-to-token pool
        self._trie = RadixCache(TokenSlotAllocator(1), None)  # type: ignore[arg-type]

    def should_defer(self, req: Req) -> bool:
        key = req.fill_ids[:-1]
        if self.tree_cache.match_prefix(key).length >= self.threshold:
            return False
        if self._trie.match_prefix(key).length >= self.threshold:
            return True
        self._trie.insert(key, np.zeros(len(key), dtype=np.int64))
        return False
