"""What-if: the mean step wall time predicted with one cause removed (or shrunk), step by step.

Each step is re-timed on its rank's primary device (the step budget's device), where
``wall = device work + exposed communication + bubbles (by cause) + short gaps + edges``.
Device work stays as measured; a cause gives back only the time the device waited for it:

- host causes (``sched_cpu``, ``batch_prep``, ``host_io``, ``handoff``, ``cold_start``, ``host_unattributed``):
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
- ``exposed_comm``: the bubbles where queued work waited on a peer, plus the step's exposed
  collective time (arrival waits left to ``straggler``): on a side stream hidden behind compute, at
  most the step's compute-kernel time (bound ``overlap``); on the model's own stream (a TP
  activation all-reduce the next kernel waits for) no overlap is possible: ``TRANSPORT_SPEEDUP``
  times faster instead (``transport``).
- ``straggler``: the named straggler's lead over the latest other participant in the step's collectives
  it arrived last in (the slowest participant gates the others), less its natural jitter — the mirror
  of its early side, which stays (on a busy host every collective is a little skewed, straggler or
  not).
- ``memcpy``: copy time with no kernel running, plus memcpy bubbles (copies moved off the critical
  stream, overlapped with compute): at most the step's compute-kernel time (``overlap``), and the
  step never shorter than its busiest copy direction (``copy_engine``). Where the advice is to keep
  the data resident (a round trip each iteration), the copies are removed instead: the step keeps
  only its compute kernels (``device_work``), the overlap figure stated beside.

No step gets shorter than the device work its fix keeps (``device_work``): its compute kernels and
its busiest copy direction (only the copies' own fix removes copies; the straggler's, its late work).

Every saving is capped step by step at what the cause lost in that step (``losses.StepLosses``,
bound ``lost``); each row names the bound that cut most. Warm-up steps are left out of the means;
steps with too little device work predict nothing (``too_little``).

Figures are per rank-step: a rank's row never gives back more than that rank lost to the cause.
Ranks joined by collectives run in lockstep: a job step (by number) gains the least, over its ranks,
of a rank's own saving plus the time it waited on its peers (its exposed collectives), at most the
largest rank's own saving — each rank's row gains that, capped at its own loss, and the job step's
figure is stated in the row's assumptions.
``compute`` has no what-if (faster kernels are not modelled).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.analyses.host_threads import innermost_segments, rows_by_thread, stage_names
from srtscope.analyzers.analyses.losses import (
    HOST_WAIT,
    MIN_BUSY_SHARE,
    MIN_DEVICE_NS,
    StepLosses,
    by_rank,
    launching_thread,
)
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.results import CommResult
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.model.units import fmt_ns
from srtscope.analyzers.model.verdicts import WhatIf
from srtscope.analyzers.model.vocab import Cause, StepExec, WhatIfBound

__all__ = ["HOST_WAIT", "SHRINKABLE", "TRANSPORT_SPEEDUP", "what_if"]

#: causes whose host time is a stage class's (overlap loop: their hidden host time is known)
_STAGE_CLASS = {Cause.SCHED_CPU: "scheduler", Cause.BATCH_PREP: "prep"}
#: causes ``shrink_ns`` may name (ns of host time cut per step)
SHRINKABLE: tuple[str, ...] = tuple(c.value for c in HOST_WAIT)
#: a faster transport for collectives the next kernel waits for: this many times their bandwidth
TRANSPORT_SPEEDUP = 2.0

_DEVICE = "device work unchanged (kernels, copies and collective transfers as measured)"
_KEPT = "kernels and collective transfers as measured; the round trip's copies gone"
_OTHERS = "every other cause unchanged"
_BOUND_TEXT = {
    WhatIfBound.LOST: "bound: no step gives back more than the cause lost in it",
    WhatIfBound.OVERLAP: "bound: overlap hides at most the step's compute kernels' time",
    WhatIfBound.COPY_ENGINE: "bound: the busiest copy direction still fits in the step (one copy engine per "
                             "direction moves it as before)",
    WhatIfBound.TRANSPORT: f"bound: collectives on the model's stream (the next kernel waits for them) cannot "
                           f"overlap; a {TRANSPORT_SPEEDUP:g}x faster transport halves their exposed time",
    WhatIfBound.DEVICE_WORK: "bound: no step gets shorter than the device work the fix keeps",
}


def what_if(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, budget: pd.DataFrame, comm: CommResult,
            primary: Mapping[int, int], threshold_ns: int, model: HostActivity, losses: StepLosses,
            shrink_ns: Mapping[str, int] | None = None, copies_resident: bool = False) -> tuple[WhatIf, ...]:
    """One ``WhatIf`` per cause that lost time in the steps, largest saving first.

    steps: ``analyses.steps.STEP_COLUMNS``; pieces: attributed bubble pieces (rank, device, pid, tid,
    start_ns, end_ns, step_row = row of ``steps``, ``cause.<c>_ns``); budget: the step budget table
    (rows like ``steps``); primary: rank -> primary device; model: the trace's host-activity model;
    losses: the steps' accounting (``losses.step_losses`` with their edges); shrink_ns: cause -> ns of
    host time cut per step instead of removing the cause (host causes only, ``SHRINKABLE``).
    ``copies_resident``: the copy advice is to keep the data on the device (a round trip each
    iteration, ``advice.copy_kind_of``): ``memcpy`` is re-timed with the copies removed, and the
    overlap model's figure stated beside it. ``tl``: the trace's metadata and host ranges (its device
    and API rows are not read).

    Invariants per row: ``saved_ns <= lost_ns`` (both means over the same steps); with too little
    device work in the steps (``losses.StepLosses.predictable``) nothing is predicted
    (``predicted`` false, ``saved_ns`` 0, ``bound`` ``too_little``).
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
    wall = steps["wall_ns"].to_numpy(np.int64)
    L = losses
    b, small, fb = L.bubbles, L.small, L.fallback
    overlap_rows = _overlap_rows(steps, pieces, primary)
    wait = sum((b[c] for c in HOST_WAIT), np.zeros(n, np.int64))
    saved: dict[Cause, np.ndarray] = {}
    caps: dict[Cause, list[tuple[WhatIfBound, np.ndarray]]] = {c: [] for c in Cause}
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
    eager = (ex == StepExec.EAGER.value) & ~fb
    saved[Cause.LAUNCH_BOUND] = b[Cause.LAUNCH_BOUND] + np.where(eager, small, 0)
    notes[Cause.LAUNCH_BOUND] = ["the device never waits for a kernel launch or host model code: "
                                 "short gaps between eagerly launched kernels removed too (an upper bound)"]
    saved[Cause.EAGER_FALLBACK], notes[Cause.EAGER_FALLBACK] = _fallback(steps, b, small, fb)
    net = np.maximum(L.exposed - L.skew, 0)
    inline = np.minimum(L.exposed_inline, net)
    side = net - inline
    fast = np.round(inline * (1 - 1 / TRANSPORT_SPEEDUP)).astype(np.int64)
    saved[Cause.EXPOSED_COMM] = b[Cause.EXPOSED_COMM] + side + fast
    caps[Cause.EXPOSED_COMM] = [(WhatIfBound.OVERLAP, b[Cause.EXPOSED_COMM] + np.minimum(side, L.kernel) + fast)]
    notes[Cause.EXPOSED_COMM] = ["collectives on a side stream hidden behind compute (their exposed transfer "
                                 "time removed, at most the step's compute time); collectives on the model's "
                                 f"stream given a {TRANSPORT_SPEEDUP:g}x faster transport; waits for a late rank "
                                 "are the straggler's"]
    saved[Cause.STRAGGLER] = L.skew
    notes[Cause.STRAGGLER] = ["the straggler arrives with the others: its lead over the next-latest rank "
                              "removed from each collective it was last in, less its natural skew (its jitter, "
                              "the mirror of how early it arrives against its median); other ranks' lateness "
                              "stays"]
    saved[Cause.MEMCPY] = b[Cause.MEMCPY] + L.bare_copies
    overlapped = np.minimum(np.minimum(saved[Cause.MEMCPY], b[Cause.MEMCPY] + np.minimum(L.bare_copies, L.kernel)),
                            np.maximum(wall - L.copy_floor, 0))
    if copies_resident:
        # the round trip removed: the copies' own time and the device's waits for them given back;
        # the step keeps its compute kernels
        caps[Cause.MEMCPY] = [(WhatIfBound.DEVICE_WORK, np.maximum(wall - L.kernel, 0))]
        keep_mean = int(overlapped[~L.warmup].sum()) // max(int((~L.warmup).sum()), 1)
        notes[Cause.MEMCPY] = ["the data kept resident on the device, as the advice says: the copies of the "
                               "round trip removed, with the device's waits for them",
                               f"copies overlapped with compute instead (a side stream) would save "
                               f"{fmt_ns(keep_mean)} a step"]
    else:
        caps[Cause.MEMCPY] = [(WhatIfBound.OVERLAP, b[Cause.MEMCPY] + np.minimum(L.bare_copies, L.kernel)),
                              (WhatIfBound.COPY_ENGINE, np.maximum(wall - L.copy_floor, 0))]
        notes[Cause.MEMCPY] = ["copies moved to a side stream, overlapped with compute (copy time itself "
                               "unchanged: each step keeps its busiest copy direction)"]
    # a step keeps its compute kernels and its busiest copy direction whatever else is fixed (a
    # collective's time is not kept: waiting in it is what a host cause may give back); the
    # straggler's fix is its own work balanced: its kernels are not kept
    kept = np.maximum(L.kernel, L.copy_floor)
    for c in (*HOST_WAIT, Cause.LAUNCH_BOUND, Cause.EAGER_FALLBACK, Cause.EXPOSED_COMM):
        caps[c].append((WhatIfBound.DEVICE_WORK, np.maximum(wall - kept, 0)))
    lockstep = steps["rank"].nunique() > 1 and comm.participants > 1
    waited = L.exposed + b[Cause.EXPOSED_COMM]      # a rank's time waiting on its peers, per step
    keep = ~L.warmup
    n_avg = int(keep.sum())
    busy, spent = int(L.busy[keep].sum()), int(wall[keep].sum())
    predicted = L.predictable
    before = int(spent // n_avg)
    warm = int(L.warmup.sum())
    mean_note = f"mean over {n_avg} steps" + (f" ({warm} warm-up steps left out)" if warm else "")
    out = []
    for c, per_step in saved.items():
        per_step = np.clip(per_step.astype(np.int64), 0, wall)
        # steps too thin to predict from are no device steps: their edges are no lost device time
        lost = np.clip(L.device_lost(c).astype(np.int64), 0, wall)
        bound, gone = WhatIfBound.NONE, 0
        for name, cap in [*caps[c], (WhatIfBound.LOST, lost)]:      # the bound that cuts most is named
            cut = np.minimum(per_step, np.clip(cap, 0, None))
            d = int((per_step - cut)[keep].sum())
            if d > gone:
                bound, gone = name, d
            per_step = cut
        if bound is WhatIfBound.NONE and c is Cause.EXPOSED_COMM and int(inline[keep].sum()) > int(side[keep].sum()):
            bound = WhatIfBound.TRANSPORT
        job = per_step
        if lockstep:
            job = np.minimum(_lockstep(per_step, steps, waited), wall)
            if c is Cause.MEMCPY:                 # each rank's copies still fit in its own step
                job = np.minimum(job, np.maximum(wall - L.copy_floor, 0))
            # per rank-step: a rank gives back at most what it lost itself; the rest of a job step's
            # gain is its peers' (the time it stops waiting on them), stated apart
            per_step = np.minimum(job, lost)
        lost_mean = int(round(int(lost[keep].sum()) / n_avg))
        total = int(per_step[keep].sum())
        if (total <= 0 if predicted else lost_mean <= 0):
            continue
        extra = ["per rank-step: no rank gives back more than it lost itself; ranks joined by collectives run "
                 "in lockstep, and a job step (all ranks) would take "
                 f"{fmt_ns(int(round(int(job[keep].sum()) / n_avg)))} less: each rank its own saving plus the "
                 "time it waited on its peers, at most the largest rank's own saving"] if lockstep else []
        if not predicted:
            why = (f"too little to predict: {fmt_ns(busy)} of device work in {n_avg} steps of {fmt_ns(spent)} "
                   f"(at least {fmt_ns(MIN_DEVICE_NS)} and {100 * MIN_BUSY_SHARE:g}% of the steps' time needed)")
            out.append(WhatIf(c.value, c.bottleneck.value, 0, before, before, 0, (why, mean_note),
                              np.zeros(n, np.int64), lost_mean, WhatIfBound.TOO_LITTLE.value, False, warm))
            continue
        mean = int(round(total / n_avg))
        text = [_BOUND_TEXT[bound]] if bound in _BOUND_TEXT else []
        out.append(WhatIf(c.value, c.bottleneck.value, mean, before, before - mean, int((per_step[keep] > 0).sum()),
                          tuple(notes[c] + extra + text + [_KEPT if c is Cause.MEMCPY and copies_resident
                                                           else _DEVICE, _OTHERS, mean_note]), per_step,
                          lost_mean, bound.value, True, warm))
    out.sort(key=lambda w: (-w.saved_ns, -w.lost_ns, w.cause))
    return tuple(out)


def _lockstep(per_step: np.ndarray, steps: pd.DataFrame, waited: np.ndarray) -> np.ndarray:
    """Ranks in lockstep (a collective joins them every step): a step (by number) ends when its last
    rank does, so it gains what every rank can give — each its own saving plus the time it waited on
    its peers: ``min over ranks of (saved + waited)``, and no more than the largest rank's own saving
    (the slowest rank waits for no one). Every rank's row of the step gains that."""
    g = steps["step"].to_numpy()
    reach = pd.Series(per_step + waited).groupby(g).transform("min").to_numpy(np.int64)
    top = pd.Series(per_step).groupby(g).transform("max").to_numpy(np.int64)
    return np.minimum(reach, top)


def _overlap_rows(steps: pd.DataFrame, pieces: pd.DataFrame, primary: Mapping[int, int]) -> np.ndarray:
    """Steps of ranks whose launching thread (the one bubbles wait on, most bubble time) is not the
    thread of their steps: an overlap loop (a forward thread fed by the scheduler's loop)."""
    out = np.zeros(len(steps), bool)
    if len(pieces) == 0:
        return out
    ok = (pieces["step_row"].to_numpy() >= 0) & (pieces["tid"].to_numpy() >= 0)
    rk, dv = pieces["rank"].to_numpy(), pieces["device"].to_numpy()
    for rank, idx in by_rank(steps):
        launcher = launching_thread(pieces, ok & (rk == rank) & (dv == primary.get(int(rank), -2)))
        if launcher is None:
            continue
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
