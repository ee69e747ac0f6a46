"""Per host thread, the primitives of the host-activity model: which ranges are engine stages and
their innermost segments, launch bursts (one finder, fed whole or a chunk at a time), launch counts,
the launching thread of each rank, blocking and start-up calls, a thread's rows of the table or of
one derived domain of the ranges (``DomainRows``: by position, no copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import group_rows, isin, str_codes, str_map
from srtscope.analyzers.model.names import SLOW_CALL_NS
from srtscope.analyzers.model.timeline import ApiKind, Timeline
from srtscope.probes.stages import StageClass, resolve_stages

_STAGE_CLASSES = (StageClass.SCHEDULER, StageClass.PREP, StageClass.KERNEL, StageClass.SYNC)


@dataclass(frozen=True)
class BurstRule:
    """A launch burst: >= ``min_launches`` launch calls, each starting <= ``gap_ns`` after the last ended."""

    gap_ns: int = 30_000
    min_launches: int = 4

    def __post_init__(self) -> None:
        if self.gap_ns < 0 or self.min_launches < 1:
            raise ValueError(f"bad launch-burst rule: gap_ns={self.gap_ns}, min_launches={self.min_launches}")


def stage_names(ranges: pd.DataFrame, forward: set[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(names, codes per range row, class per name) for the ranges that are non-container stages.

    codes is -1 for ranges that are not stages (unknown names and ``loop.step`` containers).
    ``forward``: the engines with forward ranges in the whole trace (``stages.forward_engines``),
    when ``ranges`` are a window's.
    """
    if len(ranges) == 0:
        return np.zeros(0, object), np.zeros(0, np.int64), np.zeros(0, object)
    codes, names = str_codes(ranges["name"])
    stages = resolve_stages([str(n) for n in names], forward)
    is_stage = np.array([s is not None and s.cls in _STAGE_CLASSES for s in stages], dtype=bool)
    ok = np.zeros(len(codes), dtype=bool)
    known = codes >= 0                      # -1: missing name
    ok[known] = is_stage[codes[known]]
    codes = np.where(ok, codes, -1)
    classes = np.array([s.cls.value if s is not None else "" for s in stages], dtype=object)
    return names, codes, classes


def innermost_segments(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray):
    """Flatten nested ranges of one thread into disjoint segments labelled by the innermost range.

    Returns (seg_starts, seg_ends, seg_labels); uncovered time has no segment. Vectorised: the
    innermost range at a point is the last-started one at the covering depth.
    """
    s, e, lab = np.asarray(starts, np.int64), np.asarray(ends, np.int64), np.asarray(labels)
    keep = e > s
    s, e, lab = s[keep], e[keep], lab[keep]
    if len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, lab.dtype)
    order = np.lexsort((-e, s))
    s, e, lab = s[order], e[order], lab[order]
    ends_sorted = np.sort(e)
    depth = np.arange(len(s)) - np.searchsorted(ends_sorted, s, side="right")
    bounds = iv.sorted_unique(np.concatenate([s, e]))
    left, right = bounds[:-1], bounds[1:]
    n_started = np.searchsorted(s, left, side="right")
    cover = n_started - np.searchsorted(ends_sorted, left, side="right")
    last = n_started - 1
    owner = np.full(len(left), -1, dtype=np.int64)
    for d in np.unique(cover[cover > 0] - 1):
        sel = np.flatnonzero(cover - 1 == d)
        level = np.flatnonzero(depth == d)
        if len(level) == 0:
            continue
        pos = np.searchsorted(level, last[sel], side="right") - 1
        ok = pos >= 0
        owner[sel[ok]] = level[pos[ok]]
    valid = owner >= 0
    valid[valid] = e[owner[valid]] > left[valid]
    return left[valid], right[valid], lab[owner[valid]]


def launch_bursts(s: np.ndarray, e: np.ndarray, rule: BurstRule) -> iv.IntervalSet:
    """One thread's launch bursts (``BurstTracker``) from all its calls at once, in any order, ns."""
    if len(s) < rule.min_launches:
        return iv.empty()
    if not iv.is_sorted(s):                  # a thread's calls arrive start-sorted: no gather
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    t = BurstTracker(rule)
    t.add(s, e)
    return t.bursts()


