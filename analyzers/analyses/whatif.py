"""What-if: the mean step wall time predicted with one cause removed (or shrunk), step by step.

Each step is re-timed on its rank's primary device (the step budget's device), where
``wall = device work + exposed communication + bubbles (by cause) + short gaps + edges``.
Device work stays as measured; a cause gives back only the time the device waited for it:

- host causes (``sched_cpu``, ``batch_prep``, ``host_io``, ``cold_start``, ``host_unattributed``):
  the bubble time attributed to the cause, and the step time outside the device's active window
  (before its first or after its last activity: a first schedule, a last idle iteration), attributed
  the same way. In an overlap loop (the launching thread is not the
  step's loop thread: the host schedules t+1 while t runs) host and device run side by side and the
  device waits for the host only during the step's host-wait bubbles W; cutting r ns of the
  scheduler's or the preparation's stage time (on the loop thread) saves ``min(r, W)`` — host time
  already hidden behind device work is not promised twice.
- ``launch_bound``: its bubble time plus, in eager steps, the gaps under the bubble threshold (the
  device never waits for a launch: an upper bound).
- ``eager_fallback``: each fallback step replays a graph of the nearest captured size: its
  launch-bound bubbles and short gaps, less a replay's own launch cost — the same quantity measured
  on this trace's graph steps of the nearest batch size.
- ``exposed_comm``: the step's exposed collective time (arrival waits left to ``straggler``) plus the
  bubbles where queued work waited on a peer.
- ``straggler``: the named straggler's lead over the latest other participant in the step's collectives
  it arrived last in (the slowest participant gates the others), less its natural jitter — the mirror
  of its early side, which stays (on a busy host every collective is a little skewed, straggler or
  not).
- ``memcpy``: copy time with no kernel running, plus memcpy bubbles (copies moved off the critical
  stream, overlapped with compute).

Ranks joined by collectives run in lockstep: a step (by number) gains its largest rank's saving.
``compute`` has no what-if (faster kernels are not modelled).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.attribution import attribute
from srtscope.analyzers.analyses.comm import lateness
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.eager import fallback_mask
from srtscope.analyzers.host_activity import (
    BurstRule,
    HostActivity,
    innermost_segments,
    rows_by_thread,
    stage_names,
)
from srtscope.analyzers.results import CommResult, WhatIf
from srtscope.analyzers.timeline import Timeline
from srtscope.analyzers.units import fmt_ns
from srtscope.analyzers.vocab import Cause, StepExec

__all__ = ["HOST_WAIT", "SHRINKABLE", "what_if"]

#: causes whose bubbles are the device waiting for host work
HOST_WAIT: tuple[Cause, ...] = (Cause.SCHED_CPU, Cause.BATCH_PREP, Cause.HOST_IO, Cause.COLD_START,
                                Cause.HOST_UNATTRIBUTED)
#: causes whose host time is a stage class's (overlap loop: their hidden host time is known)
_STAGE_CLASS = {Cause.SCHED_CPU: "scheduler", Cause.BATCH_PREP: "prep"}
#: causes ``shrink_ns`` may name (ns of host time cut per step)
SHRINKABLE: tuple[str, ...] = tuple(c.value for c in HOST_WAIT)

_DEVICE = "device work unchanged (kernels, copies and collective transfers as measured)"
_OTHERS = "every other cause unchanged"


def what_if(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, budget: pd.DataFrame, comm: CommResult,
            primary: Mapping[int, int], threshold_ns: int,
            model: HostActivity | None = None, shrink_ns: Mapping[str, int] | None = None,
            rule: BurstRule | None = None, comm_ranks: set[int] | None = None,
            sets: DeviceSets | None = None) -> tuple[WhatIf, ...]:
    """One ``WhatIf`` per cause that gives back time, largest saving first.

    steps: ``analyses.steps.STEP_COLUMNS``; pieces: attributed bubble pieces (rank, device, pid, tid,
    start_ns, end_ns, step_row = row of ``steps``, ``cause.<c>_ns``); budget: the step budget table
    (rows like ``steps``); primary: rank -> primary device; model: the trace's host-activity model
    (built when None, with ``rule``); shrink_ns: cause -> ns of host time cut per step instead of
    removing the cause (host causes only, ``SHRINKABLE``); comm_ranks: ranks with collective
    kernels (computed when None); sets: the trace's device sets (built when None).
    """
    shrink = dict(shrink_ns or {})
    bad = sorted(set(shrink) - set(SHRINKABLE))
    if bad:
        raise ValueError(f"shrink_ns: only host causes can be shrunk ({', '.join(SHRINKABLE)}), got {bad}")
    if any(v < 0 for v in shrink.values()):
        raise ValueError(f"shrink_ns: ns per step must be >= 0, got {shrink}")
    n = len(steps)
    if n == 0:
        return ()
    steps = steps.reset_index(drop=True)
    s, e = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    wall = steps["wall_ns"].to_numpy(np.int64)
    model = model or HostActivity(tl, rule)
    sets = DeviceSets.of(tl, sets)
    b = _bubbles(pieces, primary, n)
    edge = _bubbles(_edges(tl, steps, pieces, primary, model, rule, comm_ranks, sets), primary, n)
    for c in HOST_WAIT:
        b[c] = b[c] + edge[c]
    small = _short_gaps(steps, primary, threshold_ns, sets)
    overlap_rows = _overlap_rows(steps, pieces, primary)
    wait = sum((b[c] for c in HOST_WAIT), np.zeros(n, np.int64))
    saved: dict[Cause, np.ndarray] = {}
    notes: dict[Cause, list[str]] = {}
    stages = (model.stage_names, model.stage_codes, model.stage_classes)
    hidden = _stage_time(tl, steps, overlap_rows, stages) if overlap_rows.any() else {}
    loop = ("overlap loop: the device waits for the host only during the step's host-wait bubbles; "
            "host time already hidden behind device work is not promised again")
    for c in HOST_WAIT:
        r = np.maximum(hidden[c], b[c]) if c in hidden else b[c]
        if c.value in shrink:
            r = np.minimum(r, int(shrink[c.value]))
        saved[c] = np.where(overlap_rows, np.minimum(r, wait), np.minimum(r, b[c]))
        what = (f"{c.value} host time cut by {fmt_ns(shrink[c.value])} per step (not removed)" if c.value in shrink
                else f"{c.value} host time removed")
        notes[c] = [f"{what}; serial loop: the device waited for all of it, saved one for one"
                    if not overlap_rows.any() else f"{what}; {loop}"]
        if overlap_rows.any() and not overlap_rows.all():
            notes[c].append("serial-loop steps: the device waited for all of it, saved one for one")
    ex = steps["exec"].astype(str).to_numpy()
    fb = fallback_mask(steps)
    eager = (ex == StepExec.EAGER.value) & ~fb
    saved[Cause.LAUNCH_BOUND] = b[Cause.LAUNCH_BOUND] + np.where(eager, small, 0)
    notes[Cause.LAUNCH_BOUND] = ["the device never waits for a kernel launch or host model code: "
                                 "short gaps between eagerly launched kernels removed too (an upper bound)"]
    saved[Cause.EAGER_FALLBACK], notes[Cause.EAGER_FALLBACK] = _fallback(steps, b, small, fb)
    skew = _skew(steps, comm)
    exposed = budget["exposed_comm_ns"].to_numpy(np.int64) if "exposed_comm_ns" in budget else np.zeros(n, np.int64)
    saved[Cause.EXPOSED_COMM] = b[Cause.EXPOSED_COMM] + np.maximum(exposed - skew, 0)
    notes[Cause.EXPOSED_COMM] = ["collectives hidden behind compute (their exposed transfer time removed); "
                                 "waits for a late rank are the straggler's"]
    saved[Cause.STRAGGLER] = skew
    notes[Cause.STRAGGLER] = ["the straggler arrives with the others: its lead over the next-latest rank "
                              "removed from each collective it was last in, less its natural skew (its jitter, "
                              "the mirror of how early it arrives against its median); other ranks' lateness "
                              "stays"]
    saved[Cause.MEMCPY] = b[Cause.MEMCPY] + _exposed_copies(steps, primary, s, e, sets)
    notes[Cause.MEMCPY] = ["copies pinned and moved to a side stream, overlapped with compute "
                           "(copy time itself unchanged)"]
    lockstep = steps["rank"].nunique() > 1 and comm.participants > 1
    before = int(wall.sum() // n)
    out = []
    for c, per_step in saved.items():
        per_step = np.clip(per_step.astype(np.int64), 0, wall)
        if lockstep:
            per_step = pd.Series(per_step).groupby(steps["step"].to_numpy()).transform("max").to_numpy(np.int64)
            per_step = np.minimum(per_step, wall)
        total = int(per_step.sum())
        if total <= 0:
            continue
        mean = int(round(total / n))
        extra = ["ranks joined by collectives run in lockstep: each step gains its largest rank's saving"] \
            if lockstep else []
        out.append(WhatIf(c.value, c.bottleneck.value, mean, before, before - mean, int((per_step > 0).sum()),
                          tuple(notes[c] + extra + [_DEVICE, _OTHERS, f"mean over {n} steps"]), per_step))
    out.sort(key=lambda w: (-w.saved_ns, w.cause))
    return tuple(out)


def _by_rank(steps: pd.DataFrame) -> list[tuple[int, np.ndarray]]:
    """(rank, row positions of ``steps``) per rank."""
    return [(int(cast(int, k)), np.asarray(v)) for k, v in steps.groupby("rank").indices.items()]


def _bubbles(pieces: pd.DataFrame, primary: Mapping[int, int], n: int) -> dict[Cause, np.ndarray]:
    """Per cause, per step row: attributed bubble time on the rank's primary device, ns."""
    out = {c: np.zeros(n, np.int64) for c in Cause}
    if len(pieces) == 0:
        return out
    p = pieces[pieces["step_row"].to_numpy() >= 0]
    prim = p["rank"].map(dict(primary)).fillna(-2).to_numpy(np.int64)
    p = p[p["device"].to_numpy() == prim]
    rows = p["step_row"].to_numpy(np.int64)
    for c in Cause:
        col = f"cause.{c.value}_ns"
        if col in p:
            np.add.at(out[c], rows, p[col].to_numpy(np.int64))
    return out


