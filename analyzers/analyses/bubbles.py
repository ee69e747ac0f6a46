"""Bubbles: per device, the gaps in the union of all its streams' activity inside the active window.

Each figure is a window's part (``gaps_part``, ``streams_part``: from the rows of the window's
context) and the parts' combine (``by_device``, ``by_stream``); a whole read is one window.

A bubble is a hole longer than ``threshold_ns`` between the device's first activity start and its
last activity end (nothing before or after counts). Devices are keyed by ``(rank, device)`` so rank
files merged into one Timeline keep their devices apart.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.attribution import BUBBLE_CAUSES
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.results import BUBBLE_CLASSES, BubbleResult, HistogramBin

#: Histogram bin edges, µs (the last bin is open-ended).
HIST_EDGES_US: tuple[int, ...] = (0, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000)

BUBBLE_COLUMNS = ("rank", "device", "start_ns", "end_ns", "dur_ns", "next_row")


BY_DEVICE_COLUMNS = ("rank", "device", "window_ns", "busy_ns", "bubble_count", "bubble_ns", "small_gap_count",
                     "small_gap_ns", "busy_pct")
BY_STREAM_COLUMNS = ("rank", "device", "stream", "busy_ns", "gap_count", "gap_ns")

Key = tuple[int, int]


def gaps_part(sets: DeviceSets, lo: int, hi: int, threshold_ns: int
              ) -> tuple[pd.DataFrame, dict[Key, int], dict[Key, int]]:
    """A window ``[lo, hi)``'s share of each device's gaps, from the rows in its context (``sets``):
    (the bubbles touching it, ``BUBBLE_COLUMNS``, ``next_row`` the device row ending each; per
    device its busy ns inside the window; per device its gaps of any length starting in it)."""
    if threshold_ns < 0:
        raise ValueError(f"threshold_ns must be >= 0, got {threshold_ns}")
    rows, busy, gaps = [], {}, {}
    for key in sets.keys:
        u = sets.union(key)
        busy[key] = iv.measure_in(u, lo, hi)
        gaps[key] = iv.count_gaps_from(u, lo, hi)
        gs, ge = iv.gaps(u, threshold_ns)
        near = (ge > lo) & (gs < hi)
        gs, ge = gs[near], ge[near]
        nxt = sets.next_rows(key, ge) if len(ge) else np.zeros(0, np.int64)
        rows.append(pd.DataFrame({"rank": key[0], "device": key[1], "start_ns": gs, "end_ns": ge,
                                  "dur_ns": ge - gs, "next_row": nxt}))
    bub = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        {c: pd.Series([], dtype=np.int64) for c in BUBBLE_COLUMNS})
    for c in bub.columns:
        bub[c] = bub[c].astype(np.int64)
    return bub, busy, gaps


def by_device(bounds: dict[Key, tuple[int, int]], busy: list[dict[Key, int]], gaps: list[dict[Key, int]],
              table: pd.DataFrame) -> pd.DataFrame:
    """Per device (``bounds``: its active window, sorted keys), ``BY_DEVICE_COLUMNS``: the windows'
    ``gaps_part`` busy and gap counts added up, its bubbles in ``table``; the gaps at or under the
    threshold are the rest of the window."""
    rows = []
    for key in sorted(bounds):
        lo, hi = bounds[key]
        window = int(hi - lo)
        b = sum(p.get(key, 0) for p in busy)
        n_all = sum(p.get(key, 0) for p in gaps)
        mine = table[(table["rank"] == key[0]) & (table["device"] == key[1])]
        bns = int(mine["dur_ns"].sum())
        rows.append({"rank": key[0], "device": key[1], "window_ns": window, "busy_ns": b,
                     "bubble_count": len(mine), "bubble_ns": bns, "small_gap_count": n_all - len(mine),
                     "small_gap_ns": window - b - bns,
                     "busy_pct": round(100.0 * b / window, 2) if window else 0.0})
    return pd.DataFrame(rows, columns=list(BY_DEVICE_COLUMNS))


def streams_part(sets: DeviceSets, lo: int, hi: int, threshold_ns: int) -> dict[tuple[int, int, int], list[int]]:
    """Per (rank, device, stream): [first, last, busy, gap count, gap ns] of its activity clipped to
    the window ``[lo, hi)``."""
    out: dict[tuple[int, int, int], list[int]] = {}
    for key in sets.keys:
        for stream, u in sets.stream_unions(key):
            u = iv.clip(u, lo, hi)
            if not len(u[0]):
                continue
            gs, ge = iv.gaps(u, threshold_ns)
            out[(key[0], key[1], stream)] = [int(u[0][0]), int(u[1][-1]), iv.total(u), len(gs), int((ge - gs).sum())]
    return out


def by_stream(parts: list[dict[tuple[int, int, int], list[int]]], threshold_ns: int) -> pd.DataFrame:
    """Per (rank, device, stream), ``BY_STREAM_COLUMNS``: the windows' ``streams_part`` in time
    order added up, the gap across each window edge counted where over the threshold."""
    acc: dict[tuple[int, int, int], list[int]] = {}
    for p in parts:
        for k, (first, last, busy, n, ns) in p.items():
            a = acc.get(k)
            if a is None:
                acc[k] = [last, busy, n, ns]
                continue
            gap = first - a[0]
            if gap > threshold_ns:
                a[2] += 1
                a[3] += gap
            a[0] = last
            a[1] += busy
            a[2] += n
            a[3] += ns
    out = [(k[0], k[1], k[2], a[1], a[2], a[3]) for k, a in acc.items()]
    if not out:
        return pd.DataFrame(columns=list(BY_STREAM_COLUMNS))
    return pd.DataFrame(out, columns=list(BY_STREAM_COLUMNS)).sort_values(["rank", "device", "stream"],
                                                                          ignore_index=True)


def histogram(dur_ns: np.ndarray) -> tuple[HistogramBin, ...]:
    """Bubble durations binned on ``HIST_EDGES_US`` (count and summed time per bin)."""
    edges = np.asarray(HIST_EDGES_US, dtype=np.int64) * 1000
    d = np.asarray(dur_ns, dtype=np.int64)
    idx = np.searchsorted(edges, d, side="right") - 1
    counts = np.bincount(idx, minlength=len(edges)) if len(d) else np.zeros(len(edges), np.int64)
    totals = np.bincount(idx, weights=d, minlength=len(edges)) if len(d) else np.zeros(len(edges))
    return tuple(HistogramBin(int(edges[i]), int(edges[i + 1]) if i + 1 < len(edges) else None,
                              int(counts[i]), int(totals[i])) for i in range(len(edges)))
def bubble_pieces(bubbles: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Bubbles cut at their rank's step boundaries; ``step_row`` = row of ``steps`` holding the piece."""
    parts = []
    for rank, bidx in (bubbles.groupby("rank").indices.items() if len(bubbles) else []):
        b = bubbles.iloc[bidx]
        st = steps[steps["rank"] == rank]
        cuts = np.r_[st["start_ns"].to_numpy(), st["end_ns"].to_numpy()]
        ps, pe, src = iv.split_at(b["start_ns"].to_numpy(), b["end_ns"].to_numpy(), cuts)
        row = np.full(len(ps), -1, np.int64)
        if len(st):
            order = np.argsort(st["start_ns"].to_numpy(), kind="stable")
            s_sorted = st["start_ns"].to_numpy()[order]
            pos = np.searchsorted(s_sorted, ps, side="right") - 1
            ok = pos >= 0
            cand = order[np.maximum(pos, 0)]
            ok &= ps < st["end_ns"].to_numpy()[cand]
            row = np.where(ok, st.index.to_numpy()[cand], -1)
        parts.append(pd.DataFrame({"bubble": bidx[src], "rank": rank, "device": b["device"].to_numpy()[src],
                                   "pid": b["pid"].to_numpy()[src], "tid": b["tid"].to_numpy()[src],
                                   "start_ns": ps, "end_ns": pe, "step_row": row,
                                   "queued_ns": b["queued_ns"].to_numpy()[src]}))
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in
                             ("bubble", "rank", "device", "pid", "tid", "start_ns", "end_ns", "step_row",
                              "queued_ns")})
    return pd.concat(parts, ignore_index=True)


