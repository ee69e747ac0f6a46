"""Which time window of an nsys export fits a memory budget, and which holds given steps.

Planned before the big tables are read: the steps come from the NVTX table alone (read whole; it is
small next to the kernels), with the step finder ``diagnose`` uses; the rows a window would hold
come from a sample of each big table (``SAMPLE_ROWS`` rows at evenly spaced rowids, looked up by
rowid: milliseconds, no scan). The window then read is exact (``read_nsys(window=...)``); only its
size is planned from the sample.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import SourceFormat, Timeline, TimelineMeta, empty_table
from srtscope.analyzers.readers.memory_estimate import WINDOWED_TABLES, MemoryEstimate
from srtscope.analyzers.readers.nsys_sqlite import read_ranges
from srtscope.analyzers.readers.nsys_tables import connect_readonly

SAMPLE_ROWS = 2048
_MASK24 = 0xFFFFFF


@dataclass(frozen=True)
class Sample:
    """Rows of one table at evenly spaced rowids: start, end (ns), process id; ``rows``: the
    table's rowid span (each sampled row stands for ``rows / len(start)`` rows)."""

    rows: int
    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray


def sample_tables(path: Path, est: MemoryEstimate, n: int = SAMPLE_ROWS) -> list[Sample]:
    """A ``Sample`` of each non-empty big table of ``path`` (``MemoryEstimate.rows`` its spans)."""
    from srtscope.analyzers.readers.columnar import rowid_bounds

    con = connect_readonly(path)
    out = []
    try:
        for t in WINDOWED_TABLES:
            if not est.rows.get(t):
                continue
            lo, hi = rowid_bounds(con, t)
            if lo is None or hi is None:
                continue
            ids = np.unique(np.linspace(lo, hi, min(n, hi - lo + 1)).astype(np.int64)).tolist()
            pid_col = "globalTid" if t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API") else "globalPid"
            got: list[tuple] = []
            for i in range(0, len(ids), 900):
                part = ids[i:i + 900]
                got += con.execute(f"SELECT start, end, COALESCE({pid_col}, 0) FROM {t} WHERE rowid IN "
                                   f"({','.join('?' * len(part))}) AND start IS NOT NULL AND end IS NOT NULL",
                                   part).fetchall()
            if got:
                a = np.asarray(got, dtype=np.int64)
                out.append(Sample(est.rows[t], a[:, 0], a[:, 1], (a[:, 2] >> 24) & _MASK24))
    finally:
        con.close()
    return out


def rows_in(samples: list[Sample], lo: int, hi: int) -> float:
    """Estimated rows of the big tables overlapping [lo, hi) ns."""
    total = 0.0
    for s in samples:
        hit = int(((s.end > lo) & (s.start < hi)).sum())
        total += s.rows * hit / len(s.start)
    return total


def device_pids(samples: list[Sample], est: MemoryEstimate) -> list[int]:
    """The processes with device rows, as the sample sees them (ranks are given in their order)."""
    dev = [s for s, t in zip(samples, [t for t in WINDOWED_TABLES if est.rows.get(t)])
           if not t.endswith(("RUNTIME", "OSRT_API"))]
    return sorted({int(p) for s in dev for p in s.pid.tolist()})


def preview(path: Path, rank: int, pids: list[int]) -> Timeline:
    """A Timeline of the export's NVTX ranges alone (no device or API rows): what its steps are."""
    meta = TimelineMeta(format=SourceFormat.NSYS_SQLITE, sources=[str(path)])
    return Timeline(empty_table("device"), empty_table("api"), read_ranges(path, rank, pids),
                    empty_table("counters"), meta)


def span_of(samples: list[Sample], steps: pd.DataFrame) -> tuple[int, int] | None:
    """(first start, last end) of the sampled rows and the steps; None when there is nothing."""
    los = [int(s.start.min()) for s in samples] + ([int(steps["start_ns"].min())] if len(steps) else [])
    his = [int(s.end.max()) for s in samples] + ([int(steps["end_ns"].max())] if len(steps) else [])
    return (min(los), max(his)) if los else None


def middle_steps(steps: pd.DataFrame, samples: list[Sample], max_rows: float) -> pd.DataFrame:
    """The longest run of consecutive steps around the middle of the capture whose window holds at
    most ``max_rows`` rows (the steps of the rank with the most of them; ``steps`` as
    ``find_steps`` gives them); empty when not even one step fits."""
    by_rank = steps.groupby("rank").size()
    st = steps[steps["rank"] == by_rank.idxmax()].sort_values("start_ns", ignore_index=True)
    n = len(st)
    s, e = st["start_ns"].to_numpy(), st["end_ns"].to_numpy()

    def fits(k: int) -> bool:
        a = (n - k) // 2
        return rows_in(samples, int(s[a]), int(e[a:a + k].max())) <= max_rows

    lo, hi = 0, n                      # the most steps that fit, by bisection (rows grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    a = (n - lo) // 2
    return st.iloc[a:a + lo]


def middle_time(span: tuple[int, int], samples: list[Sample], max_rows: float) -> tuple[int, int] | None:
    """The widest window around the middle of ``span`` holding at most ``max_rows`` rows; None
    when not even a millionth of the span fits."""
    a, b = span
    mid = (a + b) // 2
    lo, hi = 0.0, 1.0
    if rows_in(samples, a, b + 1) <= max_rows:
        return a, b + 1
    for _ in range(40):
        f = (lo + hi) / 2
        half = int((b - a) * f / 2)
        if rows_in(samples, mid - half, mid + half + 1) <= max_rows:
            lo = f
        else:
            hi = f
    half = int((b - a) * lo / 2)
    return (mid - half, mid + half + 1) if lo >= 1e-6 else None
