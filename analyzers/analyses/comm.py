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

A window's part (``comm_part``: collective and exposed time; ``busy_in_window``: the straggler
device's busy time before its arrivals) and the combine (``comm_result``): the collectives of every
rank are matched once, from their rows alone (``finish``); ``straggler_queries`` runs ``finish``
before the windows to learn which time before the straggler's arrivals they must measure. A whole
read is one window.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.host_threads import innermost_segments, stage_names
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import distinct_keys, group_rows, isin, str_codes
from srtscope.analyzers.model.results import CommResult
from srtscope.analyzers.model.timeline import DeviceKind, Timeline
from srtscope.probes.stages import Stage, resolve_stage

Key = tuple[int, int]
Queries = dict[Key, tuple[np.ndarray, np.ndarray]]
BusyBefore = Callable[[int, int, np.ndarray, np.ndarray], "float | None"]
"""(rank, device, arrivals, skews) -> the device's busy share in ``[arrival - skew, arrival)``, non-comm work."""

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


def comm_part(tlw: Timeline, sets: DeviceSets, lo: int, hi: int, known: tuple[str, pd.DataFrame] | None) -> list[int]:
    """A window ``[lo, hi)``'s share, from the rows of its context (``sets``: their device sets):
    [collective time, its exposed part, 0], ns; each device's (or, from ranges, rank's) collectives
    a union. ``known``: the window's collectives (``_instances``) where already found."""
    mask = sets.comm
    if known is not None:
        source, inst = known
    elif mask.any():                            # the collectives' devices, without their rows' table
        dev = tlw.device
        stand_in = bool(isin(dev["kind"], [DeviceKind.CPU_FORWARD])[mask].all())
        source = "stand_in" if stand_in else "kernels"
        inst = pd.DataFrame({"rank": dev["rank"].to_numpy()[mask], "device": dev["device"].to_numpy()[mask]})
    else:
        source, inst = _instances(tlw, mask)
    total = exposed = 0
    if source == "ranges":
        for rank in np.unique(inst["rank"].to_numpy()):
            r = inst["rank"].to_numpy() == rank
            c = iv.union(inst["start_ns"].to_numpy()[r], inst["end_ns"].to_numpy()[r])
            k = sets.rank_union(int(rank), "noncomm")
            total += iv.total(iv.clip(c, lo, hi))
            exposed += iv.total(iv.clip(split_compute(k, c, False)[1], lo, hi))
    elif source != "none":
        for rank, device in distinct_keys(inst["rank"].to_numpy(), inst["device"].to_numpy()):
            c, k = sets.union((rank, device), "comm"), sets.union((rank, device), "noncomm")
            total += iv.total(iv.clip(c, lo, hi))
            exposed += iv.total(iv.clip(split_compute(k, c, source == "stand_in")[1], lo, hi))
    return [total, exposed, 0]


def finish(tl: Timeline, source: str, inst: pd.DataFrame, total: int, exposed: int, min_skew_ns: int,
           busy_of: BusyBefore) -> CommResult:
    """The result from the collectives' rows (``_instances``) and their summed and exposed time:
    matched across participants, skew, transfer, the straggler. ``busy_of(rank, device, arrive_ns,
    skew_ns)``: the straggler device's busy share before its arrivals. ``tl``: the metadata and host
    ranges (the straggler's host stage)."""
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
                    busy_before = busy_of(
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


def straggler_queries(small: Timeline, source: str, inst: pd.DataFrame, min_skew_ns: int) -> Queries:
    """Per straggler device (one at most), the ``[arrival - skew, arrival)`` windows, ns, whose busy
    share ``finish`` asks for. ``small``: the trace's metadata and ranges (no device rows)."""
    asked: Queries = {}

    def record(rank: int, device: int, arrive: np.ndarray, skew: np.ndarray) -> None:
        asked[(rank, device)] = (arrive - skew, arrive)
        return None
    finish(small, source, inst, 0, 0, min_skew_ns, record)
    return asked


def busy_in_window(sets: DeviceSets, lo: int, hi: int, queries: Mapping[Key, tuple[np.ndarray, np.ndarray]]
                   ) -> dict[Key, int]:
    """Per asked device: its non-collective busy time inside the window ``[lo, hi)`` and inside the
    asked windows, ns (each asked window counted on its own)."""
    out = {}
    for key, (q0, q1) in queries.items():
        if key in sets.keys:
            u = iv.clip(sets.union(key, "noncomm"), lo, hi)
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
    return finish(small, source, inst, total, exposed, min_skew_ns, busy_of)
