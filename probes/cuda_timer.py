"""CUDA-event device timers for stages that run on the GPU.

Imports cleanly without torch or CUDA. ``DeviceTimer.measure(key)`` brackets work with two CUDA
events on the current stream; ``collect()`` resolves finished pairs into device nanoseconds
without blocking (``synchronize=True`` waits). Off CUDA every call is a no-op and results are empty.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class DeviceTimer:
    """Pairs of CUDA events keyed by a caller's id (e.g. a step number and stage name)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = cuda_available() if enabled is None else (enabled and cuda_available())
        self._pending: list[tuple[Any, Any, Any]] = []
        self.results: dict[Any, int] = {}

    @contextmanager
    def measure(self, key: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._pending.append((key, start, end))

    def collect(self, synchronize: bool = False) -> dict[Any, int]:
        """Move finished measurements into ``results`` (ns) and return the newly finished ones."""
        done: dict[Any, int] = {}
        still: list[tuple[Any, Any, Any]] = []
        for key, start, end in self._pending:
            if synchronize:
                end.synchronize()
            if end.query():
                done[key] = int(round(start.elapsed_time(end) * 1e6))  # ms -> ns
            else:
                still.append((key, start, end))
        self._pending = still
        self.results.update(done)
        return done
