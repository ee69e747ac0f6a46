"""Communication: collective kernels, the part not overlapped by compute, and cross-rank skew.

Collectives are device rows of ``names.comm_mask`` (the ``names.COMM_FAMILIES`` table) (source ``kernels``, or
``stand_in`` when they are a probe trace's CPU stand-in rows); in traces with no such rows the
``comm.all_reduce`` ranges stand in (source ``ranges``). Per participant (rank, device) the
collectives are paired in order after aligning the sequences on end times; per collective:
arrival skew = latest start - earliest start, transfer = shortest duration, straggler = latest
arrival. The straggler is the participant latest in most collectives whose skew exceeds
``min_skew_ns``, named only when its lateness beyond its natural jitter (``lateness``) is at least
``STRAGGLER_SKEW_SHARE`` of the summed skew; what its host was doing is the stage range most present
just before it arrived.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.columns import group_rows, isin, str_codes
from srtscope.analyzers.host_activity import innermost_segments, stage_names
from srtscope.analyzers.names import comm_mask
from srtscope.analyzers.results import CommResult
from srtscope.analyzers.timeline import DeviceKind, Timeline
from srtscope.probes.stages import Stage, resolve_stage

BusyBefore = Callable[[int, int, np.ndarray, np.ndarray], "float | None"]
"""(rank, device, arrivals, skews) -> the device's busy share before the arrivals (``device_busy_before``)."""

COLLECTIVE_COLUMNS = ("index", "name", "start_ns", "skew_ns", "transfer_ns", "straggler_rank",
                      "straggler_device")


def split_compute(compute: iv.IntervalSet, comm: iv.IntervalSet, stand_in: bool
                  ) -> tuple[iv.IntervalSet, iv.IntervalSet]:
    """(compute, exposed communication) of one device from the unions of its rows.

    On a device, a collective overlapped by a kernel on another stream is hidden. NOTE: CPU
    stand-in rows nest instead: a forward span contains its own all-reduces on the same host
    thread, so there compute is the forward minus its collectives and every collective is exposed.
    """
    if stand_in:
        return iv.subtract(compute, comm), comm
    return compute, iv.subtract(comm, compute)


def _instances(tl: Timeline, mask: np.ndarray) -> tuple[str, pd.DataFrame]:
    """(source, rows with rank, device, start_ns, end_ns, name) of the collectives."""
    if mask.any():
        stand_in = isin(tl.device["kind"], [DeviceKind.CPU_FORWARD])[mask].all()
        return ("stand_in" if stand_in else "kernels"), \
            tl.device.loc[mask, ["rank", "device", "start_ns", "end_ns", "name"]].reset_index(drop=True)
    rg = tl.host_ranges
    if len(rg):
        codes, cats = str_codes(rg["name"])
        lut = np.array([resolve_stage(n) == Stage.COMM_ALL_REDUCE for n in cats] + [False])
        m = lut[codes]
        if m.any():
            r = rg[m]
            return "ranges", pd.DataFrame({"rank": r["rank"].to_numpy(), "device": -1,
                                           "start_ns": r["start_ns"].to_numpy(),
                                           "end_ns": r["end_ns"].to_numpy(), "name": r["name"].to_numpy()})
    return "none", pd.DataFrame(columns=["rank", "device", "start_ns", "end_ns", "name"])


def communication(tl: Timeline, mask: np.ndarray | None = None, min_skew_ns: int = 10_000,
                  sets: DeviceSets | None = None) -> CommResult:
    """``mask``: ``comm_mask``'s rows (computed when None); ``sets``: the trace's device sets for
    that mask (built when None)."""
    mask = comm_mask(tl.device) if mask is None else mask
    sets = DeviceSets.of(tl, sets, mask)
    source, inst = _instances(tl, mask)
    total = exposed = 0
    if len(inst):
        for (rank, device), idx in group_rows(inst, ["rank", "device"]).items():
            rank, device = int(rank), int(device)
            # collective rows of one device: that device's comm union (ranges: their own union)
            c = (iv.union(inst["start_ns"].to_numpy()[idx], inst["end_ns"].to_numpy()[idx])
                 if source == "ranges" else sets.union((rank, device), "comm"))
            k = sets.union((rank, device), "noncomm") if device >= 0 else sets.rank_union(rank, "noncomm")
            total += iv.total(c)
            exposed += iv.total(split_compute(k, c, source == "stand_in")[1])
    return finish(tl, source, inst, total, exposed, min_skew_ns, mask, sets)


