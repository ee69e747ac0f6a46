"""Top kernels: the device activities with the most summed time (kernels, graphs and CPU stand-in
forwards; collectives are communication, left out), and kernel rows per name (the capture's
one-pass check). A window's part (``kernels_part``: its owned rows) and the parts' combine
(``top_kernels``, ``kernel_counts``); a whole read is one window.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model.columns import isin, time_by_name
from srtscope.analyzers.model.timeline import DeviceKind

TOP_KERNEL_COLUMNS = ("name", "count", "total_ns", "mean_ns", "share")
#: per name, [rows, summed ns] of the top-kernel candidates
Candidates = dict[str, list[int]]


def kernels_part(dev: pd.DataFrame, lo: int, hi: int, comm: np.ndarray) -> tuple[Candidates, dict[str, int]]:
    """The rows of ``dev`` starting in ``[lo, hi)``: the top-kernel candidates per name, and the
    kernel rows per name. ``comm``: mask of ``dev``'s collective rows (``names.comm_mask``)."""
    if len(dev) == 0:
        return {}, {}
    st = dev["start_ns"].to_numpy()
    top = isin(dev["kind"], [DeviceKind.KERNEL, DeviceKind.CPU_FORWARD, DeviceKind.GRAPH]) & ~comm
    km = isin(dev["kind"], [DeviceKind.KERNEL])
    if not (st.min() >= lo and st.max() < hi):      # rows of other windows: the owned ones only
        own = (st >= lo) & (st < hi)
        top = top & own
        km = km & own
    cand, kernels = time_by_name(dev["name"], [top, km], st, dev["end_ns"].to_numpy())
    return cand, {k: v[0] for k, v in kernels.items()}


def top_kernels(parts: list[Candidates], n: int) -> pd.DataFrame:
    """The ``n`` names with the most summed time over the windows' candidates (``kernels_part``):
    ``TOP_KERNEL_COLUMNS``, share of all the candidates' time."""
    acc: Candidates = {}
    for p in parts:
        for k, (c, t) in p.items():
            a = acc.setdefault(k, [0, 0])
            a[0] += c
            a[1] += t
    if not acc or n == 0:
        return pd.DataFrame(columns=list(TOP_KERNEL_COLUMNS))
    names = np.array(sorted(acc), dtype=object)
    count = np.array([acc[k][0] for k in names], np.int64)
    sums = np.array([acc[k][1] for k in names], np.int64)
    total = int(sums.sum())
    # per name, in name order: what a groupby on the names gives, before the sort by time
    g = pd.DataFrame({"count": count, "sum": sums}, index=pd.Index(names, name="name"))
    g = g.sort_values("sum", ascending=False).head(n)
    return pd.DataFrame({"name": g.index.to_numpy(), "count": g["count"].to_numpy(np.int64),
                         "total_ns": g["sum"].to_numpy(np.int64),
                         "mean_ns": (g["sum"] // g["count"]).to_numpy(np.int64),
                         "share": np.round(g["sum"].to_numpy() / total, 4) if total else 0.0})


def kernel_counts(parts: list[dict[str, int]]) -> np.ndarray:
    """Kernel rows per name (names with any, in name order) over the windows' ``kernels_part``."""
    counts: dict[str, int] = {}
    for p in parts:
        for k, v in p.items():
            counts[k] = counts.get(k, 0) + v
    return np.array([counts[k] for k in sorted(counts)], np.int64)
