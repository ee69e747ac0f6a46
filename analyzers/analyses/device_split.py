"""Device busy time split: kernels, collectives, copies by direction (bytes, GB/s), memsets.

Per device, each part is the union of its rows (streams overlap), so parts can overlap each other;
``busy_ns`` is the union of everything. ``exposed_memcpy_ns``: copy time during which no kernel
ran on that device — copies the device did not hide behind compute. Figures are summed over devices.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.columns import str_codes
from srtscope.analyzers.names import copy_direction
from srtscope.analyzers.results import CopyStat, DeviceResult
from srtscope.analyzers.timeline import Timeline


def device_split(tl: Timeline, comm: np.ndarray, sets: DeviceSets | None = None) -> DeviceResult:
    """``comm``: mask of device rows that are collective kernels (``names.comm_mask``); ``sets``: the
    trace's device sets for that mask (built when None)."""
    dev = tl.device
    if len(dev) == 0:
        return DeviceResult(0, 0, 0, 0, 0, 0, {})
    s, e = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    sets = DeviceSets.of(tl, sets, comm)
    is_copy = sets.mask("copy")
    totals = dict.fromkeys(("busy", "kernel", "comm", "memcpy", "memset", "exposed"), 0)
    for key in sets.keys:
        copies = sets.union(key, "copy")
        totals["busy"] += iv.total(sets.union(key))
        totals["kernel"] += iv.total(sets.union(key, "kernel"))
        totals["comm"] += iv.total(sets.union(key, "comm"))
        totals["memcpy"] += iv.total(copies)
        totals["memset"] += iv.total(sets.union(key, "memset"))
        totals["exposed"] += iv.total(iv.subtract(copies, sets.union(key, "compute")))
    by_kind: dict[str, CopyStat] = {}
    if is_copy.any():
        codes, names = str_codes(dev["name"][is_copy])     # classified once per distinct name
        direction = np.array([copy_direction(str(n)) for n in names], dtype=object)
        pageable = np.array(["pageable" in str(n).lower() for n in names], dtype=bool)
        c = pd.DataFrame({"dir": direction[codes], "ns": e[is_copy] - s[is_copy],
                          "bytes": dev["bytes"].to_numpy()[is_copy], "pageable": pageable[codes]})
        for d, g in c.groupby("dir"):
            known = g["bytes"].to_numpy() >= 0
            by_kind[str(d)] = copy_stat(int(g["ns"].sum()), int(len(g)), int(g["bytes"].to_numpy()[known].sum()),
                                        int(g["ns"].to_numpy()[known].sum()),
                                        int(g["ns"].to_numpy()[g["pageable"].to_numpy()].sum()), bool(known.any()))
    return device_result(totals, by_kind)


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