def _edges(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, primary: Mapping[int, int],
           model: HostActivity, rule: BurstRule | None, comm_ranks: set[int] | None,
           sets: DeviceSets) -> pd.DataFrame:
    """Step time outside the primary device's active window, attributed like bubble pieces (by the
    rank's launching thread: the one most bubble time waits on, else the step's own thread)."""
    rows = []
    for rank, idx in _by_rank(steps):
        dev = primary.get(int(rank))
        if dev is None:
            continue
        w0, w1 = sets.bounds((int(rank), dev))
        q = pieces[(pieces["rank"].to_numpy() == rank) & (pieces["tid"].to_numpy() >= 0)] if len(pieces) else pieces
        if len(q):
            key = (q["end_ns"] - q["start_ns"]).groupby([q["pid"], q["tid"]]).sum().idxmax()
        else:
            key = steps.iloc[idx].groupby(["pid", "tid"]).size().idxmax()
        pid, tid = cast(tuple[int, int], key)
        ss, ee = steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx]
        for a, z in ((ss, np.minimum(ee, w0)), (np.maximum(ss, w1), ee)):
            for i in np.flatnonzero(z > a):       # only steps reaching out of the window: a few
                rows.append((int(rank), dev, int(pid), int(tid), int(a[i]), int(z[i]), int(idx[i])))
    cols = ["rank", "device", "pid", "tid", "start_ns", "end_ns", "step_row"]
    q = pd.DataFrame(rows, columns=cols).astype(np.int64)
    if len(q) == 0:
        return q
    classes, _, _ = attribute(tl, q, rule or model.rule, model, comm_ranks)
    return pd.concat([q, classes], axis=1)


