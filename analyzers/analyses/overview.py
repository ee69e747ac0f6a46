"""Overview: each device's active window in a fixed number of bins — what the device ran and what
its bubbles were blamed on, per bin — for plots that stay small whatever the trace's size.

Per (rank, device) and bin (ns): busy time by kernels (collectives excluded), copies and memsets,
and collectives (each a union, so ≤ the bin's width); bubble time per class, spread over each
bubble's span in proportion to its class mix (a bubble's classes are known per bubble, not per
instant). Step starts on that rank are listed for markers. A window's part (``bins_part``) and the
parts' combine (``overview_of``); a whole read is one window.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.results import DeviceOverview, OverviewResult
from srtscope.analyzers.model.vocab import BUBBLE_CLASSES

DEFAULT_BINS = 400


Bins = dict[tuple[tuple[int, int], str], np.ndarray]


def bins_part(sets: DeviceSets, bounds: dict[tuple[int, int], tuple[int, int]], lo: int, hi: int,
              bins: int = DEFAULT_BINS) -> Bins:
    """A window ``[lo, hi)``'s share: per device and class (kernel, copyset, comm), the class's time
    in each of the ``bins`` bins of the device's active window (``bounds``: the whole trace's)."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    out = {}
    for key in sets.keys:
        edges = bin_edges(*bounds[key], bins)
        for cls in ("kernel", "copyset", "comm"):
            out[(key, cls)] = np.diff(iv.covered_upto(iv.clip(sets.union(key, cls), lo, hi), edges))
    return out


def overview_of(parts: list[Bins], bounds: dict[tuple[int, int], tuple[int, int]], bubbles: pd.DataFrame,
                steps: pd.DataFrame, bins: int = DEFAULT_BINS) -> OverviewResult:
    """The windows' ``bins_part`` added up per device (``bounds``' keys, sorted); ``bubbles``: the
    bubble table (rank, device, start_ns, end_ns, dur_ns, ``<class>_ns``)."""
    out = []
    for key in sorted(bounds):
        edges = bin_edges(*bounds[key], bins)
        per_bin = {}
        for cls in ("kernel", "copyset", "comm"):
            got = [p[(key, cls)] for p in parts if (key, cls) in p]
            per_bin[cls] = np.sum(got, axis=0) if got else np.zeros(bins, np.int64)
        out.append(device_overview(key, bounds[key], edges, per_bin, bubbles, steps))
    return OverviewResult(bins, tuple(out))


def device_overview(key: tuple[int, int], bounds: tuple[int, int], edges: np.ndarray,
                    per_bin: dict[str, np.ndarray], bubbles: pd.DataFrame, steps: pd.DataFrame) -> DeviceOverview:
    """One device's overview: ``per_bin`` the kernel, copyset and comm time in each bin of
    ``edges`` (``bin_edges`` of its ``bounds``); its bubbles' class time spread over the bins."""
    (rank, device), (lo, hi) = key, bounds
    b = bubbles[(bubbles["rank"] == rank) & (bubbles["device"] == device)] if len(bubbles) else bubbles
    by_class = {c: _spread(b, f"{c}_ns", edges) for c in BUBBLE_CLASSES}
    st = steps[steps["rank"] == rank]["start_ns"].to_numpy() if len(steps) else np.zeros(0, np.int64)
    kernel, copyset, comm = (per_bin[c].astype(int).tolist() for c in ("kernel", "copyset", "comm"))
    return DeviceOverview(int(rank), int(device), lo, int(edges[1] - edges[0]), kernel, copyset, comm,
                          {c: v for c, v in by_class.items() if any(v)}, [int(x) for x in st[(st >= lo) & (st < hi)]])


def bin_edges(lo: int, hi: int, bins: int) -> np.ndarray:
    """``bins + 1`` edges of equal bins from ``lo`` covering ``[lo, hi)``, ns (at least 1 ns wide)."""
    width = max(-(-(hi - lo) // bins), 1)                       # ceil: the bins cover the window
    return lo + width * np.arange(bins + 1, dtype=np.int64)


def _spread(b: pd.DataFrame, col: str, edges: np.ndarray) -> list[int]:
    """Per bin, the part of ``col`` (ns per bubble) spread uniformly over each bubble's span."""
    if len(b) == 0 or col not in b:
        return [0] * (len(edges) - 1)
    bs, be = b["start_ns"].to_numpy(np.float64), b["end_ns"].to_numpy(np.float64)
    ns = b[col].to_numpy(np.float64)
    keep = (ns > 0) & (be > bs)
    bs, be, ns = bs[keep], be[keep], ns[keep]
    if len(bs) == 0:
        return [0] * (len(edges) - 1)
    d = ns / (be - bs)                                          # class ns per ns of the bubble

    def integral(t: np.ndarray) -> np.ndarray:
        """F(t) = sum_i d_i * |[s_i, e_i) ∩ (-inf, t)|, by sorted prefix sums."""
        os_, oe = np.argsort(bs), np.argsort(be)
        cs = np.r_[0.0, np.cumsum(d[os_])]
        css = np.r_[0.0, np.cumsum(d[os_] * bs[os_])]
        ce = np.r_[0.0, np.cumsum(d[oe])]
        cse = np.r_[0.0, np.cumsum(d[oe] * be[oe])]
        i = np.searchsorted(bs[os_], t, side="left")
        j = np.searchsorted(be[oe], t, side="left")
        return (t * cs[i] - css[i]) - (t * ce[j] - cse[j])

    f = integral(edges.astype(np.float64))
    return np.maximum(np.rint(np.diff(f)), 0).astype(int).tolist()
