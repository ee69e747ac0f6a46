"""The device side of the windows: each (rank, device) has its own context and its own carry.

A window owns ``[lo, hi)``; for every device its context is widened to the gaps of that device that
touch the window (``window.context_of`` with the device's running end and next start), so each
device's rows in a window are the ones overlapping its own context — a device idle across many windows
brings only the row before and the row after its idle stretch, not the other devices' rows in between.
The host rows (API, ranges) are read over the widest of the devices' contexts (``contexts``).

``DeviceScan`` is the first pass's device side over start-sorted chunks: each device's bounds and
busy time (for the primary device of each rank), the collective rows (matched across ranks once, in
``reduce``), and the next row of each device idle across a candidate edge of a window (a
step start or end): the row that ends its gap, one per gap, held whole.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.budget import primary_devices
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import group_rows, isin, rows_where
from srtscope.analyzers.model.names import comm_mask
from srtscope.analyzers.model.timeline import DeviceKind
from srtscope.analyzers.pipeline.window import context_of, rank_edges

Key = tuple[int, int]
_MAX = int(np.iinfo(np.int64).max) // 2
COMM_COLUMNS = ["rank", "device", "start_ns", "end_ns", "name"]


def by_key(df: pd.DataFrame) -> Iterator[tuple[Key, np.ndarray | slice]]:
    """(rank, device), rows of ``df`` of that device (a slice when all are, else ascending
    positions: ``columns.group_rows``), sorted by key."""
    if len(df) == 0:
        return
    r, d = df["rank"].to_numpy(np.int64), df["device"].to_numpy(np.int64)
    if (r == r[0]).all() and (d == d[0]).all():
        yield (int(r[0]), int(d[0])), slice(None)
        return
    for k, idx in group_rows(df, ["rank", "device"]).items():
        yield (int(k[0]), int(k[1])), idx


def contexts(lo: int, hi: int, keys: list[Key], running: Mapping[Key, int],
             nxt: Mapping[Key, int | None]) -> tuple[dict[Key, tuple[int, int]], int, int]:
    """Per device its context of ``[lo, hi)`` (``running``: the latest end of its rows starting before
    ``lo``; ``nxt``: its first start at or after ``hi``), and the widest (the host rows' context)."""
    per = {k: context_of(lo, hi, running.get(k), nxt.get(k)) for k in keys}
    return per, min([lo, *(c[0] for c in per.values())]), max([hi, *(c[1] for c in per.values())])


def in_contexts(dev: pd.DataFrame, per: Mapping[Key, tuple[int, int]]) -> pd.DataFrame:
    """The rows of ``dev`` overlapping their own device's context (``window.overlapping``), in order."""
    if len(dev) == 0:
        return dev
    s, e = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    keep = np.zeros(len(dev), bool)
    for key, m in by_key(dev):
        lo, hi = per.get(key, (0, 0))
        keep[m] = (((e > lo) & (s < hi)) | (s == lo))[m]
    return dev if keep.all() else rows_where(dev, keep)


def raise_running(running: dict[Key, int], rows: pd.DataFrame) -> None:
    """Raise each device's running end to the latest end among ``rows`` (rows starting before a cut)."""
    e = rows["end_ns"].to_numpy() if len(rows) else np.zeros(0, np.int64)
    for key, m in by_key(rows):
        top = int(e[m].max())
        running[key] = max(running.get(key, top), top)


def started_before(dev: pd.DataFrame, his: Mapping[int, int]) -> np.ndarray:
    """Mask of the rows of ``dev`` starting before their rank's end of owned time ``his[rank]``."""
    if len(dev) == 0:
        return np.zeros(0, bool)
    hi = pd.Series(his, dtype=np.int64).reindex(dev["rank"].to_numpy()).fillna(_MAX).to_numpy(np.int64)
    return dev["start_ns"].to_numpy() < hi


def carried(dev: pd.DataFrame, his: Mapping[int, int], running: Mapping[Key, int]) -> pd.DataFrame:
    """The rows of ``dev`` the next windows, from each rank's ``his[rank]`` on, may read: per device
    those reaching past the left edge of its next context, and those starting at or after it."""
    if len(dev) == 0:
        return dev
    s, e = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    keep = np.zeros(len(dev), bool)
    for key, m in by_key(dev):
        r, hi = running.get(key), his.get(key[0], _MAX)
        nlo = hi if r is None or r > hi else r - 1
        keep[m] = ((e > nlo) | (s >= nlo))[m]
    return rows_where(dev, keep)


def rank_windows(steps: pd.DataFrame, windows: list[tuple[int, int]],
                 ranks: list[int]) -> list[list[tuple[int, int, int]]]:
    """Per window, per rank: (rank, lo, hi), the rank's owned time (``window.rank_edges``: the
    window's edges moved past the rank's open steps); ``lo == hi`` where the rank owns nothing in it."""
    edges = rank_edges(steps, windows)
    return [[(r, *(edges[r][i] if r in edges else w)) for r in ranks] for i, w in enumerate(windows)]


def next_rows(dev: pd.DataFrame, hi: int, rank: int, scan: DeviceScan) -> tuple[dict[Key, int], list[pd.DataFrame]]:
    """Per device of ``rank``: the start of its first row at or after ``hi`` (a candidate edge), from
    ``dev`` (the rows read so far, through ``scan.read_to(hi)``, in start order), else from the first
    pass — those rows, not read yet, are given too (one-row tables)."""
    starts: dict[Key, int] = {}
    mine = of_rank(dev, rank)
    s = mine["start_ns"].to_numpy() if len(mine) else np.zeros(0, np.int64)
    for key, m in by_key(mine):
        sk = s[m]
        j = int(np.searchsorted(sk, hi, side="left"))
        if j < len(sk):
            starts[key] = int(sk[j])
    unread = []
    for key, row in scan.far_rows(hi).items():
        if key[0] == rank and key not in starts:
            starts[key] = int(row["start_ns"].iloc[0])
            unread.append(row)
    return starts, unread


def of_rank(df: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The rows of one rank, in order."""
    if len(df) == 0:
        return df
    r = df["rank"].to_numpy()
    return df if (r == rank).all() else df[r == rank].reset_index(drop=True)


def primary_of(busy: Mapping[Key, int]) -> dict[int, int]:
    """Per rank its primary device (``budget.primary_devices``) from each device's busy ns."""
    keys = sorted(busy)
    return primary_devices(pd.DataFrame({"rank": [k[0] for k in keys], "device": [k[1] for k in keys],
                                         "busy_ns": [busy[k] for k in keys]}))


class DeviceScan:
    """The first pass over start-sorted device chunks, device side (module doc). ``cuts``: the
    candidate edges of windows (every step start and end), sorted, ns.

    NOTE: a window reads the device rows up to the candidate after its edge (``read_to``), which
    holds each busy device's next row; only a device idle past that candidate needs its next row
    kept from the first pass (``far_rows``): one row per such gap, however many windows it spans."""

    def __init__(self, cuts: np.ndarray, comm_rows: bool = True) -> None:
        self.cuts = cuts
        # NOTE: one device in the trace (``comm_rows`` False): its collectives have no peer to be
        # matched with; their count and first row do (not millions of rows held whole)
        self.keep_comm_rows = comm_rows
        self.comm_n = 0
        self._comm_keys: set[Key] = set()
        self.bounds: dict[Key, tuple[int, int]] = {}
        self.busy: dict[Key, int] = {}
        self._open: dict[Key, tuple[int, int]] = {}
        self._comm: list[pd.DataFrame] = []
        self.stand_in_only = True
        self._far: dict[Key, list[tuple[np.ndarray, np.ndarray, pd.DataFrame]]] = {}
        self._found: dict[Key, int] = {}          # per device, how many cuts (a prefix) have their next row

    def add(self, d: pd.DataFrame) -> None:
        if len(d) == 0:
            return
        s_, e_ = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
        # per candidate, the candidate after it (the last: itself, read no further: ``read_to``)
        after = np.r_[self.cuts[1:], self.cuts[-1:]]
        for key, m in by_key(d):
            s, e = s_[m], e_[m]
            b = self.bounds.get(key)
            nb = (int(s.min()), int(e.max()))
            self.bounds[key] = nb if b is None else (min(b[0], nb[0]), max(b[1], nb[1]))
            prev = self._open.get(key)
            us, ue = iv.union(s, e) if prev is None else iv.union(np.r_[prev[0], s], np.r_[prev[1], e])
            # all but the last interval are whole: the next chunk starts at or after the last start
            self.busy[key] = self.busy.get(key, 0) + int((ue[:-1] - us[:-1]).sum())
            self._open[key] = (int(us[-1]), int(ue[-1]))
            # NOTE: the cuts still waiting for a next row are those after the device's last start
            done = self._found.get(key, 0)
            j = np.searchsorted(s, self.cuts[done:], side="left")
            hit = np.flatnonzero(j < len(s))
            if len(hit):
                self._found[key] = done + int(hit[-1]) + 1
                idx, jj = done + hit, j[hit]
                far = s[jj] >= after[idx]
                if far.any():
                    idx, jj = idx[far], jj[far]
                    first = np.flatnonzero(np.r_[True, jj[1:] != jj[:-1]])    # one row per gap
                    last = np.r_[first[1:], len(jj)] - 1
                    rows = d.iloc[m] if isinstance(m, np.ndarray) else d
                    self._far.setdefault(key, []).append((idx[first], idx[last], rows.iloc[jj[first]]))
        cm = comm_mask(d)
        if cm.any():
            self.comm_n += int(cm.sum())
            rows = d.loc[cm, COMM_COLUMNS]
            if not self.keep_comm_rows:         # each device's first collective row only
                firsts = []
                for key, m in by_key(rows):
                    if key not in self._comm_keys:
                        self._comm_keys.add(key)
                        firsts.append(int(m[0]) if isinstance(m, np.ndarray) else 0)
                rows = rows.iloc[firsts]
            if len(rows):
                self._comm.append(rows)
            self.stand_in_only &= bool(isin(d["kind"], [DeviceKind.CPU_FORWARD])[cm].all())

    def finish(self) -> None:
        for key, (a, b) in self._open.items():
            self.busy[key] += b - a
        self._open = {}

    def comm_rows(self) -> tuple[str, pd.DataFrame]:
        """(source, rows) of every collective (``comm._instances``'s, when the trace has any); the
        first of each device's only where the rows are not kept (``comm_n`` counts them all)."""
        rows = pd.concat(self._comm, ignore_index=True)
        if not self.keep_comm_rows:
            rows = rows.sort_values(["rank", "device"], kind="stable", ignore_index=True)
        return ("stand_in" if self.stand_in_only else "kernels"), rows

    @property
    def has_comm(self) -> bool:
        return bool(self._comm)

    def _index(self, t: int) -> int | None:
        i = int(np.searchsorted(self.cuts, t, side="left"))
        if i == len(self.cuts) or self.cuts[i] != t:
            if t >= _MAX:
                return None     # ``window.plan``'s last edge: no row after it
            raise ValueError(f"{t} ns is not a step start or end: no next rows kept for it")
        return i

    def read_to(self, t: int) -> int:
        """Up to where (excluded) the device rows are read for a window ending at ``t``, ns."""
        i = self._index(t)
        return t if i is None or i + 1 == len(self.cuts) else int(self.cuts[i + 1])

    def far_rows(self, t: int) -> dict[Key, pd.DataFrame]:
        """Per device idle from ``t`` (a candidate) past ``read_to(t)``: its next row, a one-row table."""
        i = self._index(t)
        out: dict[Key, pd.DataFrame] = {}
        if i is None:
            return out
        for key, got in self._far.items():
            for i0, i1, rows in got:
                k = int(np.searchsorted(i0, i, side="right")) - 1
                if k >= 0 and i <= i1[k]:
                    out[key] = rows.iloc[[k]]
                    break
        return out
