"""ReqToTokenPool: one row per resident request mapping token position -> KV slot.

Two copies of the table, each with one writer:
- ``cpu`` (numpy int32 [size, context_length]) — written by the scheduler when it allocates slots
  or re-points a row at shared cached slots; the scheduler reads only this copy.
- ``table`` (torch int32, on the worker's device) — what the attention kernels read
  (``ForwardBatch.req_to_token``). It is written in stream order right before each forward
  (see ``write_device``), so the overlap loop never rewrites entries a running forward reads.
"""
from __future__ import annotations

import numpy as np
import torch


class ReqToTokenPool:
    def __init__(self, size: int, context_length: int, device: str | torch.device = "cpu") -> None:
        if size < 1 or context_length < 1:
            raise ValueError(f"size and context_length must be >= 1, got {size}, {context_length}")
        self.size = size
        self.context_length = context_length
        self.cpu = np.zeros((size, context_length), dtype=np.int32)
        self.table = torch.zeros((size, context_length), dtype=torch.int32, device=device)
        self._free: list[int] = list(range(size - 1, -1, -1))   # pop() hands out row 0 first
        # CPU writes not yet applied to the device table: (rows, cols, slots) int64 arrays
        self._dirty: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """One free row, or None when all rows are taken."""
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        if not 0 <= row < self.size:
            raise ValueError(f"row {row} out of range [0, {self.size})")
        self._free.append(row)

    def slots(self, row: int, start: int, end: int) -> np.ndarray:
        """KV slots of positions [start, end) of a row (a copy, int64)."""
        return self.cpu[row, start:end].astype(np.int64)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        """Point positions [start, start + len(slots)) of a row at ``slots`` (CPU copy now, the
        device copy at the next ``take_dirty``/``write_device``)."""
        n = len(slots)
        if n == 0:
            return
        self.cpu[row, start:start + n] = slots
        self._dirty.append((np.full(n, row, dtype=np.int64),
                            np.arange(start, start + n, dtype=np.int64),
                            np.asarray(slots, dtype=np.int64)))

    def write_many(self, rows: np.ndarray, cols: np.ndarray, slots: np.ndarray) -> None:
        """``cpu[rows[i], cols[i]] = slots[i]`` (one entry per request, e.g. a decode step)."""
        self.cpu[rows, cols] = slots
        self._dirty.append((rows, cols, np.asarray(slots, dtype=np.int64)))

    def take_dirty(self, device: torch.device | str) -> tuple[torch.Tensor, ...] | None:
        """The pending device writes as one (rows, cols, slots) tensor triple, or None."""
        if not self._dirty:
            return None
        if len(self._dirty) == 1:
            rows, cols, slots = self._dirty[0]
            packed = np.stack([rows, cols, slots])
        else:
            packed = np.concatenate([np.stack(d) for d in self._dirty], axis=1)
        self._dirty = []
        t = torch.from_numpy(packed).to(device, non_blocking=True)
        return t[0], t[1], t[2]

    def write_device(self, writes: tuple[torch.Tensor, ...] | None) -> None:
        """Apply writes from ``take_dirty`` to the device table — in stream order, right before
        the forward that needs them (so a forward still running never sees them change)."""
        if writes is not None:
            rows, cols, slots = writes
            self.table[rows, cols] = slots.to(torch.int32)

    def check_all_free(self) -> None:
        if sorted(self._free) != list(range(self.size)):
            held = sorted(set(range(self.size)) - set(self._free))
            raise AssertionError(f"request rows still held: {held[:10]}")