def bubble_result(bubbles: pd.DataFrame, pieces: pd.DataFrame, stages: pd.DataFrame, by_device: pd.DataFrame,
                  by_stream: pd.DataFrame, user_ranges: dict[str, int], threshold_ns: int,
                  has_ranges: bool) -> BubbleResult:
    """The bubble figures: ``bubbles`` (rank, device, pid, tid, start_ns, end_ns, dur_ns; row = the
    pieces' ``bubble``) with their attributed ``pieces`` and per-piece ``stages`` (``attribute``'s)
    summed per bubble; ``has_ranges``: the trace has host ranges (NVTX coverage is then known)."""
    ccols = [f"{c}_ns" for c in BUBBLE_CLASSES] + ["covered_ns"]
    kcols = [f"cause.{c}_ns" for c in BUBBLE_CAUSES]
    per_bubble = pieces.groupby("bubble")[ccols].sum() if len(pieces) else pd.DataFrame(columns=ccols)
    table = bubbles.join(per_bubble)
    for c in ccols:
        table[c] = table[c].fillna(0).astype(np.int64)
    if stages.shape[1]:
        sb = stages.groupby(pieces["bubble"]).sum()
        top = sb.idxmax(axis=1).where(sb.max(axis=1) > 0, "")
        table["top_stage"] = top.reindex(table.index).fillna("")
    else:
        table["top_stage"] = ""
    total = int(table["dur_ns"].sum())
    by_stage = stages.sum(axis=0).sort_values(ascending=False) if stages.shape[1] else pd.Series(dtype=np.int64)
    by_cause = {c: int(pieces[k].sum()) for c, k in zip(BUBBLE_CAUSES, kcols)} if len(pieces) else {}
    return BubbleResult(
        count=len(table), total_ns=total, window_ns=int(by_device["window_ns"].sum()),
        busy_ns=int(by_device["busy_ns"].sum()),
        by_class={c: int(table[f"{c}_ns"].sum()) for c in BUBBLE_CLASSES},
        by_stage={str(k): int(v) for k, v in by_stage.items() if v > 0},
        by_user_range=user_ranges,
        histogram=histogram(table["dur_ns"].to_numpy()), threshold_ns=threshold_ns,
        nvtx_coverage=(float(table["covered_ns"].sum()) / total) if total and has_ranges else None,
        table=table, by_device=by_device, by_stream=by_stream,
        by_cause={c: v for c, v in by_cause.items() if v > 0},
        sub_threshold_ns=int(by_device["small_gap_ns"].sum()) if len(by_device) else 0,
        sub_threshold_count=int(by_device["small_gap_count"].sum()) if len(by_device) else 0)