def _short_gaps(steps: pd.DataFrame, primary: Mapping[int, int], threshold_ns: int,
                sets: DeviceSets) -> np.ndarray:
    """Per step: gaps at or under the bubble threshold on the primary device inside the step, ns."""
    out = np.zeros(len(steps), np.int64)
    for rank, idx in _by_rank(steps):
        if int(rank) not in primary:
            continue
        gs, ge = iv.gaps(sets.union((int(rank), primary[int(rank)])), 0)
        k = (ge - gs) <= threshold_ns
        out[idx] = iv.overlap((gs[k], ge[k]), steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx])
    return out


def _exposed_copies(steps: pd.DataFrame, primary: Mapping[int, int], s: np.ndarray, e: np.ndarray,
                    sets: DeviceSets) -> np.ndarray:
    """Per step: copy time on the primary device with no kernel running, ns."""
    out = np.zeros(len(steps), np.int64)
    if not sets.mask("copy").any():
        return out
    for rank, idx in _by_rank(steps):
        if int(rank) not in primary:
            continue
        key = (int(rank), primary[int(rank)])
        bare = iv.subtract(sets.union(key, "copy"), sets.union(key, "compute"))
        out[idx] = iv.overlap(bare, s[idx], e[idx])
    return out


def _overlap_rows(steps: pd.DataFrame, pieces: pd.DataFrame, primary: Mapping[int, int]) -> np.ndarray:
    """Steps of ranks whose launching thread (the one bubbles wait on, most bubble time) is not the
    thread of their steps: an overlap loop (a forward thread fed by the scheduler's loop)."""
    out = np.zeros(len(steps), bool)
    if len(pieces) == 0:
        return out
    p = pieces[(pieces["step_row"].to_numpy() >= 0) & (pieces["tid"].to_numpy() >= 0)]
    for rank, idx in _by_rank(steps):
        q = p[(p["rank"].to_numpy() == rank) & (p["device"].to_numpy() == primary.get(int(rank), -2))]
        if len(q) == 0:
            continue
        dur = (q["end_ns"] - q["start_ns"]).groupby([q["pid"], q["tid"]]).sum()
        launcher = cast(tuple[int, int], dur.idxmax())
        loop = cast(tuple[int, int], steps.iloc[idx].groupby(["pid", "tid"]).size().idxmax())
        out[idx] = (int(launcher[0]), int(launcher[1])) != (int(loop[0]), int(loop[1]))
    return out


