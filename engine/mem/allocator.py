"""Token slot allocator for the paged KV buffers (page size 1).

Slots are ``1..size``; slot 0 is the reserved dummy that padded rows write to (the KV buffers hold
``size + 1`` slots). Allocation is all-or-nothing: ``alloc(n)`` returns n slots or None and then
takes nothing. Frees are batched: freed arrays are kept aside and merged on the next shortfall.
"""
from __future__ import annotations

import numpy as np

DUMMY_SLOT = 0


class TokenSlotAllocator:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        self._free = np.arange(1, self.size + 1, dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_n = 0

    def available_size(self) -> int:
        return len(self._free) + self._pending_n

    def alloc(self, n: int) -> np.ndarray | None:
        """n free slots (int64), or None — and nothing taken — when fewer than n are free."""
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        if n > len(self._free):
            if n > len(self._free) + self._pending_n:
                return None
            self._merge()
        out = self._free[:n]
        self._free = self._free[n:]
        return out

    def free(self, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        self._pending.append(np.asarray(slots, dtype=np.int64))
        self._pending_n += len(slots)

    def _merge(self) -> None:
        if self._pending:
            self._free = np.concatenate([self._free, *self._pending])
            self._pending = []
            self._pending_n = 0

    def check(self, in_use: np.ndarray | None = None) -> None:
        """Raise AssertionError when free slots are duplicated, out of range or the dummy slot;
        with ``in_use`` (slots held elsewhere), also when free + in_use is not exactly 1..size."""
        self._merge()
        free = self._free
        if len(free) and (free.min() < 1 or free.max() > self.size):
            raise AssertionError("free list holds a slot outside 1..size (slot 0 is reserved)")
        if len(np.unique(free)) != len(free):
            raise AssertionError("free list holds a slot twice (double free)")
        if in_use is not None:
            both = np.concatenate([free, np.asarray(in_use, dtype=np.int64)])
            if len(both) != self.size or not np.array_equal(np.sort(both),
                                                             np.arange(1, self.size + 1)):
                raise AssertionError(f"slot accounting broken: free={len(free)} + "
                                     f"cached={len(in_use)} != total={self.size}")
