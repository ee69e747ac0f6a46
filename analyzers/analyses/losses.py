"""Lost time per step and cause: the one per-step accounting the what-if, the verdict's causes and
the advice read.

Each step is accounted on its rank's primary device (the step budget's device). Per step row, ns:

- ``lost[c]`` for every cause: the bubble pieces attributed to ``c``; for the host causes also the
  step time outside the device's active window (``edges``: a first schedule, a last idle iteration),
  attributed like bubbles; ``launch_bound`` / ``eager_fallback`` also the gaps at or under the
  bubble threshold (``small``: a fallback step's are the fallback's) — but for those inside a
  replayed CUDA graph (``graphed``: the graph's own kernels follow one another with no launch by
  the host), which are ``compute``'s; ``exposed_comm`` the exposed
  collective time less the straggler's lead (``skew``), which is ``straggler``'s; ``memcpy`` the copy
  time with no kernel running (``bare_copies``).
- what bounds a fix: ``kernel`` (compute kernels: what a collective or a copy could hide behind),
  ``busy`` (any device work), ``copy_floor`` (the busiest copy direction: a copy engine moves one
  direction at a time, so a step never gets shorter than it), ``exposed_inline`` (the exposed part
  of collectives on a stream that also runs the model's kernels: an activation all-reduce inside
  the forward, which the next layer waits for — no overlap can hide it).
- ``warmup``: the first steps of a rank, each far slower than the rest (``WARMUP_FACTOR`` x the
  median of its steps), when that slowness never recurs, or when cold-start time makes it
  (``warmup_mask``); left out of the what-if's means.
- ``predictable``: the steps left hold at least ``MIN_DEVICE_NS`` of device work and
  ``MIN_BUSY_SHARE`` of their wall time; else they are no device steps (a host loop around a few
  kernels): nothing is predicted from them and their edges are no lost device time.

Invariant: ``lost[c] >= 0``; ``sum over c of lost[c] <= wall`` up to device work overlapping edges.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, cast

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.attribution import attribute
from srtscope.analyzers.analyses.comm import lateness
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.eager import fallback_mask
from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.analyses.host_threads import BurstRule
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import isin, str_map
from srtscope.analyzers.model.names import copy_direction
from srtscope.analyzers.model.results import CommResult
from srtscope.analyzers.model.timeline import DeviceKind, Timeline
from srtscope.analyzers.model.vocab import Cause

__all__ = ["HOST_WAIT", "MIN_BUSY_SHARE", "MIN_DEVICE_NS", "StepLosses", "WARMUP_FACTOR", "step_losses",
           "warmup_mask"]

#: causes whose bubbles are the device waiting for host work
HOST_WAIT: tuple[Cause, ...] = (Cause.SCHED_CPU, Cause.BATCH_PREP, Cause.HOST_IO, Cause.HANDOFF,
                                Cause.COLD_START, Cause.HOST_UNATTRIBUTED)
#: an early step slower than this many times the median of its rank's steps is a warm-up step
WARMUP_FACTOR = 3.0
#: nothing is predicted from steps holding less device work than this in all (ns) ...
MIN_DEVICE_NS = 100_000
#: ... or device work under this share of their wall time (a prediction would be an extrapolation)
MIN_BUSY_SHARE = 0.01


@dataclass(frozen=True)
class StepLosses:
    """Per step row of the step table (``analyses.steps.STEP_COLUMNS``), ns; see the module doc."""

    lost: dict[Cause, np.ndarray]
    bubbles: dict[Cause, np.ndarray]     # bubble pieces (and, host causes, edges) per cause
    edges: dict[Cause, np.ndarray]       # step time outside the device's active window, per host cause
    small: np.ndarray                    # short gaps outside replayed CUDA graphs
    graphed: np.ndarray                  # short gaps inside replayed CUDA graphs: device-side (compute)
    fallback: np.ndarray                 # bool: eager-fallback steps
    exposed: np.ndarray                  # exposed collective time (the budget's)
    exposed_inline: np.ndarray           # ... of it, collectives on a compute stream
    skew: np.ndarray
    bare_copies: np.ndarray
    copy_floor: np.ndarray
    kernel: np.ndarray
    busy: np.ndarray
    wall: np.ndarray
    warmup: np.ndarray                   # bool

    @property
    def n(self) -> int:
        return len(self.wall)

    def subset(self, rows: np.ndarray) -> StepLosses:
        """The accounting of the steps ``rows`` (a bool mask over the steps) alone, in their order."""
        got: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            got[f.name] = {c: a[rows] for c, a in v.items()} if isinstance(v, dict) else v[rows]
        return StepLosses(**got)

    def device_lost(self, c: Cause) -> np.ndarray:
        """``lost[c]``, less its edges when the steps are too thin to be device steps (``predictable``)."""
        if self.predictable or c not in self.edges:
            return self.lost[c]
        return self.lost[c] - self.edges[c]

    def mean_lost(self) -> dict[str, int]:
        """Per cause with any: ``device_lost`` per mean step, warm-up steps left out, ns."""
        keep = ~self.warmup
        n = int(keep.sum())
        out = {c.value: int(self.device_lost(c)[keep].sum()) // n for c in Cause} if n else {}
        return {k: v for k, v in out.items() if v > 0}

    def warmup_ns(self) -> tuple[int, int]:
        """(wall, device busy) of the warm-up steps, ns; (0, 0) when the steps are not ``predictable``."""
        if not self.predictable:
            return 0, 0
        return int(self.wall[self.warmup].sum()), int(self.busy[self.warmup].sum())

    @property
    def predictable(self) -> bool:
        """Enough device work in the steps (warm-up left out) to predict from (module doc)."""
        keep = ~self.warmup
        busy = int(self.busy[keep].sum())
        return bool(keep.any()) and busy >= MIN_DEVICE_NS and busy >= MIN_BUSY_SHARE * int(self.wall[keep].sum())


def step_losses(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, budget: pd.DataFrame, comm: CommResult,
                primary: Mapping[int, int], threshold_ns: int, model: HostActivity,
                rule: BurstRule | None = None, comm_ranks: set[int] | None = None,
                sets: DeviceSets | None = None) -> StepLosses:
    """The accounting of ``steps`` (reset to a 0..n-1 index by the caller, as ``pieces.step_row``),
    but for the step time outside the device's active window: a window holds a part of the steps,
    whose edges ``edge_losses`` gives over all of them (the combine adds them)."""
    n = len(steps)
    sets = DeviceSets.of(tl, sets)
    s, e = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    b = bubbles_by_cause(pieces, primary, n)
    edge = {c: np.zeros(n, np.int64) for c in HOST_WAIT}
    small, graphed = _short_gaps(steps, primary, threshold_ns, sets)
    fb = fallback_mask(steps) if n else np.zeros(0, bool)
    skew = step_skew(steps, comm)
    exposed = budget["exposed_comm_ns"].to_numpy(np.int64) if "exposed_comm_ns" in budget and n \
        else np.zeros(n, np.int64)
    per = _per_device(tl, steps, primary, sets)
    lost = {c: b[c].copy() for c in Cause}
    lost[Cause.COMPUTE] += graphed                  # the device's own time between a graph's kernels
    lost[Cause.LAUNCH_BOUND] += np.where(fb, 0, small)
    lost[Cause.EAGER_FALLBACK] += np.where(fb, small, 0)
    lost[Cause.EXPOSED_COMM] += np.maximum(exposed - skew, 0)
    lost[Cause.STRAGGLER] += skew
    lost[Cause.MEMCPY] += per["bare_copies"]
    return StepLosses(lost, b, {c: edge[c] for c in HOST_WAIT}, small, graphed, fb, exposed,
                      np.minimum(per["exposed_inline"], exposed), skew, per["bare_copies"], per["copy_floor"],
                      per["kernel"], per["busy"], e - s, warmup_mask(steps, lost[Cause.COLD_START]))


def warmup_mask(steps: pd.DataFrame, cold: np.ndarray | None = None) -> np.ndarray:
    """Warm-up steps, by evidence and not by slowness alone. Per rank (3 steps or more, by start),
    among the first half of its steps, those slower than ``WARMUP_FACTOR`` x the median of its steps
    that are either the run of steps it starts with, when no later step is that slow (a slowness that
    recurs is a cause, never warm-up), or mostly cold-start time over the median (``cold``, ns per
    step: allocation, module loading, first-use calls, compilation)."""
    out = np.zeros(len(steps), bool)
    if len(steps) == 0:
        return out
    wall = steps["wall_ns"].to_numpy(np.int64)
    for _, idx in by_rank(steps):
        if len(idx) < 3:
            continue
        order = idx[np.argsort(steps["start_ns"].to_numpy()[idx], kind="stable")]
        med = float(np.median(wall[order]))
        slow = wall[order] > WARMUP_FACTOR * med
        half = (len(order) + 1) // 2
        lead = int(np.argmin(slow)) if not slow.all() else len(order)
        first = np.zeros(len(order), bool)
        if lead and not slow[lead:].any():
            first[:min(lead, half)] = True
        if cold is not None:
            w = wall[order]
            first[:half] |= slow[:half] & (2 * cold[order][:half] >= w[:half] - med)
        out[order[first]] = True
    return out


def by_rank(steps: pd.DataFrame) -> list[tuple[int, np.ndarray]]:
    """(rank, row positions of ``steps``) per rank."""
    return [(int(cast(int, k)), np.asarray(v)) for k, v in steps.groupby("rank").indices.items()]


def bubbles_by_cause(pieces: pd.DataFrame, primary: Mapping[int, int], n: int) -> dict[Cause, np.ndarray]:
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


def _per_device(tl: Timeline, steps: pd.DataFrame, primary: Mapping[int, int],
                sets: DeviceSets) -> dict[str, np.ndarray]:
    """Per step on the primary device: kernel, busy, bare copies, busiest copy direction, exposed
    inline collectives."""
    n = len(steps)
    out = {k: np.zeros(n, np.int64) for k in ("kernel", "busy", "bare_copies", "copy_floor", "exposed_inline")}
    if n == 0 or len(tl.device) == 0:
        return out
    dev = tl.device
    copy = sets.mask("copy")
    # copy direction as a small code per row (one lookup per distinct name), not a string per row
    seen: dict[str, int] = {}
    direction = (str_map(dev["name"], lambda nm: seen.setdefault(copy_direction(nm), len(seen)), np.int16)
                 if copy.any() else None)
    stream = dev["stream"].to_numpy()
    stand_in = isin(dev["kind"], [DeviceKind.CPU_FORWARD])
    comm, kern = sets.mask("comm"), sets.mask("kernel")
    s_all, e_all = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    for rank, idx in by_rank(steps):
        if rank not in primary:
            continue
        key = (rank, primary[rank])
        ss, ee = steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx]
        out["kernel"][idx] = iv.overlap(sets.union(key, "kernel"), ss, ee)
        out["busy"][idx] = iv.overlap(sets.union(key), ss, ee)
        compute = sets.union(key, "compute")
        if copy.any():
            out["bare_copies"][idx] = iv.overlap(iv.subtract(sets.union(key, "copy"), compute), ss, ee)
        # masks restricted to the device's rows (the masks themselves on a single-device trace)
        if direction is not None:
            floor = np.zeros(len(idx), np.int64)
            crow = sets.positions(key, sets.in_group(key, copy))
            dc = direction[crow]
            for d in np.flatnonzero(np.bincount(dc)) if len(dc) else ():
                r = crow[dc == d]
                floor = np.maximum(floor, iv.overlap(iv.union(s_all[r], e_all[r]), ss, ee))
            out["copy_floor"][idx] = floor
        c = sets.in_group(key, comm)
        if c.any():
            # collectives on a stream that also runs the model's kernels: data-dependent (the next
            # kernel on that stream waits for them); CPU stand-ins nest in their forward: all inline
            st, sin = sets.in_group(key, stream), sets.in_group(key, stand_in)
            inline = c & (np.isin(st, np.unique(st[sets.in_group(key, kern)])) | sin)
            if inline.any():
                r = sets.positions(key, inline)
                u = iv.union(s_all[r], e_all[r])
                if not sin[inline].all():
                    u = iv.subtract(u, sets.union(key, "noncomm"))
                out["exposed_inline"][idx] = iv.overlap(u, ss, ee)
    return out


def launching_thread(pieces: pd.DataFrame, keep: np.ndarray) -> tuple[int, int] | None:
    """(pid, tid) of the thread whose pieces among ``keep`` (a mask) hold the most time, ties to the
    lowest; None where no piece is kept. NOTE: read from the columns, no copy of the pieces."""
    if not keep.any():
        return None
    dur = pieces["end_ns"].to_numpy()[keep] - pieces["start_ns"].to_numpy()[keep]
    key = pd.Series(dur).groupby([pieces["pid"].to_numpy()[keep], pieces["tid"].to_numpy()[keep]]).sum().idxmax()
    return int(key[0]), int(key[1])


def edge_losses(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, primary: Mapping[int, int],
                model: HostActivity, rule: BurstRule | None, comm_ranks: set[int] | None,
                sets: DeviceSets, launcher: Mapping[int, tuple[int, int]] | None = None
                ) -> tuple[dict[Cause, np.ndarray], dict[str, int]]:
    """(per cause, per step: the step time outside the primary device's active window, attributed;
    of its unattributed time, the part inside each of the trace's own ranges or Python functions,
    as ``attribution.attribute`` names them)."""
    q, user = _edges(tl, steps, pieces, primary, model, rule, comm_ranks, sets, launcher)
    return bubbles_by_cause(q, primary, len(steps)), user


def _edges(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, primary: Mapping[int, int],
           model: HostActivity, rule: BurstRule | None, comm_ranks: set[int] | None,
           sets: DeviceSets, launcher: Mapping[int, tuple[int, int]] | None = None
           ) -> tuple[pd.DataFrame, dict[str, int]]:
    """Step time outside the primary device's active window, attributed like bubble pieces (by the
    rank's launching thread: the one most bubble time waits on, else the step's own thread).
    ``launcher``: per rank, that thread when known already (from all the trace's pieces)."""
    rows = []
    for rank, idx in by_rank(steps):
        dev = primary.get(int(rank))
        if dev is None:
            continue
        w0, w1 = sets.bounds((int(rank), dev))
        key: object = None
        if launcher is not None and int(rank) in launcher:
            key = launcher[int(rank)]
        elif len(pieces):
            key = launching_thread(pieces, (pieces["rank"].to_numpy() == rank) & (pieces["tid"].to_numpy() >= 0))
        if key is None:
            key = steps.iloc[idx].groupby(["pid", "tid"]).size().idxmax()
        pid, tid = cast(tuple[int, int], key)
        ss, ee = steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx]
        for a, z in ((ss, np.minimum(ee, w0)), (np.maximum(ss, w1), ee)):
            for i in np.flatnonzero(z > a):       # only steps reaching out of the window: a few
                rows.append((int(rank), dev, int(pid), int(tid), int(a[i]), int(z[i]), int(idx[i])))
    cols = ["rank", "device", "pid", "tid", "start_ns", "end_ns", "step_row"]
    q = pd.DataFrame(rows, columns=cols).astype(np.int64)
    if len(q) == 0:
        return q, {}
    classes, _, user = attribute(tl, q, rule or model.rule, model, comm_ranks)
    return pd.concat([q, classes], axis=1), user


def _short_gaps(steps: pd.DataFrame, primary: Mapping[int, int], threshold_ns: int,
                sets: DeviceSets) -> tuple[np.ndarray, np.ndarray]:
    """Per step: (gaps at or under the bubble threshold on the primary device inside the step, not
    inside a replayed CUDA graph; those inside one: the graph's own, where the host launches
    nothing), ns."""
    out, inside = np.zeros(len(steps), np.int64), np.zeros(len(steps), np.int64)
    for rank, idx in by_rank(steps):
        if int(rank) not in primary:
            continue
        key = (int(rank), primary[int(rank)])
        gs, ge = iv.gaps(sets.union(key), 0)
        k = (ge - gs) <= threshold_ns
        short = (gs[k], ge[k])
        ss, ee = steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx]
        spans = sets.graph_spans(key)
        if len(spans[0]):
            graphed = iv.intersect(short, spans)
            inside[idx] = iv.overlap(graphed, ss, ee)
            short = iv.subtract(short, spans)
        out[idx] = iv.overlap(short, ss, ee)
    return out, inside


def step_skew(steps: pd.DataFrame, comm: CommResult) -> np.ndarray:
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
    for _, idx in by_rank(steps):
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