def _stage_time(tl: Timeline, steps: pd.DataFrame, rows: np.ndarray,
                stages: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> dict[Cause, np.ndarray]:
    """Per stage cause, per step (the given rows only): innermost stage time on the step's own thread, ns."""
    n = len(steps)
    out = {c: np.zeros(n, np.int64) for c in _STAGE_CLASS}
    rg = tl.host_ranges
    if len(rg) == 0:
        return out
    _, codes, classes = stages if stages is not None else stage_names(rg)
    sel = steps[rows]
    keys = [tuple(int(x) for x in k) for k in sel[["rank", "pid", "tid"]].drop_duplicates().to_numpy()]
    got = rows_by_thread(rg, keys)
    r_s, r_e = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
    for key in keys:
        rr = got.get(key, np.zeros(0, np.int64))
        rr = rr[codes[rr] >= 0]
        if len(rr) == 0:
            continue
        ls, le, ll = innermost_segments(r_s[rr], r_e[rr], codes[rr])
        cls = classes[ll].astype(str) if len(ll) else np.zeros(0, str)
        mine = np.flatnonzero(rows & (steps["rank"].to_numpy() == key[0]) & (steps["pid"].to_numpy() == key[1])
                              & (steps["tid"].to_numpy() == key[2]))
        for c, name in _STAGE_CLASS.items():
            m = cls == name
            out[c][mine] = iv.overlap(iv.union(ls[m], le[m]), steps["start_ns"].to_numpy()[mine],
                                      steps["end_ns"].to_numpy()[mine])
    return out


def _skew(steps: pd.DataFrame, comm: CommResult) -> np.ndarray:
    """Per step: the named straggler's excess lateness, ns, over the collectives whose last participant
    arrived in it — only where a straggler is named (a rank or device late in most skewed collectives).

    Per collective, the straggler's offset ``d`` = its arrival - the latest other participant's (> 0:
    it gated the collective by ``d``). Arriving with the others gives back ``max(d, 0)`` less the
    lateness it would show anyway: its natural jitter, taken as the mirror of its early side —
    ``mean(max(median(d) - d, 0))`` per collective. A steady straggler (``d`` = lateness + jitter)
    gives back its lateness, an occasional one (a pause now and then) its pauses; ranks with no
    straggler give back about nothing. A step gives back at most its collectives' ``max(d, 0)``."""
    out: np.ndarray = np.zeros(len(steps), np.int64)
    coll = comm.collectives
    off = comm.straggler_offset_ns
    named = comm.straggler_rank is not None or comm.straggler_device is not None
    if comm.partial or not named or len(coll) == 0 or len(off) != len(coll):
        return out
    lead, natural = lateness(off)
    t = coll["start_ns"].to_numpy(np.int64) + coll["skew_ns"].to_numpy(np.int64)
    for _, idx in _by_rank(steps):
        order = idx[np.argsort(steps["start_ns"].to_numpy()[idx], kind="stable")]
        ss, ee = steps["start_ns"].to_numpy()[order], steps["end_ns"].to_numpy()[order]
        pos = np.searchsorted(ss, t, side="right") - 1
        ok = pos >= 0
        ok[ok] = t[ok] < ee[pos[ok]]
        got = np.zeros(len(order), np.int64)
        n = np.zeros(len(order), np.int64)
        np.add.at(got, pos[ok], lead[ok])
        np.add.at(n, pos[ok], 1)
        out[order] += np.maximum(got - np.round(n * natural).astype(np.int64), 0)
    return out


def _fallback(steps: pd.DataFrame, b: dict[Cause, np.ndarray], small: np.ndarray,
              fb: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Eager-fallback steps re-timed as graph replays of the nearest captured size."""
    ex = steps["exec"].astype(str).to_numpy()
    graph = ex == StepExec.GRAPH.value
    lost = b[Cause.EAGER_FALLBACK] + np.where(fb, small, 0)
    if not fb.any():
        return lost, []
    cost = b[Cause.LAUNCH_BOUND] + b[Cause.EAGER_FALLBACK] + small      # a graph step's launch-side waits
    bs = steps["bs"].to_numpy(np.int64)
    ref = np.full(len(steps), int(cost[graph].mean()) if graph.any() else 0, np.int64)
    sizes = np.unique(bs[graph & (bs >= 0)])
    if len(sizes):
        per = pd.Series(cost[graph & (bs >= 0)]).groupby(bs[graph & (bs >= 0)]).mean()
        want = bs[fb]
        pos = np.clip(np.searchsorted(sizes, want), 0, len(sizes) - 1)
        left = np.clip(pos - 1, 0, len(sizes) - 1)
        near = np.where(np.abs(sizes[left] - want) <= np.abs(sizes[pos] - want), left, pos)
        ref[fb] = np.where(want >= 0, per.reindex(sizes[near]).to_numpy(), ref[fb])
    saved = np.where(fb, np.maximum(lost - ref, 0), lost)
    how = (f"a replay's launch-side wait ({fmt_ns(int(ref[fb].mean()))} per step on average) taken from this "
           f"trace's {int(graph.sum())} graph steps of the nearest batch size") if graph.any() else \
        "no graph step in this trace to take a replay's launch cost from: replays assumed free (an upper bound)"
    return saved, [f"the {int(fb.sum())} eager-fallback steps replay a graph of the nearest captured size", how]
