"""Device activity sets: per (rank, device), the unions of the device rows' activity by row class,
computed on first use and kept.

The device-side counterpart of ``host_activity.HostActivity``: built once per trace in
``diagnose`` and handed to the analyses (bubbles, steps, budget, comm, device split, overview,
what-if, capture), so that each union over millions of rows is computed once, not once per analysis.
Every analysis builds its own when given none (or ones built for another Timeline).

Row classes (``CLASSES``): ``all``; ``compute`` (kernels, graphs, CPU stand-in forwards);
``kernel`` (compute that is not a collective); ``comm`` (collectives, ``names.comm_mask``);
``noncomm``; ``copy`` (memcpy); ``memset``; ``copyset`` (memcpy or memset); ``forward`` (CPU
stand-in forwards). Sets are in ``intervals`` normal form, ns; callers only read them.

NOTE: a union depends only on its set of rows: a class holding every row of a device shares that
device's ``all`` union, and one holding none is empty — one pass over a single-kind device.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import group_rows, isin
from srtscope.analyzers.model.names import comm_mask
from srtscope.analyzers.model.timeline import ApiKind, DeviceKind, Timeline

Key = tuple[int, int]   # (rank, device)

_KINDS: dict[str, tuple[DeviceKind, ...]] = {
    "compute": (DeviceKind.KERNEL, DeviceKind.GRAPH, DeviceKind.CPU_FORWARD),
    "copy": (DeviceKind.MEMCPY,),
    "memset": (DeviceKind.MEMSET,),
    "copyset": (DeviceKind.MEMCPY, DeviceKind.MEMSET),
    "forward": (DeviceKind.CPU_FORWARD,),
}
CLASSES: tuple[str, ...] = ("all", "kernel", "comm", "noncomm", *_KINDS)


class DeviceSets:
    """Unions of one Timeline's device rows per (rank, device) and row class, built on first use.

    ``comm``: the collective mask (``names.comm_mask`` of ``tl.device``), computed when needed if
    not given. ``keys``: the (rank, device) pairs with device rows, sorted.
    """

    def __init__(self, tl: Timeline, comm: np.ndarray | None = None, graph_calls: pd.DataFrame | None = None) -> None:
        self.tl = tl
        self._graph_calls = graph_calls     # (rank, pid, correlation) of graph launches outside ``tl``
        dev = tl.device
        self.s, self.e = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
        self._comm = comm
        self._masks: dict[str, np.ndarray] = {}
        self._unions: dict[tuple[Key, str], iv.IntervalSet] = {}
        self._bounds: dict[Key, tuple[int, int]] = {}
        self._order: dict[Key, tuple[np.ndarray | None, np.ndarray]] = {}
        self._groups: dict[Key, np.ndarray | None] = {}
        if len(dev) == 0:
            return
        r, d = dev["rank"].to_numpy(), dev["device"].to_numpy()
        if (r == r[0]).all() and (d == d[0]).all():
            # one device: its rows are the whole table (None), no row index to build or gather by
            self._groups[(int(r[0]), int(d[0]))] = None
        else:
            for k, v in sorted(group_rows(dev, ["rank", "device"]).items()):
                self._groups[(int(k[0]), int(k[1]))] = np.asarray(v)

    @classmethod
    def of(cls, tl: Timeline, sets: DeviceSets | None = None, comm: np.ndarray | None = None) -> DeviceSets:
        """``sets`` when they were built for this Timeline (and this collective mask), else new ones."""
        if sets is not None and sets.tl is tl and (comm is None or sets._comm is comm):
            return sets
        return cls(tl, comm)

    @property
    def keys(self) -> list[Key]:
        return list(self._groups)

    @property
    def comm(self) -> np.ndarray:
        """Mask of the device rows that are collectives."""
        if self._comm is None:
            self._comm = comm_mask(self.tl.device)
        return self._comm

    def mask(self, cls: str) -> np.ndarray:
        """Mask over every device row of a row class (not ``all``)."""
        got = self._masks.get(cls)
        if got is None:
            if cls not in CLASSES or cls == "all":
                raise ValueError(f"no row mask for class {cls!r} (one of {', '.join(CLASSES[1:])})")
            kind = self.tl.device["kind"]
            if cls == "comm":
                got = self.comm
            elif cls == "noncomm":
                got = ~self.comm
            elif cls == "kernel":
                got = self.mask("compute") & ~self.comm
            elif len(kind) == 0:
                got = np.zeros(0, bool)
            else:
                got = isin(kind, list(_KINDS[cls]))
            self._masks[cls] = got
        return got

    def graph_mask(self) -> np.ndarray:
        """Mask of the device rows that ran inside a CUDA graph: a graph id or node set, a graph row,
        or correlated to a graph launch call."""
        got = self._masks.get("graph")
        if got is None:
            got = self._masks["graph"] = graph_rows(self.tl, self._graph_calls)
        return got

    def graph_spans(self, key: Key) -> iv.IntervalSet:
        """One device's replayed CUDA graphs: per replay (its kernels' correlation id, else graph id),
        first start to last end — gaps inside them are the graph's own, not the host's (normal form)."""
        got = self._unions.get((key, "graph_spans"))
        if got is None:
            got = iv.empty()
            if key in self._groups:
                r = self.positions(key, self.in_group(key, self.graph_mask()))
                if len(r):
                    dev = self.tl.device
                    corr, gid = dev["correlation"].to_numpy()[r], dev["graph_id"].to_numpy()[r]
                    replay = np.where(corr >= 0, corr.astype(np.int64), -2 - gid.astype(np.int64))
                    lo = pd.Series(self.s[r]).groupby(replay).min().to_numpy()
                    hi = pd.Series(self.e[r]).groupby(replay).max().to_numpy()
                    got = iv.union(lo, hi)
            self._unions[(key, "graph_spans")] = got
        return got

    def rows(self, key: Key) -> np.ndarray:
        """Positions of one device's rows in the device table (ascending)."""
        g = self._groups[key]
        return np.arange(len(self.s)) if g is None else g

    def in_group(self, key: Key, mask: np.ndarray) -> np.ndarray:
        """A mask over every device row, restricted to one device's rows (in their order)."""
        g = self._groups[key]
        return mask if g is None else mask[g]

    def positions(self, key: Key, sel: np.ndarray) -> np.ndarray:
        """Positions in the device table of one device's rows where ``sel`` (a mask over its rows,
        as ``in_group`` gives) holds: ``rows(key)[sel]`` without building ``rows`` for a single device."""
        g = self._groups[key]
        return np.flatnonzero(sel) if g is None else g[sel]

    def union(self, key: Key, cls: str = "all") -> iv.IntervalSet:
        """Union of one device's rows of a class (normal form; empty for an unknown device)."""
        if key not in self._groups:
            return iv.empty()
        got = self._unions.get((key, cls))
        if got is None:
            got = self._unions[(key, cls)] = self._union(key, cls)
        return got

    def _union(self, key: Key, cls: str) -> iv.IntervalSet:
        g = self._groups[key]
        if cls == "all":
            return iv.union(self.s, self.e) if g is None else iv.union(self.s[g], self.e[g])
        sel = self.in_group(key, self.mask(cls))
        if sel.all():
            return self.union(key, "all")
        if not sel.any():
            return iv.empty()
        r = sel if g is None else g[sel]
        return iv.union(self.s[r], self.e[r])

    def rank_union(self, rank: int, cls: str = "all") -> iv.IntervalSet:
        """Union of a class's rows over every device of a rank."""
        parts = [self.union(k, cls) for k in self._groups if k[0] == rank]
        if len(parts) == 1:
            return parts[0]
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return iv.empty()
        return iv.union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def bounds(self, key: Key) -> tuple[int, int]:
        """(earliest start, latest end) of one device's rows, zero-length rows included, ns."""
        got = self._bounds.get(key)
        if got is None:
            g = self._groups[key]
            s, e = (self.s, self.e) if g is None else (self.s[g], self.e[g])
            got = self._bounds[key] = (int(s.min()), int(e.max()))
        return got

    def next_rows(self, key: Key, t: np.ndarray) -> np.ndarray:
        """Per time ``t``: the row of the device that is first, in (stable) start order, to start
        at or after it — the activity that ends a gap ending at ``t``."""
        got = self._order.get(key)
        if got is None:
            g = self._groups[key]
            s = self.s if g is None else self.s[g]
            if iv.is_sorted(s):
                got = (g, s)
            else:
                order = np.argsort(s, kind="stable")
                got = (order if g is None else g[order], s[order])
            self._order[key] = got
        rows, starts = got
        pos = np.searchsorted(starts, t, side="left")
        return pos if rows is None else rows[pos]

    def stream_unions(self, key: Key) -> list[tuple[int, iv.IntervalSet]]:
        """(stream, union of that stream's rows) of one device, by stream."""
        g = self._groups[key]
        st = self.tl.device["stream"].to_numpy()
        st = st if g is None else st[g]
        if (st == st[0]).all():
            return [(int(st[0]), self.union(key))]
        order = np.argsort(st, kind="stable")
        cuts = np.flatnonzero(st[order][1:] != st[order][:-1]) + 1
        out = []
        for part in np.split(order, cuts):
            r = part if g is None else g[part]
            out.append((int(st[part[0]]), iv.union(self.s[r], self.e[r])))
        return out


