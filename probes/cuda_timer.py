"""CUDA-event device timers for stages that run on the GPU — the one timer of the engine's runner
(``run.eager`` / ``run.graph_replay``) and of its collectives (``comm.all_reduce``).

Imports cleanly without torch or CUDA. ``DeviceTimer.measure(key, attrs)`` brackets work with two
CUDA events on the current stream; ``collect()`` resolves finished pairs into device nanoseconds
without blocking (``synchronize=True`` waits): a ``key`` lands in ``results``, an ``attrs`` dict
(e.g. a recorded probe span's attributes) gets ``attrs["device_ns"]``. Off CUDA (or disabled)
``measure`` returns a shared no-op context and nothing is pending.
"""
from __future__ import annotations

from typing import Any


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class _NullCtx:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _NullCtx()


class _EventPair:
    """Records a start event on enter and an end event on exit (current stream), then queues both."""

    __slots__ = ("timer", "key", "attrs", "start")

    def __init__(self, timer: DeviceTimer, key: Any, attrs: dict[str, Any] | None) -> None:
        self.timer, self.key, self.attrs = timer, key, attrs

    def __enter__(self) -> None:
        import torch

        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def __exit__(self, *exc: object) -> None:
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.timer._pending.append((self.key, self.attrs, self.start, end))


class DeviceTimer:
    """Pairs of CUDA events keyed by a caller's id and/or a dict to receive ``device_ns``.

    ``enabled``: None = whether CUDA is available; False keeps every call a no-op (a CPU worker).
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = cuda_available() if enabled is None else (enabled and cuda_available())
        self._pending: list[tuple[Any, dict[str, Any] | None, Any, Any]] = []
        self.results: dict[Any, int] = {}   # key -> device ns (measurements given a key)

    @property
    def pending(self) -> int:
        """Measurements recorded but not yet resolved."""
        return len(self._pending)

    def measure(self, key: Any = None, attrs: dict[str, Any] | None = None) -> Any:
        """Context manager timing its body on the device. With neither ``key`` nor ``attrs`` there is
        nowhere to report, so nothing is recorded."""
        if not self.enabled or (key is None and attrs is None):
            return _NULL
        return _EventPair(self, key, attrs)

    def collect(self, synchronize: bool = False) -> dict[Any, int]:
        """Resolve finished measurements: fill ``attrs["device_ns"]`` and ``results[key]`` (ns).
        Returns the newly finished keyed ones; never blocks unless ``synchronize``."""
        done: dict[Any, int] = {}
        if not self._pending:
            return done
        still = []
        for item in self._pending:
            key, attrs, start, end = item
            if synchronize:
                end.synchronize()
            if not end.query():
                still.append(item)
                continue
            ns = int(round(start.elapsed_time(end) * 1e6))   # ms -> ns
            if attrs is not None:
                attrs["device_ns"] = ns
            if key is not None:
                done[key] = ns
        self._pending = still
        self.results.update(done)
        return done
