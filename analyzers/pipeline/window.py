"""A diagnosis walked window by window: ``diagnose``'s figures with one window's rows in hand at a time.

A window owns the time ``[lo_ns, hi_ns)``: the steps, the bubble pieces and the device and API rows
that start in it. Windows are cut at step starts, so a step and every bubble piece (pieces are cut
at step boundaries) lie in one window. Each window is analysed on a Timeline holding the rows that
overlap its context ``[ctx_lo_ns, ctx_hi_ns)`` — its own time widened to the device activity on each
side, so the gaps that touch its edges are whole — with what only the whole trace can tell given as
``Context`` (the steps, each device's active window, the launch bursts of each thread, the threads
that launch and that emit stages). The parts are then added up (``reduce``) into the same
``Diagnosis`` as the whole-trace one, figure for figure.

Several ranks and devices: a window is cut at a step start of one rank, and each rank owns its own
time — the window's edges moved past that rank's open steps (``rank_edges``), so no rank's step is
ever cut — analysed as a window of its own (``Window.rank``, its rows only); each device has its own
context (``devices``); the collectives of every rank are matched once, in ``reduce``.
Scope: no step range (``applies``); a step range takes the whole-trace path.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.attribution import attribute, launch_calls
from srtscope.analyzers.analyses.bubbles import bubble_pieces, gaps_part, streams_part
from srtscope.analyzers.analyses.budget import step_budget
from srtscope.analyzers.analyses.capture import cold_part, stand_in_part
from srtscope.analyzers.analyses.comm import busy_in_window, comm_part
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.device_split import split_part
from srtscope.analyzers.analyses.eager import fallback_rows, with_causes
from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.analyses.kernels import kernels_part
from srtscope.analyzers.analyses.losses import StepLosses, step_losses
from srtscope.analyzers.analyses.overview import bins_part
from srtscope.analyzers.analyses.step_index import StepIndex
from srtscope.analyzers.model.columns import isin, rows_where
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.results import CommResult
from srtscope.analyzers.model.timeline import ApiKind, Timeline

Key = tuple[int, int]
_MIN, _MAX = int(np.iinfo(np.int64).min) // 2, int(np.iinfo(np.int64).max) // 2


@dataclass(frozen=True)
class Window:
    """Owned time ``[lo_ns, hi_ns)`` (of ``rank``: its steps, pieces and rows that start in it); rows
    overlapping ``[ctx_lo_ns, ctx_hi_ns)`` are read for it."""

    lo_ns: int
    hi_ns: int
    ctx_lo_ns: int
    ctx_hi_ns: int
    rank: int | None = None                  # the rank whose rows the window holds (None: every rank)

    def owns(self, t: np.ndarray) -> np.ndarray:
        return (t >= self.lo_ns) & (t < self.hi_ns)


#: the window of a whole read: all time, every rank
ALL_TIME = Window(_MIN, _MAX, _MIN, _MAX)


@dataclass
class Calls:
    """The launch calls a window's device rows may correlate to: those carried from earlier windows
    (their work had not started by then: ``carried``, columns ``CALL_COLUMNS`` and ``graph``) and
    the calls among the window's new API rows (``new``, where ``new_mask``). NOTE: the new rows are
    not copied into one table: a window asks for a few ids (its bubbles' next rows) of millions."""

    carried: pd.DataFrame
    new: pd.DataFrame | None = None
    new_mask: np.ndarray | None = None

    def of(self, ids: np.ndarray) -> pd.DataFrame:
        """The calls whose correlation is in ``ids``, the carried ones first, each in its order."""
        parts = []
        for df, m in ((self.carried, None), (self.new, self.new_mask)):
            if df is None or not len(df):
                continue
            corr = df["correlation"].to_numpy()
            hit = np.isin(corr, ids) if m is None else m & np.isin(corr, ids)
            parts.append(pd.DataFrame({c: df[c].to_numpy()[hit] for c in CALL_COLUMNS}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            {c: np.zeros(0, np.int64) for c in CALL_COLUMNS})


    def graph_launches(self) -> pd.DataFrame:
        """(rank, pid, correlation) of the graph launch calls a window's device rows may belong to:
        a replay's kernels run long after its launch, in windows that do not hold the call."""
        parts = []
        for df, m in ((self.carried, None), (self.new, self.new_mask)):
            if df is None or not len(df):
                continue
            g = df["graph"].to_numpy(bool) if "graph" in df else isin(df["kind"], [ApiKind.GRAPH_LAUNCH])
            if m is not None:
                g = g & m
            if g.any():
                parts.append(pd.DataFrame({c: df[c].to_numpy()[g] for c in ("rank", "pid", "correlation")}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            {c: np.zeros(0, np.int64) for c in ("rank", "pid", "correlation")})


#: what ``attribution.launch_calls`` reads of a call
CALL_COLUMNS = ("rank", "pid", "tid", "correlation", "end_ns")


@dataclass
class Context:
    """What the whole trace tells and one window cannot: set before the windows are walked."""

    steps: pd.DataFrame                      # the step table (``find_steps``), index 0..n-1
    source: str
    bounds: dict[Key, tuple[int, int]]       # each device's (first start, last end), ns
    primary: dict[int, int]                  # per rank, its busiest device (``budget.primary_devices``)
    comm_ranks: set[int]
    model: HostActivity                      # the trace's host model: stage names, bursts, threads
    default: dict[int, tuple[int, int]] | None   # per rank, the launching thread where nothing says
    #                                          (None: found in the rows, as asked: a whole read)
    calls: Calls                             # the calls a device row's launch is looked up in (its
    #                                          correlation): every launch a window may ask for
    evidence: bool                           # stage ranges or engine frames anywhere in the trace
    helpers: dict[tuple, tuple]              # per thread, the other thread of its process with the
    #                                          most stage ranges (``host_activity.stage_threads``)
    queries: dict[Key, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #                                          the straggler's device: the time before its arrivals
    #                                          whose busy share ``comm.finish`` asks for (``comm.straggler_queries``)
    whole: Timeline | None = None            # the whole trace, where one window holds it (a whole
    #                                          read): ``model`` and ``whole_sets`` are then its own
    whole_sets: DeviceSets | None = None
    whole_comm: tuple[str, pd.DataFrame] | None = None   # its collectives (``comm._instances``)

    def sets_of(self, tlw: Timeline) -> DeviceSets:
        """The device sets of a window's rows, each device's active window the whole trace's."""
        if tlw is self.whole and self.whole_sets is not None:
            return self.whole_sets
        sets = DeviceSets(tlw, graph_calls=self.calls.graph_launches())
        sets._bounds.update(self.bounds)
        return sets

    def model_of(self, tlw: Timeline, rule) -> HostActivity:
        """The host model of a window's rows, told what only the whole trace knows (bursts, stage
        names, helpers); the trace's own where the window holds it all."""
        if tlw is self.whole:
            return self.model
        m = HostActivity(tlw, rule, forward=self.model.forward)
        m._bursts.update(self.model._bursts)
        m.whole_evidence, m.whole_helpers = self.evidence, self.helpers
        return m

    @cached_property
    def step_index(self) -> StepIndex:
        """``steps`` by rank and time: a window asks its few steps of the trace's every one."""
        return StepIndex(self.steps)

    @cached_property
    def fallback_rows(self) -> np.ndarray:
        """The eager-fallback rows of ``steps`` (``eager.fallback_rows``): once, not per window
        (the step table is the whole trace's: 430 k steps at 10 GB)."""
        return fallback_rows(self.steps)


@dataclass
class Part:
    """One window's share of every figure (see ``reduce``)."""

    bubbles: pd.DataFrame                    # owned bubbles: rank, device, start_ns, end_ns, dur_ns
    pieces: pd.DataFrame                     # owned pieces, attributed, with their bubble's start
    stages: pd.DataFrame                     # per owned piece, innermost stage time by stage name
    user_ranges: dict[str, int]
    busy: dict[Key, int]                     # device busy time inside the window
    gaps: dict[Key, int]                     # gaps of the device's activity that start in it
    streams: dict[tuple[int, int, int], list[int]]   # first, last, busy, gap count, gap ns (clipped)
    budget: pd.DataFrame                     # the owned steps' budget rows
    losses: StepLosses                       # the owned steps' accounting (warm-up: recomputed)
    kernels: dict[str, list[int]]            # top-kernel candidates: name -> [count, total ns]
    kernel_counts: dict[str, int]            # kernel rows per name (one-pass check)
    split: dict[str, int]                    # device split totals (unions inside the window)
    copies: dict[str, list[int]]             # direction -> [ns, count, bytes, ns with bytes, pageable ns, any bytes]
    bins: dict[tuple[Key, str], np.ndarray]  # overview: per device and class, ns per bin
    comm: list[int] = field(default_factory=lambda: [0, 0, 0])   # collectives: total, exposed, rows
    cold: tuple[int, int] = (0, 0)                               # start-up calls: all, inside the active window
    piece_threads: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    straggler_busy: dict[Key, int] = field(default_factory=dict)   # ``queries``' busy ns inside the window
    cpu_rows: bool = False                                          # owned CPU stand-in rows
    step_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the owned steps' rows
    #                                          of ``Context.steps``: the order of ``budget`` and ``losses``


def applies(tl: Timeline, params: DiagnoseParams) -> bool:
    """Whether the windowed path covers this trace: device rows, no step range."""
    return params.step_range is None and len(tl.device) > 0


def plan(steps: pd.DataFrame, rows_before: np.ndarray, max_rows: int) -> list[tuple[int, int]]:
    """Owned time of each window, ``[(lo, hi)]`` covering all time: cut at step starts where no step
    of that step's rank is open, each window holding about ``max_rows`` device rows. ``rows_before``:
    per step in start order, the device rows starting before it. NOTE: a cut may fall inside a step
    of another rank: each rank's own edges are moved past its steps (``rank_edges``)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    cuts: list[int] = []
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable") if len(steps) else np.zeros(0, np.int64)
    st = steps["start_ns"].to_numpy(np.int64)[order]
    # per step in start order: the latest end of the earlier steps of its rank
    ends = pd.Series(steps["end_ns"].to_numpy(np.int64)[order])
    ranks = steps["rank"].to_numpy()[order] if "rank" in steps else np.zeros(len(st), np.int64)
    reach = ends.groupby(ranks).cummax().groupby(ranks).shift(1).fillna(_MIN).to_numpy(np.int64)
    last = 0
    for i in range(1, len(st)):
        if reach[i] > st[i]:
            continue                              # a step of its rank still open: no cut inside it
        if int(rows_before[i]) - last >= max_rows:
            cuts.append(int(st[i]))
            last = int(rows_before[i])
    edges = [_MIN, *cuts, _MAX]
    return list(zip(edges[:-1], edges[1:]))


def rank_edges(steps: pd.DataFrame, windows: list[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    """Per rank with steps, each window's owned time for that rank: the window's edges, each moved to
    the end of the rank's steps open at it (a run of overlapping steps), so that no step of the rank
    is cut; ``[lo, lo)`` where the window lies inside one of them. The edges stay in order."""
    out = {}
    for rank, idx in (steps.groupby("rank").indices.items() if len(steps) else []):
        s, e = steps["start_ns"].to_numpy(np.int64)[idx], steps["end_ns"].to_numpy(np.int64)[idx]
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.r_[True, s[1:] >= reach[:-1]])      # runs of overlapping steps
        bs, be = s[first], np.maximum.reduceat(e, first)
        edges = [windows[0][0]]
        for _, hi in windows:
            j = int(np.searchsorted(bs, hi, side="left")) - 1
            edges.append(int(be[j]) if j >= 0 and be[j] > hi else hi)
        out[int(cast(int, rank))] = list(zip(edges[:-1], edges[1:]))
    return out


def context_of(lo: int, hi: int, running_end: int | None, next_start: int | None) -> tuple[int, int]:
    """The context of owned time ``[lo, hi)``, ns: widened on the left to just inside the device
    activity that ends before it (``running_end``: the latest end of the device rows starting
    before ``lo``) and on the right to just past the first device row starting at or after ``hi``
    (``next_start``), so that every gap touching the window has both its ends in the context."""
    clo = lo if running_end is None or running_end > lo else running_end - 1
    chi = hi if next_start is None else max(hi, next_start + 1)
    return clo, chi


def window_part(tlw: Timeline, w: Window, ctx: Context, params: DiagnoseParams) -> Part:
    """One window's share of every figure, from ``tlw``: the rows overlapping ``w``'s context."""
    thr = params.threshold_ns
    sets = ctx.sets_of(tlw)
    mask = sets.comm
    steps, index = ctx.steps, ctx.step_index
    ranks = index.ranks if w.rank is None else [w.rank]
    own_steps = np.sort(np.concatenate([index.starting(r, w.lo_ns, w.hi_ns) for r in ranks])) if ranks \
        else np.zeros(0, np.int64)
    bub, busy, gaps = gaps_part(sets, w.lo_ns, w.hi_ns, thr)
    # NOTE: a queued launch can lie before the window's context: looked up in ``ctx.calls``
    nxt = bub["next_row"].to_numpy()
    ids = np.unique(tlw.device["correlation"].to_numpy()[nxt]) if len(nxt) else np.zeros(0, np.int64)
    joined = tlw if tlw is ctx.whole else Timeline(tlw.device, ctx.calls.of(ids[ids >= 0]), tlw.ranges,
                                                     tlw.counters, tlw.meta)
    pid, tid, ends = launch_calls(joined, nxt, ctx.default)
    bub["pid"], bub["tid"], bub["queued_ns"] = pid, tid, ends
    # NOTE: the steps that cut or hold the bubbles' time, not the trace's every step (labels kept)
    held = [index.holding(int(cast(int, r)), int(g["start_ns"].min()), int(g["end_ns"].max()))
            for r, g in bub.groupby("rank")] if len(bub) else []
    pieces = bubble_pieces(bub, steps.iloc[np.sort(np.concatenate(held))] if held else steps.iloc[:0])
    pieces = pieces[w.owns(pieces["start_ns"].to_numpy())].reset_index(drop=True)
    pieces["bubble_start_ns"] = bub["start_ns"].to_numpy()[pieces["bubble"].to_numpy()] if len(pieces) \
        else np.zeros(0, np.int64)
    model = ctx.model_of(tlw, params.burst_rule)
    classes, stages, user = attribute(tlw, pieces, params.burst_rule, model, ctx.comm_ranks)
    pieces = with_causes(pieces, classes, steps, ctx.fallback_rows)
    owned_b = bub[w.owns(bub["start_ns"].to_numpy())].drop(columns=["next_row", "queued_ns"])
    # the owned steps' budget and accounting, on local rows 0..m-1
    local = steps.iloc[own_steps].reset_index(drop=True)
    lp = pieces.copy()
    sr = lp["step_row"].to_numpy()
    pos = np.minimum(np.searchsorted(own_steps, sr), max(len(own_steps) - 1, 0))
    lp["step_row"] = np.where((sr >= 0) & (own_steps[pos] == sr), pos, -1) if len(own_steps) \
        else np.full(len(sr), -1, np.int64)
    lo, hi = w.lo_ns, w.hi_ns
    # NOTE: in the order that keeps the heap smallest: the device unions each figure reads are
    # merged (and kept, ``DeviceSets``) before the step accounting's own temporaries are made
    comm = comm_part(tlw, sets, lo, hi, ctx.whole_comm if tlw is ctx.whole else None)
    budget = step_budget(tlw, local, lp, mask, ctx.primary, sets)
    kernels = kernels_part(tlw.device, lo, hi, mask)
    split = split_part(tlw.device, sets, lo, hi)
    cold = cold_part(tlw.api, model.cold_calls, ctx.bounds, lo, hi)
    lost = step_losses(tlw, local, lp, budget.table, _no_comm(), ctx.primary, thr, model,
                       params.burst_rule, ctx.comm_ranks, sets)
    part = Part(owned_b, pieces, stages, user, busy, gaps, streams_part(sets, lo, hi, thr), budget.table, lost,
                *kernels, *split, bins_part(sets, ctx.bounds, lo, hi))
    part.comm, part.cold = comm, cold
    part.step_rows = own_steps
    part.straggler_busy = busy_in_window(sets, lo, hi, ctx.queries)
    part.cpu_rows = stand_in_part(tlw.device, lo, hi)
    return part


def _no_comm():
    return CommResult(0, 0, 0, 0, 0, 0, None, None, None, None, None, "none", pd.DataFrame())


def walk(windows: Iterable[tuple[Window, Timeline]], ctx: Context, params: DiagnoseParams) -> list[Part]:
    return [window_part(tlw, w, ctx, params) for w, tlw in windows]


def overlapping(df: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    """The rows of ``df`` overlapping ``[lo, hi)``, whole (not clipped), in their order.
    NOTE: a zero-length row at ``lo`` is kept (it starts in the window)."""
    s, e = df["start_ns"].to_numpy(), df["end_ns"].to_numpy()
    m = ((e > lo) & (s < hi)) | (s == lo)
    return df if m.all() else rows_where(df, m)


def crop_rows(tl: Timeline, lo: int, hi: int) -> Timeline:
    """The device, API and range rows of ``tl`` overlapping ``[lo, hi)``, whole; all counters."""
    return Timeline(overlapping(tl.device, lo, hi), overlapping(tl.api, lo, hi), overlapping(tl.ranges, lo, hi),
                    tl.counters, tl.meta)
