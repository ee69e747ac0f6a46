"""Device busy time split: kernels, collectives, copies by direction (bytes, GB/s), memsets.

Per device, each part is the union of its rows (streams overlap), so parts can overlap each other;
``busy_ns`` is the union of everything. ``exposed_memcpy_ns``: copy time during which no kernel
ran on that device — copies the device did not hide behind compute. Figures are summed over devices.
A window's part (``split_part``) and the parts' combine (``device_of``); a whole read is one window.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import str_codes
from srtscope.analyzers.model.names import copy_direction
from srtscope.analyzers.model.results import CopyStat, DeviceResult

SPLIT_FIGURES = ("busy", "kernel", "comm", "memcpy", "memset", "exposed")
#: per copy direction: [ns, count, bytes, ns with bytes, pageable ns, any bytes]
CopyPart = dict[str, list[int]]


def split_part(dev: pd.DataFrame, sets: DeviceSets, lo: int, hi: int) -> tuple[dict[str, int], CopyPart]:
    """A window ``[lo, hi)``'s share: ``SPLIT_FIGURES`` of every device (each a union, clipped to the
    window), and per copy direction the figures of the copies of ``dev`` starting in it. ``sets``:
    the device sets of ``dev`` (its collective mask included)."""
    tot = dict.fromkeys(SPLIT_FIGURES, 0)

    def t(s: iv.IntervalSet) -> int:
        return iv.total(iv.clip(s, lo, hi))
    for key in sets.keys:
        copies = sets.union(key, "copy")
        tot["busy"] += t(sets.union(key))
        tot["kernel"] += t(sets.union(key, "kernel"))
        tot["comm"] += t(sets.union(key, "comm"))
        tot["memcpy"] += t(copies)
        tot["memset"] += t(sets.union(key, "memset"))
        tot["exposed"] += t(iv.subtract(copies, sets.union(key, "compute")))
    copies_out: CopyPart = {}
    if len(dev):
        st = dev["start_ns"].to_numpy()
        m = sets.mask("copy") & (st >= lo) & (st < hi)
        if m.any():
            codes, names = str_codes(dev["name"][m])     # classified once per distinct name
            direction = np.array([copy_direction(str(n)) for n in names], dtype=object)[codes]
            pageable = np.array(["pageable" in str(n).lower() for n in names], dtype=bool)[codes]
            ns = dev["end_ns"].to_numpy()[m] - st[m]
            nb = dev["bytes"].to_numpy()[m]
            for d in np.unique(direction):
                g = direction == d
                known = g & (nb >= 0)
                copies_out[str(d)] = [int(ns[g].sum()), int(g.sum()), int(nb[known].sum()), int(ns[known].sum()),
                                      int(ns[g & pageable].sum()), int(known.any())]
    return tot, copies_out


def device_of(splits: list[dict[str, int]], copies: list[CopyPart]) -> DeviceResult:
    """The windows' ``split_part`` added up."""
    totals: dict[str, int] = dict.fromkeys(SPLIT_FIGURES, 0)
    acc: CopyPart = {}
    for p in splits:
        for k, ns in p.items():
            totals[k] += ns
    for c in copies:
        for d, figures in c.items():
            a = acc.setdefault(d, [0] * 6)
            for i in range(6):
                a[i] += figures[i]
    return device_result(totals, {d: copy_stat(c[0], c[1], c[2], c[3], c[4], c[5] > 0)
                                  for d, c in sorted(acc.items())})


def copy_stat(ns: int, count: int, known_bytes: int, known_ns: int, pageable_ns: int, any_known: bool) -> CopyStat:
    """One copy direction's figures: ``known_bytes`` moved by the copies whose size is known, in
    ``known_ns`` of their time (GB/s from those only); bytes -1 when no copy's size is known."""
    gbps = round(known_bytes / known_ns, 3) if any_known and known_ns > 0 else None
    return CopyStat(ns, count, known_bytes if any_known else -1, gbps, pageable_ns)


def device_result(totals: dict[str, int], by_kind: dict[str, CopyStat]) -> DeviceResult:
    """``totals``: busy, kernel, comm, memcpy, memset, exposed (ns); ``by_kind``: per copy direction
    in name order (shown by time, largest first)."""
    return DeviceResult(totals["busy"], totals["kernel"], totals["comm"], totals["memcpy"], totals["memset"],
                        totals["exposed"], dict(sorted(by_kind.items(), key=lambda kv: -kv[1].ns)))
