"""The device side of the windows: each (rank, device) has its own context and its own carry.

A window owns ``[lo, hi)``; for every device its context is widened to the gaps of that device that
touch the window (``windowed.context_of`` with the device's running end and next start), so each
device's rows in a window are the ones overlapping its own context — a device idle across many windows
brings only the row before and the row after its idle stretch, not the other devices' rows in between.
The host rows (API, ranges) are read over the widest of the devices' contexts (``contexts``).

``DeviceScan`` is the first pass's device side over start-sorted chunks: each device's bounds and
busy time (for the primary device of each rank), the collective rows (matched across ranks once, in
``windowed_reduce``), and per candidate cut (step start) the first row of each device at or after it
(the row that ends a gap reaching past the cut: O(steps x devices) rows, held whole).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.budget import primary_devices
from srtscope.analyzers.columns import isin
from srtscope.analyzers.names import comm_mask
from srtscope.analyzers.timeline import DeviceKind
from srtscope.analyzers.windowed import context_of, rank_edges

Key = tuple[int, int]
_MAX = int(np.iinfo(np.int64).max) // 2
COMM_COLUMNS = ["rank", "device", "start_ns", "end_ns", "name"]


def by_key(df: pd.DataFrame) -> Iterator[tuple[Key, np.ndarray | slice]]:
    """(rank, device), rows of ``df`` of that device (a slice when all are), sorted by key."""
    if len(df) == 0:
        return
    r, d = df["rank"].to_numpy(np.int64), df["device"].to_numpy(np.int64)
    if (r == r[0]).all() and (d == d[0]).all():
        yield (int(r[0]), int(d[0])), slice(None)
        return
    # NOTE: one code per (rank, device) and a hash for the few distinct ones: no sort of the rows
    code = r * (1 << 32) + d
    for c in np.sort(pd.unique(code)):
        m = code == c
        i = int(np.argmax(m))
        yield (int(r[i]), int(d[i])), m


def contexts(lo: int, hi: int, keys: list[Key], running: Mapping[Key, int],
             nxt: Mapping[Key, int | None]) -> tuple[dict[Key, tuple[int, int]], int, int]:
    """Per device its context of ``[lo, hi)`` (``running``: the latest end of its rows starting before
    ``lo``; ``nxt``: its first start at or after ``hi``), and the widest (the host rows' context)."""
    per = {k: context_of(lo, hi, running.get(k), nxt.get(k)) for k in keys}
    return per, min([lo, *(c[0] for c in per.values())]), max([hi, *(c[1] for c in per.values())])


def in_contexts(dev: pd.DataFrame, per: Mapping[Key, tuple[int, int]]) -> pd.DataFrame:
    """The rows of ``dev`` overlapping their own device's context (``windowed.overlapping``), in order."""
    if len(dev) == 0:
        return dev
    s, e = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    keep = np.zeros(len(dev), bool)
    for key, m in by_key(dev):
        lo, hi = per.get(key, (0, 0))
        keep[m] = (((e > lo) & (s < hi)) | (s == lo))[m]
    return dev if keep.all() else dev[keep].reset_index(drop=True)


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
    return dev[keep].reset_index(drop=True)


def rank_windows(steps: pd.DataFrame, windows: list[tuple[int, int]],
                 ranks: list[int]) -> list[list[tuple[int, int, int]]]:
    """Per window, per rank: (rank, lo, hi), the rank's owned time (``windowed.rank_edges``: the
    window's edges moved past the rank's open steps); ``lo == hi`` where the rank owns nothing in it."""
    edges = rank_edges(steps, windows)
    return [[(r, *(edges[r][i] if r in edges else w)) for r in ranks] for i, w in enumerate(windows)]


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
    candidate cuts (the step starts), sorted, ns."""

    def __init__(self, cuts: np.ndarray) -> None:
        self.cuts = cuts
        self.bounds: dict[Key, tuple[int, int]] = {}
        self.busy: dict[Key, int] = {}
        self._open: dict[Key, tuple[int, int]] = {}
        self._comm: list[pd.DataFrame] = []
        self.stand_in_only = True
        self._next: dict[Key, list[tuple[np.ndarray, pd.DataFrame]]] = {}
        self._found: dict[Key, int] = {}          # per device, how many cuts (a prefix) have their next row
        self._rows: dict[Key, tuple[pd.DataFrame, np.ndarray]] = {}   # ``finish``'s: rows, position per cut

    def add(self, d: pd.DataFrame) -> None:
        if len(d) == 0:
            return
        s_, e_ = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
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
                rows = d[m] if isinstance(m, np.ndarray) else d
                self._next.setdefault(key, []).append((done + hit, rows.iloc[j[hit]]))
                self._found[key] = done + int(hit[-1]) + 1
        cm = comm_mask(d)
        if cm.any():
            self._comm.append(d.loc[cm, COMM_COLUMNS])
            self.stand_in_only &= bool(isin(d["kind"], [DeviceKind.CPU_FORWARD])[cm].all())

    def finish(self) -> None:
        for key, (a, b) in self._open.items():
            self.busy[key] += b - a
        self._open = {}
        # per device: its next rows in one table, and per candidate cut the position of its row (-1: none)
        for key, got in self._next.items():
            pos = np.full(len(self.cuts), -1, np.int64)
            pos[np.concatenate([idx for idx, _ in got])] = np.arange(sum(len(idx) for idx, _ in got))
            self._rows[key] = (pd.concat([r for _, r in got], ignore_index=True), pos)
        self._next = {}

    def comm_rows(self) -> tuple[str, pd.DataFrame]:
        """(source, rows) of every collective (``comm._instances``'s, when the trace has any)."""
        rows = pd.concat(self._comm, ignore_index=True)
        return ("stand_in" if self.stand_in_only else "kernels"), rows

    @property
    def has_comm(self) -> bool:
        return bool(self._comm)

    def next_rows(self, t: int) -> dict[Key, pd.DataFrame]:
        """Per device, its first row starting at or after ``t`` (a candidate cut), as a one-row table."""
        i = int(np.searchsorted(self.cuts, t, side="left"))
        if i == len(self.cuts) or self.cuts[i] != t:
            if t >= _MAX:
                return {}       # ``windowed.plan``'s last edge: no row after it
            raise ValueError(f"{t} ns is not a step start or end: no next rows kept for it")
        out = {}
        for key, (rows, pos) in self._rows.items():
            if pos[i] >= 0:
                out[key] = rows.iloc[[int(pos[i])]]
        return out