def graph_rows(tl: Timeline, graph_calls: pd.DataFrame | None = None) -> np.ndarray:
    """Device rows that ran inside a CUDA graph (graph id/node set, a graph row, or correlated to a
    graph launch call: of ``tl``, or of ``graph_calls``, (rank, pid, correlation) of launches made
    before ``tl``'s rows: a window's)."""
    dev = tl.device
    m = ((dev["graph_id"].to_numpy() >= 0) | (dev["graph_node"].to_numpy() >= 0)
         | isin(dev["kind"], [DeviceKind.GRAPH]))
    api = tl.api
    if (len(api) or (graph_calls is not None and len(graph_calls))) and len(dev):
        sel = isin(api["kind"], [ApiKind.GRAPH_LAUNCH]) & (api["correlation"].to_numpy() >= 0) \
            if len(api) else np.zeros(0, bool)
        g = api.loc[sel, ["rank", "pid", "correlation"]] if sel.any() else api.iloc[:0][["rank", "pid", "correlation"]]
        if graph_calls is not None and len(graph_calls):
            g = pd.concat([g.astype(np.int64), graph_calls[["rank", "pid", "correlation"]].astype(np.int64)],
                          ignore_index=True)
        g = g[g["correlation"].to_numpy() >= 0].drop_duplicates()
        if len(g):
            key = dev[["rank", "pid", "correlation"]].reset_index().merge(g, on=["rank", "pid", "correlation"])
            m[key["index"].to_numpy()] = True
    return m