def finish(tl: Timeline, source: str, inst: pd.DataFrame, total: int, exposed: int, min_skew_ns: int,
           mask: np.ndarray, sets: DeviceSets, busy_of: BusyBefore | None = None) -> CommResult:
    """The result from the collectives' rows (``_instances``) and their summed and exposed time:
    matched across participants, skew, transfer, the straggler. ``busy_of(rank, device, arrive_ns,
    skew_ns)``: the straggler's ``device_busy_before`` (read from ``tl``'s device rows when None)."""
    coll, parts, arrive_ns = _match(inst)
    strag_rank = strag_dev = share = stage = busy_before = None
    offset = np.zeros(0, np.int64)
    skew = int(coll["skew_ns"].sum()) if len(coll) else 0
    transfer = int(coll["transfer_ns"].sum()) if len(coll) else 0
    if len(coll):
        sig = coll[coll["skew_ns"] > min_skew_ns]
        if len(sig):
            who = sig.groupby(["straggler_rank", "straggler_device"]).size().sort_values()
            (r, d), n = who.index[-1], int(who.iloc[-1])
            g = parts.index((int(r), int(d)))
            cand = arrive_ns[g] - np.delete(arrive_ns, g, axis=0).max(axis=0)
            lead, natural = lateness(cand)
            # named only when its own lateness beyond its jitter is most of the skew: ranks late in turn
            # (a busy host, no straggler) leave about none
            if skew > 0 and float(lead.sum()) - len(lead) * natural >= STRAGGLER_SKEW_SHARE * skew:
                offset, share = cand, n / len(sig)
                ranks = {p[0] for p in parts}
                strag_rank = int(r) if len(ranks) > 1 else None
                strag_dev = int(d) if len(ranks) == 1 and len(parts) > 1 else None
                mine = sig[(sig["straggler_rank"] == r) & (sig["straggler_device"] == d)].nlargest(20, "skew_ns")
                arrive = mine["start_ns"].to_numpy() + mine["skew_ns"].to_numpy()
                stage = _host_stage_before(tl, int(r), arrive, mine["skew_ns"].to_numpy())
                if source == "kernels":   # a CPU stand-in's "device" is the host itself: no separate view
                    busy_before = (busy_of or partial(device_busy_before, tl, mask=mask, sets=sets))(
                        int(r), int(d), arrive, mine["skew_ns"].to_numpy())
    return CommResult(total_ns=int(total), exposed_ns=int(exposed), skew_ns=skew, transfer_ns=transfer,
                      n_kernels=len(inst), participants=len(parts), straggler_rank=strag_rank,
                      straggler_device=strag_dev, straggler_share=share, straggler_host_stage=stage,
                      straggler_device_busy=busy_before,
                      source=source, collectives=coll, straggler_offset_ns=offset)


STRAGGLER_SKEW_SHARE = 0.5
"""A straggler is named when its lateness beyond its natural jitter is at least this share of the
collectives' summed arrival skew. Measured on the engine at tp=2: 72-93% with a straggler injected,
-14..18% without one (ranks late in turn)."""


def lateness(offset_ns: np.ndarray) -> tuple[np.ndarray, float]:
    """(lead per collective, natural jitter per collective), ns, from a participant's offsets (its
    arrival - the latest other participant's). Lead = ``max(offset, 0)``: how long it alone held the
    collective back. Natural = the mirror of its early side, ``mean(max(median - offset, 0))``: the
    lateness it would show anyway were it on time, if its jitter is symmetric."""
    off = offset_ns.astype(np.int64)
    if len(off) == 0:
        return off, 0.0
    return np.maximum(off, 0), float(np.mean(np.maximum(np.median(off) - off, 0)))


SHIFT_REACH = 8
"""Shifts (in collectives) tried around each seed when aligning one participant to another."""


def _nearest(sorted_t: np.ndarray, t: int) -> int:
    i = int(np.searchsorted(sorted_t, t))
    if i > 0 and (i == len(sorted_t) or t - sorted_t[i - 1] <= sorted_t[i] - t):
        i -= 1
    return i


