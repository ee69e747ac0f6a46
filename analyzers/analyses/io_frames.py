"""What the host did in the time the device waited on data loading (``host_io`` bubble time): the
I/O-named range, operator or Python frame it waited in (``DataLoader.__next__``, a dataset's
``__getitem__``), and the innermost work inside it. Operators (decoding, resizing, normalising,
collating) inside ``__next__`` are preprocessing on the host, which more loader workers or device-side
preprocessing fix, not the disk — the verdict says which (``IoWork.preprocessing``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_activity import HostActivity, work_is
from srtscope.analyzers.analyses.host_threads import innermost_segments
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import str_codes
from srtscope.analyzers.model.names import HostWork, host_work, range_family
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.model.vocab import Cause

__all__ = ["IoWork", "io_work"]


#: the innermost work inside a data-loading frame is preprocessing when it holds this share of its time
PREP_SHARE = 0.25


@dataclass(frozen=True)
class IoWork:
    """``ns`` of host_io bubble time inside ``outer`` (an I/O-named range, operator or frame); of it,
    ``inner``: (name, ns) of the work running inside it (innermost, largest first, no I/O of its own)."""

    outer: str
    ns: int
    inner: tuple[tuple[str, int], ...]

    @property
    def inner_ns(self) -> int:
        return sum(ns for _, ns in self.inner)

    @property
    def preprocessing(self) -> bool:
        """Computing inside the data loader holds ``PREP_SHARE`` of its time: preprocessing on the host."""
        return self.ns > 0 and self.inner_ns >= PREP_SHARE * self.ns


def _label(name: str) -> str:
    """A frame ``file.py(12): func`` is its function; other names their ``range_family``."""
    func = name.rpartition("): ")[2]
    return func if func and func != name else range_family(name)


def io_work(tl: Timeline, model: HostActivity, pieces: pd.DataFrame, top: int = 3) -> list[IoWork]:
    """The I/O-named ranges, operators or frames holding the most ``host_io`` bubble time, largest
    first, each with the work inside it.

    ``pieces``: attributed bubble pieces (rank, pid, tid, start_ns, end_ns, ``cause.host_io_ns``)."""
    col = f"cause.{Cause.HOST_IO.value}_ns"
    if len(pieces) == 0 or col not in pieces:
        return []
    p = pieces[(pieces[col].to_numpy() > 0) & (pieces["tid"].to_numpy() >= 0)]
    if len(p) == 0:
        return []
    tables = (("rg", tl.host_ranges, model._rg_work), ("ops", model.ops, model._op_work),
              ("frames", model.frames, model._frame_work[0]))
    acc: dict[tuple[str, str], int] = {}
    for key, idx in p.groupby(["rank", "pid", "tid"]).indices.items():
        k = (int(key[0]), int(key[1]), int(key[2]))
        q = iv.union(p["start_ns"].to_numpy()[idx], p["end_ns"].to_numpy()[idx])
        lo, hi = int(q[0][0]), int(q[1][-1])
        s, e, names, io = [], [], [], []
        for name, df, work in tables:
            rows = model._thread_rows(name, k)
            if len(rows) == 0:
                continue
            rs, re_ = df["start_ns"].to_numpy()[rows], df["end_ns"].to_numpy()[rows]
            near = (re_ > lo) & (rs < hi)
            if not near.any():
                continue
            rows = rows[near]
            codes, cats = str_codes(df["name"].iloc[rows])
            s.append(rs[near])
            e.append(re_[near])
            names.append(np.array([_label(str(c)) for c in cats], dtype=object)[codes])
            io.append(work_is(work, rows, HostWork.IO))
        if not s or not np.concatenate(io).any():
            continue
        S, E, N, IO = np.concatenate(s), np.concatenate(e), np.concatenate(names), np.concatenate(io)
        labels, lab = np.unique(N, return_inverse=True)
        os_, oe, ol = innermost_segments(S[IO], E[IO], lab[IO])
        is_, ie, il = innermost_segments(S, E, lab)
        for x in np.unique(ol):
            u = iv.intersect(iv.union(os_[ol == x], oe[ol == x]), q)
            if not len(u[0]):
                continue
            # inner segments are disjoint: their overlap with u, summed per label, in one pass
            per = np.bincount(il, weights=iv.overlap(u, is_, ie), minlength=len(labels))
            for y in np.flatnonzero(per > 0):
                pair = (str(labels[x]), str(labels[y]))
                acc[pair] = acc.get(pair, 0) + int(per[y])
    outer: dict[str, int] = {}
    for (a, _), ns in acc.items():
        outer[a] = outer.get(a, 0) + ns
    out = []
    for a, ns in outer.items():
        inner = sorted(((b, v) for (x, b), v in acc.items() if x == a and b != a and host_work(b) is not HostWork.IO),
                       key=lambda kv: (-kv[1], kv[0]))
        out.append(IoWork(a, ns, tuple(inner)))
    out.sort(key=lambda w: (-w.ns, w.outer))
    return out[:top]
