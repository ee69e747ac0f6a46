"""ChunkCache: the prefix cache switched off (``disable_radix_cache``).

Same hooks as RadixCache, but nothing is shared: a prefix never matches, a finished request's
slots go straight back to the allocator, and a chunked request simply keeps its own slots.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.radix_cache import MatchResult
from srtscope.engine.mem.req_to_token import ReqToTokenPool

if TYPE_CHECKING:
    from srtscope.engine.request import Req

_EMPTY = np.zeros(0, dtype=np.int64)


class ChunkCache:
    enabled = False

    def __init__(self, allocator: TokenSlotAllocator, req_to_token: ReqToTokenPool) -> None:
        self.allocator = allocator
        self.req_to_token = req_to_token

    def reset(self) -> None:
        return None

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def match_prefix(self, key: Sequence[int] | np.ndarray) -> MatchResult:
        return MatchResult(_EMPTY, None)

    def insert(self, key: Sequence[int] | np.ndarray, value: np.ndarray) -> int:
        return 0

    def inc_lock_ref(self, node: object) -> None:
        return None

    def dec_lock_ref(self, node: object) -> None:
        return None

    def evict(self, num_tokens: int) -> int:
        return 0

    def all_values(self) -> np.ndarray:
        return _EMPTY

    def locked_nodes(self) -> list:
        return []

    def cache_finished_req(self, req: Req) -> None:
        self.release_req(req)

    def cache_unfinished_req(self, req: Req) -> None:
        req.prefix_len = req.kv_len

    def release_req(self, req: Req) -> None:
        row = req.req_pool_idx
        if row is None:
            return
        self.allocator.free(self.req_to_token.slots(row, 0, req.kv_len))
        self.req_to_token.free(row)
        req.req_pool_idx = None
        req.last_node = None
