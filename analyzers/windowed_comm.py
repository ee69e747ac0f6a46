"""Collectives in the windowed path: matched once across every rank, the straggler's device view
added up over the windows.

``comm.finish`` matches the collectives of all participants (skew, transfer, the straggler) from their
rows alone — gathered whole in the first pass (a few per step, not the kernels) — except the
straggler's ``device_busy_before``, which reads its device's rows in the time before its arrivals.
``straggler_queries`` runs ``finish`` once before the windows to learn that time; each window adds
the busy time of its own share (``busy_in_window``); ``comm_result`` runs ``finish`` again with the sums.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.comm import finish
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.results import CommResult
from srtscope.analyzers.timeline import Timeline

Key = tuple[int, int]
Queries = dict[Key, tuple[np.ndarray, np.ndarray]]


def straggler_queries(small: Timeline, source: str, inst: pd.DataFrame, min_skew_ns: int) -> Queries:
    """Per straggler device (one at most), the ``[arrival - skew, arrival)`` windows, ns, whose busy
    share ``finish`` asks for. ``small``: the trace's metadata and ranges (no device rows)."""
    asked: Queries = {}

    def record(rank: int, device: int, arrive: np.ndarray, skew: np.ndarray) -> None:
        asked[(rank, device)] = (arrive - skew, arrive)
        return None
    finish(small, source, inst, 0, 0, min_skew_ns, np.zeros(0, bool), DeviceSets(small), record)
    return asked


def busy_in_window(sets: DeviceSets, w, queries: Mapping[Key, tuple[np.ndarray, np.ndarray]]) -> dict[Key, int]:
    """Per asked device: its non-collective busy time inside the window ``w`` (a ``windowed.Window``)
    and inside the asked windows, ns (each asked window counted on its own, as ``device_busy_before``)."""
    out = {}
    for key, (q0, q1) in queries.items():
        if key in sets.keys:
            u = iv.clip(sets.union(key, "noncomm"), w.lo_ns, w.hi_ns)
            out[key] = int(iv.overlap(u, q0, q1).sum()) if len(u[0]) else 0
    return out


def comm_result(small: Timeline, source: str, inst: pd.DataFrame, total: int, exposed: int, min_skew_ns: int,
                busy: Sequence[Mapping[Key, int]]) -> CommResult:
    """``comm.finish`` over every collective, the straggler's busy share from the windows' ``busy``."""
    def busy_of(rank: int, device: int, arrive: np.ndarray, skew: np.ndarray) -> float | None:
        t = int(skew.sum())
        if t <= 0:
            return None
        return float(sum(b.get((rank, device), 0) for b in busy)) / t
    return finish(small, source, inst, total, exposed, min_skew_ns, np.zeros(0, bool), DeviceSets(small), busy_of)
