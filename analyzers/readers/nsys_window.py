"""A time window's read of an nsys export: the rows of the big tables overlapping [lo, hi), and the
facts about the whole tables that the Timeline's metadata is built from.

A windowed read (``read_nsys(path, window=(lo, hi))``) gives the Timeline that
``analyzers.diagnose.crop`` gives of the whole read: the same metadata (processes, ranks, devices,
warnings, categories of the name columns), the rows overlapping the window clipped to it, in the same
order. The big tables are still scanned whole (an nsys export has no index on time), but only the
window's rows are kept: memory follows the window, not the file. What the metadata needs of the
rows outside the window is counted batch by batch (``Seen``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: a tracked value per row of a batch, from the batch's columns (one per fetched expression)
Track = Callable[[list[np.ndarray]], np.ndarray]


@dataclass
class Seen:
    """What one table holds in full: rows, earliest start and latest end (ns), and per tracked
    key the count of each distinct value (pids, devices, name ids, ...)."""

    rows: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    counts: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, start: np.ndarray, end: np.ndarray, tracked: dict[str, np.ndarray]) -> None:
        if not len(start):
            return
        self.rows += len(start)
        lo, hi = int(start.min()), int(end.max())
        self.first_ns = lo if self.first_ns is None else min(self.first_ns, lo)
        self.last_ns = hi if self.last_ns is None else max(self.last_ns, hi)
        for k, v in tracked.items():
            codes, uniq = pd.factorize(v, sort=False)
            n = np.bincount(codes, minlength=len(uniq))
            into = self.counts.setdefault(k, {})
            for u, c in zip(np.asarray(uniq).tolist(), n.tolist()):
                into[int(u)] = into.get(int(u), 0) + int(c)

    def values(self, key: str) -> np.ndarray:
        """The distinct values of ``key`` over the whole table (sorted int64)."""
        return np.asarray(sorted(self.counts.get(key, {})), np.int64)

    def count(self, key: str, value: int) -> int:
        return self.counts.get(key, {}).get(value, 0)


class Window:
    """The window [lo, hi) (ns, the export's clock) and what each scanned table holds in full."""

    def __init__(self, lo_ns: int, hi_ns: int, expect_rows: int | None = None) -> None:
        self.ranges_rows = 0                    # the whole NVTX table's ranges, their span (ns)
        self.ranges_span: tuple[int, int] | None = None
        if hi_ns <= lo_ns:
            raise ValueError(f"empty time window [{lo_ns}, {hi_ns}) ns")
        self.lo, self.hi = int(lo_ns), int(hi_ns)
        self.expect_rows = expect_rows          # rows a table's window is allocated for first
        self.seen: dict[str, Seen] = {}

    def keep(self, table: str, track: dict[str, Track]) -> Callable[[list[np.ndarray]], np.ndarray]:
        """``fetch_ints``'s ``keep`` for ``table`` (its first two expressions: start, end): counts
        every row into ``seen[table]``, keeps those overlapping the window."""
        seen = self.seen.setdefault(table, Seen())

        def keep(cols: list[np.ndarray]) -> np.ndarray:
            s, e = cols[0], cols[1]
            seen.add(s, e, {k: f(cols) for k, f in track.items()})
            return (e > self.lo) & (s < self.hi)

        return keep

    def clip(self, cols: dict | None) -> dict | None:
        """Start and end clipped to the window (after the sort by start, as ``crop`` clips)."""
        if cols is not None and len(cols["start_ns"]):
            cols["start_ns"] = np.maximum(cols["start_ns"], self.lo)
            cols["end_ns"] = np.minimum(cols["end_ns"], self.hi)
        return cols


def crop_columns(cols: dict | None, lo: int, hi: int) -> dict | None:
    """The rows of a column table overlapping [lo, hi), clipped to it (``crop`` on columns)."""
    if cols is None or not len(cols["start_ns"]):
        return cols
    m = (cols["end_ns"] > lo) & (cols["start_ns"] < hi)
    out = {k: v[m] for k, v in cols.items()}
    out["start_ns"] = np.maximum(out["start_ns"], lo)
    out["end_ns"] = np.minimum(out["end_ns"], hi)
    return out


#: the device tables of an export, with the kind of their rows
DEVICE_TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL": "kernel", "CUPTI_ACTIVITY_KIND_MEMCPY": "memcpy",
                 "CUPTI_ACTIVITY_KIND_MEMSET": "memset", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": "graph"}
API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API")


@dataclass
class Facts:
    """What the metadata of a read is built from, about the whole file whatever the window:
    row counts, processes (with device rows, with API rows), devices used, the device rows' first
    start and last end, rows per device kind (``DeviceKind`` values), CUDA graph launches, device
    rows that are graph nodes, and the (first start, last end) of each non-empty table class."""

    n_dev: int
    n_api: int
    n_rng: int
    dev_pids: list[int]
    api_pids: list[int]
    devices: set[int]
    dev_first: int | None
    dev_last: int | None
    kinds: dict[str, int]
    graph_launches: int
    node_rows: int
    spans: list[tuple[int, int]]


def _union(seen: list[Seen], key: str) -> list[int]:
    return sorted({int(v) for s in seen for v in s.counts.get(key, {})})


def window_facts(w: Window, ranges_rows: int, ranges_span: tuple[int, int] | None,
                 graph_launch_rows: Callable[[dict[int, int]], int]) -> Facts:
    """``Facts`` of a windowed read from what its scans counted (``w.seen``); ``ranges_*``: the
    whole NVTX table's; ``graph_launch_rows(counts by name id)``: the rows of CUDA graph launches."""
    dev = [w.seen[t] for t in DEVICE_TABLES if t in w.seen and w.seen[t].rows]
    api = [w.seen[t] for t in API_TABLES if t in w.seen and w.seen[t].rows]
    spans = [(min(int(s.first_ns) for s in part if s.first_ns is not None),
              max(int(s.last_ns) for s in part if s.last_ns is not None)) for part in (dev, api) if part]
    if ranges_span is not None:
        spans.append(ranges_span)
    rt = w.seen.get(API_TABLES[0])
    return Facts(
        n_dev=sum(s.rows for s in dev), n_api=sum(s.rows for s in api), n_rng=ranges_rows,
        dev_pids=_union(dev, "pid"), api_pids=_union(api, "pid"), devices=set(_union(dev, "device")),
        dev_first=spans[0][0] if dev else None, dev_last=spans[0][1] if dev else None,
        kinds={k: w.seen[t].rows for t, k in DEVICE_TABLES.items() if t in w.seen},
        graph_launches=graph_launch_rows(rt.counts.get("name", {})) if rt is not None else 0,
        node_rows=sum(s.count("node", 1) for s in dev), spans=spans)