def _shift(ref_end: np.ndarray, end: np.ndarray) -> int:
    """The shift k that pairs ``ref[i]`` with ``other[i - k]`` best: smallest median end-time gap.

    A collective completes on every participant at about the same time, whatever their arrival, so
    end times line up even when capture windows start or stop at different collectives. Tried:
    shifts near 0 and near the shifts that pair the other's first and last collective with the
    reference's nearest in time. Ties go to the smaller |k| (files of equal counts pair by order).
    """
    n_ref, n = len(ref_end), len(end)
    need = max(1, min(n_ref, n) // 2)
    ref_sorted = np.sort(ref_end)
    seeds = {0, _nearest(ref_sorted, int(end[0])), _nearest(ref_sorted, int(end[-1])) - (n - 1)}
    candidates = sorted({k for c in seeds for k in range(c - SHIFT_REACH, c + SHIFT_REACH + 1)}, key=abs)
    best, best_gap = 0, None
    for k in candidates:
        lo, hi = max(0, k), min(n_ref, n + k)
        if hi - lo < need:
            continue
        gap = float(np.median(np.abs(ref_end[lo:hi] - end[lo - k:hi - k])))
        if best_gap is None or gap < best_gap:
            best, best_gap = k, gap
    return best


def _match(inst: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[int, int]], np.ndarray]:
    """One row per collective that every participant holds: earliest start, skew, transfer, straggler;
    the participants (rank, device); their arrivals (participants x collectives, ns)."""
    empty = pd.DataFrame({c: pd.Series([], dtype=object if c == "name" else np.int64)
                          for c in COLLECTIVE_COLUMNS})
    none = np.zeros((0, 0), np.int64)
    if len(inst) == 0:
        return empty, [], none
    groups = sorted(group_rows(inst, ["rank", "device"]).items())
    parts = [(int(k[0]), int(k[1])) for k, _ in groups]
    if len(groups) < 2 or min(len(v) for _, v in groups) == 0:
        return empty, parts, none
    s = inst["start_ns"].to_numpy()
    e = inst["end_ns"].to_numpy()
    order = [idx[np.argsort(s[idx], kind="stable")] for _, idx in groups]
    ref = max(range(len(order)), key=lambda g: len(order[g]))   # the fullest window is the reference
    shifts = [0 if g == ref else _shift(e[order[ref]], e[order[g]]) for g in range(len(order))]
    lo = max(max(shifts), 0)
    hi = min(min(len(o) + k for o, k in zip(order, shifts)), len(order[ref]))
    if hi <= lo:
        return empty, parts, none
    rows = [o[lo - k:hi - k] for o, k in zip(order, shifts)]
    S = np.vstack([s[r] for r in rows])
    D = np.vstack([e[r] - s[r] for r in rows])
    late = S.argmax(axis=0)
    pr = np.array([p[0] for p in parts])
    pd_ = np.array([p[1] for p in parts])
    # NOTE: a categorical stays one (codes into the trace's names): 1.4 M matched names as strings
    # took 90 MiB and most of the matching's time
    col = inst["name"]
    names = col.array[rows[ref]] if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy()[rows[ref]]
    return pd.DataFrame({"index": np.arange(hi - lo), "name": names,
                         "start_ns": S.min(axis=0), "skew_ns": S.max(axis=0) - S.min(axis=0),
                         "transfer_ns": D.min(axis=0), "straggler_rank": pr[late],
                         "straggler_device": pd_[late]}), parts, S


def _host_stage_before(tl: Timeline, rank: int, arrive_ns: np.ndarray, skew_ns: np.ndarray) -> str | None:
    """The innermost stage range (name) most present on the rank's host in [arrival - skew, arrival)."""
    rg = tl.host_ranges
    if len(rg) == 0 or len(arrive_ns) == 0:
        return None
    names, codes, _ = stage_names(rg)
    comm = np.array([resolve_stage(n) == Stage.COMM_ALL_REDUCE for n in names], dtype=bool)
    on = (rg["rank"].to_numpy() == rank) & (codes >= 0)
    q0 = arrive_ns - skew_ns
    per_name = np.zeros(len(names), np.int64)
    sub = rg[on]
    for _, idx in (sub.groupby(["pid", "tid"]).indices.items() if len(sub) else []):
        rows = np.flatnonzero(on)[idx]
        ls, le, ll = innermost_segments(rg["start_ns"].to_numpy()[rows], rg["end_ns"].to_numpy()[rows],
                                        codes[rows])
        for code in np.unique(ll):
            m = ll == code
            per_name[code] += int(iv.overlap((ls[m], le[m]), q0, arrive_ns).sum())
    per_name[comm] = 0
    if not len(per_name) or per_name.max() <= 0:
        return None
    return str(names[int(per_name.argmax())])


def device_busy_before(tl: Timeline, rank: int, device: int, arrive_ns: np.ndarray, skew_ns: np.ndarray,
                       mask: np.ndarray, sets: DeviceSets | None = None) -> float | None:
    """Share of [arrival - skew, arrival) windows in which the participant's device ran non-comm work."""
    total = int(skew_ns.sum())
    if total <= 0:
        return None
    sets = DeviceSets.of(tl, sets, mask)
    busy = sets.union((rank, device), "noncomm") if device >= 0 else sets.rank_union(rank, "noncomm")
    return float(iv.overlap(busy, arrive_ns - skew_ns, arrive_ns).sum()) / total