def launch_counts(api: pd.DataFrame) -> pd.DataFrame:
    """Launch and graph-launch calls per (rank, pid, tid): columns rank, pid, tid, n."""
    m = isin(api["kind"], [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH]) if len(api) else np.zeros(0, bool)
    if not m.any():
        return pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in ("rank", "pid", "tid", "n")})
    cols = {c: api[c].to_numpy()[m] for c in ("rank", "pid", "tid")}
    if all((v == v[0]).all() for v in cols.values()):    # one thread launches: no grouping
        return pd.DataFrame({**{c: np.array([v[0]], np.int64) for c, v in cols.items()}, "n": [int(m.sum())]})
    return pd.DataFrame(cols).groupby(["rank", "pid", "tid"]).size().reset_index(name="n")


def run_starts(s: np.ndarray, e: np.ndarray, gap_ns: int, prev_end: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(mask of the calls that open a run, running end), for one thread's start-sorted calls
    (non-empty, int64): a run opens where a call starts more than ``gap_ns`` after every earlier
    call ended. ``prev_end``: the latest end of the calls before these (a chunk's carry), ns."""
    run_end = np.maximum.accumulate(e if prev_end is None else np.maximum(e, prev_end))
    new = np.empty(len(s), dtype=bool)
    new[0] = prev_end is None or bool(s[0] - prev_end > gap_ns)
    np.greater(s[1:] - run_end[:-1], gap_ns, out=new[1:])
    return new, run_end


class BurstTracker:
    """One thread's launch bursts, fed its start-sorted launch calls a chunk at a time (a whole
    read: one chunk): runs of calls each starting at most ``rule.gap_ns`` after every earlier one
    ended, of at least ``rule.min_launches`` calls, from the first start to the latest end. One
    open run is carried between chunks."""

    def __init__(self, rule: BurstRule) -> None:
        self.rule = rule
        self.open: tuple[int, int, int] | None = None    # (first start, calls, running end)
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []

    def add(self, s: np.ndarray, e: np.ndarray) -> None:
        if len(s) == 0:
            return
        s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
        new, run_end = run_starts(s, e, self.rule.gap_ns, self.open[2] if self.open is not None else None)
        first = np.flatnonzero(new)
        last = np.r_[first[1:], len(s)] - 1
        fs, counts, ends = s[first], np.diff(np.r_[first, len(s)]), run_end[last]
        if self.open is not None:
            o_start, o_n, o_end = self.open
            head = int(first[0]) if len(first) else len(s)
            if head:                                     # the carried run goes on into this chunk
                o_n, o_end = o_n + head, int(run_end[head - 1])
            fs, counts, ends = np.r_[o_start, fs], np.r_[o_n, counts], np.r_[o_end, ends]
        keep = counts[:-1] >= self.rule.min_launches
        self.starts.append(fs[:-1][keep])
        self.ends.append(ends[:-1][keep])
        self.open = (int(fs[-1]), int(counts[-1]), int(ends[-1]))

    def bursts(self) -> iv.IntervalSet:
        """The bursts of all the calls fed (closes the open run)."""
        if self.open is not None:
            start, n, end = self.open
            self.open = None
            if n >= self.rule.min_launches:
                self.starts.append(np.array([start], np.int64))
                self.ends.append(np.array([end], np.int64))
        if not self.starts:
            return iv.empty()
        return iv.union(np.concatenate(self.starts), np.concatenate(self.ends))


def default_threads(tl: Timeline, counts: pd.DataFrame | None = None) -> dict[int, tuple[int, int]]:
    """Per rank, the thread issuing the most launches, else the one with the most stage ranges.
    ``counts``: ``launch_counts`` of the trace's API rows when they are not in ``tl``."""
    out: dict[int, tuple[int, int]] = {}
    top = launch_counts(tl.api) if counts is None else counts
    if len(top):
        for row in top.sort_values("n").itertuples():
            out[int(row.rank)] = (int(row.pid), int(row.tid))
    if len(tl.host_ranges):
        _, codes, _ = stage_names(tl.host_ranges)
        st = tl.host_ranges[codes >= 0]
        if len(st):
            top = st.groupby(["rank", "pid", "tid"]).size().reset_index(name="n")
            for row in top.sort_values("n").itertuples():
                out.setdefault(int(row.rank), (int(row.pid), int(row.tid)))
    return out


def stage_threads(rg: pd.DataFrame, codes: np.ndarray, keys: list[tuple]) -> dict[tuple, tuple]:
    """Per launching thread (rank, pid, tid) in ``keys``: the other thread of its process with the
    most stage ranges (an overlap loop's scheduler thread), when there is one."""
    st = rg[codes >= 0]
    if len(st) == 0 or not keys:
        return {}
    n = st.groupby(["rank", "pid", "tid"]).size().sort_values(ascending=False, kind="stable")
    out: dict[tuple, tuple] = {}
    for key in keys:
        for (r, p, t) in n.index:
            if (r, p) == key[:2] and t != key[2]:
                out[key] = (int(r), int(p), int(t))
                break
    return out


@dataclass(frozen=True)
class DomainRows:
    """The rows of one derived domain of a trace's ranges (operators, Python frames), by position:
    millions of frames are not copied out of the ranges.

    NOTE: a column (``rows["start_ns"]``) is the whole table's, and a row id (``positions``, the
    model's per-thread rows, the per-row work arrays) is a position in the whole table."""

    table: pd.DataFrame
    positions: np.ndarray           # ascending

    @classmethod
    def of(cls, ranges: pd.DataFrame, domain: str) -> DomainRows:
        pos = np.flatnonzero(isin(ranges["domain"], [domain])) if len(ranges) else np.zeros(0, np.int64)
        return cls(ranges, pos.astype(np.int32) if len(ranges) <= np.iinfo(np.int32).max else pos)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, column: str) -> pd.Series:
        return self.table[column]

    def by_thread(self, keys: list[tuple]) -> dict[tuple, np.ndarray]:
        """``rows_by_thread`` of these rows: positions in the whole table."""
        if not len(self.positions):
            return {}
        ids = self.table[["rank", "pid", "tid"]]
        whole = len(self.positions) == len(self.table)
        got = rows_by_thread(ids if whole else ids.iloc[self.positions], keys)
        return got if whole else {k: self.positions[v] for k, v in got.items()}


def rows_by_thread(df: pd.DataFrame, keys: list[tuple]) -> dict[tuple, np.ndarray]:
    """Row indices of ``df`` per (rank, pid, tid) in ``keys``: a few masks instead of grouping
    millions of rows when few threads are asked for."""
    if len(df) == 0 or not keys:
        return {}
    if len(keys) > 8:
        return group_rows(df, ["rank", "pid", "tid"])
    r, p, t = (df[c].to_numpy() for c in ("rank", "pid", "tid"))
    out = {}
    for k in keys:
        rows = np.flatnonzero((r == k[0]) & (p == k[1]) & (t == k[2]))
        if len(rows):
            out[k] = rows
    return out


def blocking_mask(api: pd.DataFrame) -> np.ndarray:
    """API rows during which the host is blocked on the device: syncs and synchronous copies."""
    if len(api) == 0:
        return np.zeros(0, bool)
    is_sync_copy = str_map(api["name"], lambda n: "Async" not in n, bool)
    return isin(api["kind"], [ApiKind.SYNC]) | (isin(api["kind"], [ApiKind.MEMCPY]) & is_sync_copy)


def cold_mask(api: pd.DataFrame) -> np.ndarray:
    """API rows that are start-up cost: allocation/set-up calls, and launch or other CUDA calls
    slower than ``SLOW_CALL_NS`` (lazy module loading, context creation on first use)."""
    if len(api) == 0:
        return np.zeros(0, bool)
    kind = isin(api["kind"], [ApiKind.ALLOC, ApiKind.INIT])
    slow = (api["end_ns"].to_numpy() - api["start_ns"].to_numpy()) >= SLOW_CALL_NS
    slow &= isin(api["kind"], [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH, ApiKind.OTHER])
    return kind | slow
