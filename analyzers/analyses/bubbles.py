"""Bubbles: per device, the gaps in the union of all its streams' activity inside the active window.

A bubble is a hole longer than ``threshold_ns`` between the device's first activity start and its
last activity end (nothing before or after counts). Devices are keyed by ``(rank, device)`` so rank
files merged into one Timeline keep their devices apart.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.results import HistogramBin
from srtscope.analyzers.timeline import Timeline

#: Histogram bin edges, µs (the last bin is open-ended).
HIST_EDGES_US: tuple[int, ...] = (0, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000)

BUBBLE_COLUMNS = ("rank", "device", "start_ns", "end_ns", "dur_ns", "next_row")


def find_bubbles(tl: Timeline, threshold_ns: int, sets: DeviceSets | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(bubbles, by_device, by_stream). ``sets``: the trace's device sets (built when None).

    bubbles: ``BUBBLE_COLUMNS``; ``next_row`` is the device-table row that ends the bubble (the first
    activity after it). by_device: rank, device, window_ns, busy_ns, bubble_count, bubble_ns,
    small_gap_count, small_gap_ns (gaps at or under the threshold: not bubbles), busy_pct.
    by_stream: rank, device, stream, busy_ns, gap_count, gap_ns (the per-stream view).
    """
    if threshold_ns < 0:
        raise ValueError(f"threshold_ns must be >= 0, got {threshold_ns}")
    sets = DeviceSets.of(tl, sets)
    parts, devrows = [], []
    for rank, device in sets.keys:
        u = sets.union((rank, device))
        window = int(u[1][-1] - u[0][0]) if len(u[0]) else 0
        busy = iv.total(u)
        gs, ge = iv.gaps(u, threshold_ns)
        n_all = max(len(u[0]) - 1, 0)
        small_ns = window - busy - int((ge - gs).sum())
        # next activity: the device's row whose start equals the gap's end
        nxt = sets.next_rows((rank, device), ge) if len(ge) else np.zeros(0, np.int64)
        parts.append(pd.DataFrame({"rank": rank, "device": device, "start_ns": gs, "end_ns": ge,
                                   "dur_ns": ge - gs, "next_row": nxt}))
        devrows.append({"rank": rank, "device": device, "window_ns": window, "busy_ns": busy,
                        "bubble_count": len(gs), "bubble_ns": int((ge - gs).sum()),
                        "small_gap_count": n_all - len(gs), "small_gap_ns": small_ns,
                        "busy_pct": round(100.0 * busy / window, 2) if window else 0.0})
    bubbles = (pd.concat(parts, ignore_index=True) if parts
               else pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in BUBBLE_COLUMNS}))
    for c in BUBBLE_COLUMNS:
        bubbles[c] = bubbles[c].astype(np.int64)
    by_device = pd.DataFrame(devrows, columns=["rank", "device", "window_ns", "busy_ns", "bubble_count",
                                               "bubble_ns", "small_gap_count", "small_gap_ns", "busy_pct"])
    return bubbles, by_device, stream_view(tl, threshold_ns, sets)


def stream_view(tl: Timeline, threshold_ns: int, sets: DeviceSets | None = None) -> pd.DataFrame:
    """Per (rank, device, stream): busy time and the gaps of that stream alone."""
    dev = tl.device
    cols = ["rank", "device", "stream", "busy_ns", "gap_count", "gap_ns"]
    if len(dev) == 0:
        return pd.DataFrame(columns=cols)
    sets = DeviceSets.of(tl, sets)
    out = []
    for rank, device in sets.keys:
        for stream, u in sets.stream_unions((rank, device)):
            gs, ge = iv.gaps(u, threshold_ns)
            out.append((rank, device, stream, iv.total(u), len(gs), int((ge - gs).sum())))
    return pd.DataFrame(out, columns=cols).sort_values(["rank", "device", "stream"], ignore_index=True)


def histogram(dur_ns: np.ndarray) -> tuple[HistogramBin, ...]:
    """Bubble durations binned on ``HIST_EDGES_US`` (count and summed time per bin)."""
    edges = np.asarray(HIST_EDGES_US, dtype=np.int64) * 1000
    d = np.asarray(dur_ns, dtype=np.int64)
    idx = np.searchsorted(edges, d, side="right") - 1
    counts = np.bincount(idx, minlength=len(edges)) if len(d) else np.zeros(len(edges), np.int64)
    totals = np.bincount(idx, weights=d, minlength=len(edges)) if len(d) else np.zeros(len(edges))
    return tuple(HistogramBin(int(edges[i]), int(edges[i + 1]) if i + 1 < len(edges) else None,
                              int(counts[i]), int(totals[i])) for i in range(len(edges)))
