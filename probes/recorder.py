"""The in-process recorder: spans and counter samples, appended cheaply, materialised on demand.

Times are integer nanoseconds from ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux — the clock
Nsight Systems and the CUDA driver timestamps are converted to). ``wall_offset_ns`` in the metadata
converts them to Unix time.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One closed range. ``depth`` 0 is outermost on its thread; attrs keep their Python types."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    rank: int
    depth: int
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class CounterRecord:
    """One sample of a counter track (e.g. ``gpu.util_pct`` of device 0)."""

    name: str
    t_ns: int
    value: float
    device: int = 0


class Recorder:
    """Collects spans and counters from any thread.

    NOTE: appends go to plain lists (atomic under the GIL); readers take a snapshot copy, so
    exporting while other threads record is safe.
    """

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank = rank
        self.world_size = world_size
        self.pid = os.getpid()
        self.meta: dict[str, Any] = {}
        # flat, 6 slots per span: name, start_ns, end_ns, tid, depth, attrs-or-None
        # NOTE: flat because a per-span tuple holding a dict stays tracked by Python's GC forever, and
        # every collection then rescans a long run's millions of spans (measured: 0.5 us per span).
        # A flat list of scalars and untracked dicts adds nothing for the GC to scan.
        self._spans: list = []
        # (name, t_ns, value, device)
        self._counters: list[tuple] = []
        self._lock = threading.Lock()

    # -- recording ---------------------------------------------------------------------------
    def add_span(self, name: str, start_ns: int, end_ns: int, tid: int, depth: int = 0,
                 attrs: dict[str, Any] | None = None) -> None:
        self._spans.extend((name, start_ns, end_ns, tid, depth, attrs or None))

    def add_counter(self, name: str, t_ns: int, value: float, device: int = 0) -> None:
        self._counters.append((name, t_ns, float(value), device))

    def clear(self) -> None:
        with self._lock:
            self._spans = []
            self._counters = []

    # -- reading -----------------------------------------------------------------------------
    def raw_spans(self) -> list[tuple]:
        """Snapshot, in recording order: (name, start_ns, end_ns, tid, depth, attrs dict or None)."""
        flat = self._spans[:]  # NOTE: one extend per span is atomic under the GIL: whole spans only
        it = iter(flat)
        return list(zip(it, it, it, it, it, it))

    def raw_counters(self) -> list[tuple]:
        return list(self._counters)

    def row_count(self) -> int:
        """Spans and counters recorded so far (cheap: what a flusher polls)."""
        return len(self._spans) // 6 + len(self._counters)

    def raw_since(self, span_pos: int, counter_pos: int) -> tuple[list[tuple], list[tuple], int, int]:
        """The spans and counters recorded after the first ``span_pos`` spans and ``counter_pos``
        counters, in recording order, and the positions after them (an incremental writer's
        cursor: O(new rows), not O(all)). A position past the end (the recorder was cleared since)
        starts from 0."""
        flat, counters = self._spans, self._counters
        n_span, n_counter = len(flat) // 6, len(counters)
        span_pos = span_pos if span_pos <= n_span else 0
        counter_pos = counter_pos if counter_pos <= n_counter else 0
        it = iter(flat[span_pos * 6:n_span * 6])
        return (list(zip(it, it, it, it, it, it)), counters[counter_pos:n_counter], n_span, n_counter)

    def spans(self) -> list[SpanRecord]:
        """Closed spans sorted by start time (ties: outer first)."""
        out = [SpanRecord(n, s, e, self.pid, t, self.rank, d, dict(a) if a else {})
               for (n, s, e, t, d, a) in self.raw_spans()]
        out.sort(key=lambda r: (r.start_ns, r.depth))
        return out

    def counters(self) -> list[CounterRecord]:
        out = [CounterRecord(n, t, v, d) for (n, t, v, d) in self.raw_counters()]
        out.sort(key=lambda c: c.t_ns)
        return out

    def metadata(self) -> dict[str, Any]:
        """Process-level metadata written with every export."""
        return {
            "host": socket.gethostname(),
            "pid": self.pid,
            "rank": self.rank,
            "world_size": self.world_size,
            "clock": "perf_counter_ns",
            "wall_offset_ns": time.time_ns() - time.perf_counter_ns(),
            **self.meta,
        }


_DEFAULT = Recorder()


def get_recorder() -> Recorder:
    """The process-wide recorder that ``stage()`` writes to."""
    return _DEFAULT


def set_recorder(recorder: Recorder) -> Recorder:
    """Replace the process-wide recorder (e.g. one per TP rank process); returns the old one."""
    global _DEFAULT
    old, _DEFAULT = _DEFAULT, recorder
    return old
