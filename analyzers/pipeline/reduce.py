"""The windows' parts added up into one ``Diagnosis``, figure for figure the whole-trace one.

``diagnose_windowed(tl, params, max_rows)`` walks a Timeline held in memory window by window (the
reference the streamed path is checked against); ``reduce`` is the adding up both share.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.advice import copy_kind_of
from srtscope.analyzers.analyses.attribution import comm_ranks_of
from srtscope.analyzers.analyses.bubbles import bubble_result, by_device, by_stream
from srtscope.analyzers.analyses.budget import BUDGET_COLUMNS, budget_result
from srtscope.analyzers.analyses.capture import capture_adequacy, capture_info, facts_of
from srtscope.analyzers.analyses.comm import _instances, comm_result, straggler_queries
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.device_split import device_of
from srtscope.analyzers.analyses.eager import eager_fallback, eager_reasons, fallback_mask
from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.analyses.host_threads import default_threads, stage_threads
from srtscope.analyzers.analyses.io_frames import io_work
from srtscope.analyzers.analyses.kernels import kernel_counts, top_kernels
from srtscope.analyzers.analyses.losses import (
    HOST_WAIT,
    StepLosses,
    edge_losses,
    launching_thread,
    step_skew,
    warmup_mask,
)
from srtscope.analyzers.analyses.overview import overview_of
from srtscope.analyzers.analyses.phases import phase_split
from srtscope.analyzers.analyses.range_totals import top_ranges
from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.analyses.verdict import decide
from srtscope.analyzers.analyses.whatif import what_if
from srtscope.analyzers.analyses.world import trace_world
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import distinct_keys
from srtscope.analyzers.model.params import DiagnoseParams, params_json
from srtscope.analyzers.model.results import CommResult, Diagnosis, StepsResult
from srtscope.analyzers.model.timeline import Timeline, WarningCode
from srtscope.analyzers.model.vocab import Cause
from srtscope.analyzers.pipeline.devices import contexts, in_contexts, of_rank, primary_of, rank_windows
from srtscope.analyzers.pipeline.forked import trim_heap
from srtscope.analyzers.pipeline.window import ALL_TIME, Calls, Context, Part, Window, crop_rows, plan, window_part


def one_window(tl: Timeline, source: str, steps: pd.DataFrame, sets: DeviceSets, params: DiagnoseParams,
               shrink_ns: Mapping[str, int] | None = None) -> Diagnosis:
    """The diagnosis of ``tl`` read whole: one window of all time over every rank (``steps``: its
    steps, ``sets``: its device sets)."""
    ctx, small, comm = trace_context(tl, source, steps, sets, params, whole=True)
    part = window_part(tl, ALL_TIME, ctx, params)
    return reduce([part], ctx, params, small, tl.span_ns, lambda lo, hi: tl, comm, shrink_ns)


def diagnose_windowed(tl: Timeline, params: DiagnoseParams, max_rows: int) -> Diagnosis:
    """``diagnose(tl, params)`` walked in windows of about ``max_rows`` device rows (``window.applies``)."""
    sets = DeviceSets(tl)
    source, steps = find_steps(tl, params.step_rule, sets)
    ctx, facts_tl, comm = trace_context(tl, source, steps, sets, params, whole=False)
    keys = sets.keys
    # per device: its rows' starts (in start order) and their running end
    dev = tl.device
    starts, ends = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    mine = {k: sets.rows(k) for k in keys}
    run = {k: np.maximum.accumulate(ends[g]) for k, g in mine.items()}
    parts = []
    rows_before = np.searchsorted(starts, np.sort(steps["start_ns"].to_numpy()), side="left")
    ranks = sorted({int(x) for df in (dev, tl.api, tl.ranges, steps) for x in df["rank"].unique()})
    for spans in rank_windows(steps, plan(steps, rows_before, max_rows), ranks):
        for r, lo, hi in spans:
            if hi <= lo:
                continue
            own = [k for k in keys if k[0] == r]
            running, nxt = {}, {}
            for k in own:
                g = mine[k]
                i, j = np.searchsorted(starts[g], [lo, hi], side="left")
                if i:
                    running[k] = int(run[k][i - 1])
                nxt[k] = int(starts[g][j]) if j < len(g) else None
            per, clo, chi = contexts(lo, hi, own, running, nxt)
            c = crop_rows(tl, clo, chi)
            tlw = Timeline(in_contexts(of_rank(c.device, r), per), of_rank(c.api, r), of_rank(c.ranges, r),
                           c.counters, c.meta)
            parts.append(window_part(tlw, Window(lo, hi, clo, chi, r), ctx, params))
    return reduce(parts, ctx, params, facts_tl, tl.span_ns, lambda lo, hi: crop_rows(tl, lo, hi), comm)


def trace_context(tl: Timeline, source: str, steps: pd.DataFrame, sets: DeviceSets, params: DiagnoseParams,
                  whole: bool) -> tuple[Context, Timeline, tuple[str, pd.DataFrame]]:
    """(the ``Context`` of ``tl`` held in memory, its metadata and ranges without rows, every
    collective). ``whole``: one window holds the trace (a whole read), whose host model is then the
    window's own, its bursts found as asked for; else every thread's bursts are found here."""
    model = HostActivity(tl, params.burst_rule)
    api = tl.api
    keys = sets.keys
    facts_tl = Timeline(tl.device.iloc[:0], tl.api.iloc[:0], tl.ranges, tl.counters, tl.meta)
    comm = _instances(tl, sets.comm)
    threads = set(distinct_keys(*(api[c].to_numpy() for c in ("rank", "pid", "tid")))) \
        if len(api) and not whole else set()
    for k in sorted(threads):
        model.bursts((k[0], k[1], k[2]))
    ctx = Context(steps, source, {k: sets.bounds(k) for k in keys},
                  primary_of({k: iv.total(sets.union(k)) for k in keys}),
                  comm_ranks_of(tl, sets.comm), model, None if whole else default_threads(tl), Calls(tl.api),
                  model.has_engine_evidence,
                  {} if whole else whole_helpers(tl, model, threads | range_threads(tl)),
                  straggler_queries(facts_tl, *comm, int(params.min_skew_us * 1000)),
                  tl if whole else None, sets if whole else None, comm if whole else None)
    return ctx, facts_tl, comm


def range_threads(tl: Timeline) -> set:
    """(rank, pid, tid) of every thread with ranges."""
    rg = tl.ranges
    return set(distinct_keys(*(rg[c].to_numpy() for c in ("rank", "pid", "tid")))) if len(rg) else set()


def whole_helpers(tl: Timeline, model: HostActivity, threads: set) -> dict:
    """``stage_threads`` of ``threads`` (rank, pid, tid): per thread, its process's stage thread."""
    return stage_threads(tl.host_ranges, model.stage_codes, sorted(threads))


def reduce(parts: list[Part], ctx: Context, params: DiagnoseParams, small: Timeline, span: tuple[int, int],
           rows_of, comm: tuple[str, pd.DataFrame], shrink_ns: Mapping[str, int] | None = None,
           n_comm: int | None = None) -> Diagnosis:
    """The parts of every window added up. ``small``: the trace's metadata, ranges and counters
    (no device or API rows); ``span``: first start and last end of all rows; ``rows_of(lo, hi)``: a
    Timeline of the rows overlapping ``[lo, hi)`` (the steps' edges are attributed on it);
    ``comm``: (source, rows) of every collective of every rank (``comm._instances``; ``n_comm``: how
    many, where one device's rows are only its first)."""
    steps, source, thr = ctx.steps, ctx.source, params.threshold_ns
    keys = sorted(ctx.bounds)
    # bubbles: the owned ones, numbered as the whole trace numbers them (device, then time)
    bubbles = _joined(parts, "bubbles")
    bubbles = bubbles.sort_values(["rank", "device", "start_ns"], kind="stable", ignore_index=True)
    pieces = _joined(parts, "pieces")
    stages = _joined(parts, "stages").fillna(0).astype(np.int64)
    names = [str(x) for x in ctx.model.stage_names]
    stages = stages[[c for c in names if c in stages.columns]]
    if len(pieces):
        pieces["bubble"] = _bubble_of(bubbles, pieces)
        order = np.lexsort((pieces["start_ns"].to_numpy(), pieces["bubble"].to_numpy(), pieces["rank"].to_numpy()))
        if (order != np.arange(len(order))).any():      # one rank and device: in order already
            pieces = pieces.take(order).reset_index(drop=True)
            stages = stages.take(order).reset_index(drop=True)
    del pieces["bubble_start_ns"]
    if len(parts) > 1:
        trim_heap()                     # the parts' tables, joined and released: their pages given back
    user: dict[str, int] = {}
    for p in parts:
        for k, v in p.user_ranges.items():
            user[k] = user.get(k, 0) + v
    # NOTE: ``attribute`` orders its user ranges largest first, ties by name
    user = dict(sorted(((k, v) for k, v in user.items() if v > 0), key=lambda kv: (-kv[1], kv[0])))
    devices = by_device(ctx.bounds, [p.busy for p in parts], [p.gaps for p in parts], bubbles)
    bres = bubble_result(bubbles, pieces, stages, devices, by_stream([p.streams for p in parts], thr),
                         user, thr, bool(len(small.host_ranges)))
    table = bres.table
    reasons = eager_reasons(steps)
    sres = StepsResult(source, steps, {str(k): int(v) for k, v in reasons[reasons != ""].value_counts().items()})
    csrc, inst = comm
    ctot = [sum(p.comm[i] for p in parts) for i in range(2)]
    cres = comm_result(small, csrc, inst, ctot[0], ctot[1], int(params.min_skew_us * 1000),
                       [p.straggler_busy for p in parts])
    if n_comm is not None:
        cres = replace(cres, n_kernels=n_comm)
    eres = eager_fallback(steps)
    # NOTE: the parts hold their steps in window order; the step table is by rank, then start
    order = step_order(parts)
    budget = budget_result(pd.concat([p.budget for p in parts], ignore_index=True).iloc[order]
                           .reset_index(drop=True)[list(BUDGET_COLUMNS)]) \
        if parts else budget_result(pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in BUDGET_COLUMNS}))
    tk = top_kernels([p.kernels for p in parts], params.top_kernels)
    dres = device_of([p.split for p in parts], [p.copies for p in parts])
    facts = facts_of(span, ctx.bounds, [p.cold for p in parts], any(p.cpu_rows for p in parts),
                     kernel_counts([p.kernel_counts for p in parts]))
    coverage, warnings = capture_adequacy(small.meta, ctx.model, dres, sres, bres, facts)
    m = replace(small.meta, warnings=list(small.meta.warnings))
    for w in warnings:
        m.warn(w.code, w.message)
    if m.has_warning(WarningCode.PARTIAL_RANKS):
        cres = replace(cres, partial=True)
    primary = ctx.primary
    losses, edge_user = _losses(parts, ctx, pieces, params, rows_of, cres, order)
    if edge_user:
        # the steps' host time outside the device's active window is lost time as much as a bubble
        for k, v in edge_user.items():
            user[k] = user.get(k, 0) + v
        user = dict(sorted(user.items(), key=lambda kv: (-kv[1], kv[0])))
        bres = replace(bres, by_user_range=user)
    budget = replace(budget, warmup=losses.warmup, lost_ns=losses.mean_lost())
    wif = what_if(small, steps, pieces, budget.table, cres, primary, thr, ctx.model, losses, shrink_ns,
                  copies_resident=copy_kind_of(dres) == "round_trip")
    io = io_work(small, ctx.model, pieces) if bres.by_cause.get(Cause.HOST_IO.value) else []
    verdict = decide(m, bres, cres, eres, tk, budget.table, source, params.healthy_pct, device=dres,
                     coverage=coverage, steps=sres, engine_evidence=ctx.model.has_engine_evidence,
                     losses=losses, what_if=wif, io=io,
                     world=trace_world(small, tk["name"].astype(str).tolist() if len(tk) else ()))
    capture = capture_info(m, keys, span, coverage)
    ov = overview_of([p.bins for p in parts], ctx.bounds, table, steps)
    phases = phase_split(steps, budget.table, params.healthy_pct, losses)
    return Diagnosis(verdict, bres, sres, eres, cres, budget, tk, capture, params_json(params), dres, ov, wif,
                     top_ranges(small), phases)


def _joined(parts: list[Part], name: str) -> pd.DataFrame:
    """The parts' ``name`` tables in one, in part order (``pd.concat``'s). NOTE: each part's table is
    released once copied (the reduction is their last reader): where every part has the same
    columns, the int64 ones are copied into one block part by part, so the whole trace's pieces are
    not held twice."""
    frames = [getattr(p, name) for p in parts]
    if len(frames) == 1:                # one window (a whole read): its table is the join
        setattr(parts[0], name, frames[0].iloc[:0].copy())
        return frames[0].reset_index(drop=True)
    first = frames[0] if frames else None
    if first is None or any(not f.dtypes.equals(first.dtypes) for f in frames) or not len(first.columns):
        out = pd.concat(frames, ignore_index=True)
        for p in parts:
            setattr(p, name, out.iloc[:0].copy())
        return out
    ints = [c for c, t in first.dtypes.items() if t == np.dtype(np.int64)]
    rows = sum(len(f) for f in frames)
    block = np.empty((len(ints), rows), np.int64)
    others: dict[str, list] = {c: [] for c in first.columns if c not in ints}
    pos = 0
    for i, p in enumerate(parts):
        f = frames[i]
        for j, c in enumerate(ints):
            block[j, pos:pos + len(f)] = f[c].to_numpy()
        for c, got in others.items():
            got.append(f[c])
        pos += len(f)
        frames[i] = f.iloc[:0].copy()          # no view: a slice would hold the part's columns
        setattr(p, name, frames[i])
    del f
    out = pd.DataFrame(block.T, columns=ints, copy=False)
    for c, got in others.items():
        out[c] = pd.concat(got, ignore_index=True)
    return out[list(first.columns)] if list(out.columns) != list(first.columns) else out


def _bubble_of(bubbles: pd.DataFrame, pieces: pd.DataFrame) -> np.ndarray:
    """Per piece, the row of its bubble in ``bubbles`` (its rank, device and ``bubble_start_ns``)."""
    keys = ("rank", "device", "start_ns")
    at = pd.MultiIndex.from_arrays([bubbles[c].to_numpy(np.int64) for c in keys])
    if not at.is_unique:
        raise ValueError("two owned bubbles of one device start at one time")
    got = at.get_indexer(pd.MultiIndex.from_arrays(
        [pieces[c].to_numpy(np.int64) for c in ("rank", "device", "bubble_start_ns")]))
    if (got < 0).any():
        raise ValueError("a piece of a bubble no window owns")
    return got.astype(np.int64)


def _losses(parts: list[Part], ctx: Context, pieces: pd.DataFrame, params: DiagnoseParams, rows_of,
            comm: CommResult, order: np.ndarray) -> tuple[StepLosses, dict[str, int]]:
    """The owned steps' accountings in step order, with the edges, the straggler's skew (``comm``:
    all the ranks' collectives) and the warm-up of all the steps. ``order``: ``step_order(parts)``."""
    steps = ctx.steps
    ls = [p.losses for p in parts]

    def cat(get) -> np.ndarray:
        return np.concatenate([get(x) for x in ls])[order] if ls else np.zeros(0, np.int64)
    lost = {c: cat(lambda x, c=c: x.lost[c]) for c in Cause}
    bub = {c: cat(lambda x, c=c: x.bubbles[c]) for c in Cause}
    n = len(steps)
    # the edges: steps reaching out of their rank's primary device's active window (the first and last few)
    out = edge_steps(steps, ctx.bounds, ctx.primary)
    edges = {c: np.zeros(n, np.int64) for c in HOST_WAIT}
    user: dict[str, int] = {}
    if out.any():
        launcher = {}
        if len(pieces):
            live, rk = pieces["tid"].to_numpy() >= 0, pieces["rank"].to_numpy()
            for rank in np.unique(steps["rank"].to_numpy()):
                k = launching_thread(pieces, live & (rk == rank))
                if k is not None:
                    launcher[int(rank)] = k
        idx = np.flatnonzero(out)
        sub = steps.iloc[idx].reset_index(drop=True)
        lo, hi = int(sub["start_ns"].min()), int(sub["end_ns"].max())
        tlw = rows_of(lo, hi)
        sets = ctx.sets_of(tlw)
        model = ctx.model_of(tlw, params.burst_rule)
        got, user = edge_losses(tlw, sub, pieces.iloc[:0], ctx.primary, model, params.burst_rule, ctx.comm_ranks,
                                sets, launcher)
        for c in HOST_WAIT:
            edges[c][idx] = got[c]
    for c in HOST_WAIT:
        lost[c] = lost[c] + edges[c]
        bub[c] = bub[c] + edges[c]
    # the short gaps of eager-fallback steps are the fallback's: which steps those are, all the steps tell
    small, fb_part, fb = cat(lambda x: x.small), cat(lambda x: x.fallback).astype(bool), fallback_mask(steps)
    lb, ef = Cause.LAUNCH_BOUND, Cause.EAGER_FALLBACK
    lost[lb] = lost[lb] - np.where(fb_part, 0, small) + np.where(fb, 0, small)
    lost[ef] = lost[ef] - np.where(fb_part, small, 0) + np.where(fb, small, 0)
    # the parts were accounted with no straggler: its skew, once all the ranks' collectives are matched
    skew, exposed = step_skew(steps, comm), cat(lambda x: x.exposed)
    lost[Cause.EXPOSED_COMM] = lost[Cause.EXPOSED_COMM] - exposed + np.maximum(exposed - skew, 0)
    lost[Cause.STRAGGLER] = lost[Cause.STRAGGLER] + skew
    return StepLosses(lost, bub, edges, small, cat(lambda x: x.graphed), fb,
                      exposed, cat(lambda x: x.exposed_inline), skew,
                      cat(lambda x: x.bare_copies), cat(lambda x: x.copy_floor), cat(lambda x: x.kernel),
                      cat(lambda x: x.busy), cat(lambda x: x.wall), warmup_mask(steps, lost[Cause.COLD_START])), user


def edge_steps(steps: pd.DataFrame, bounds: Mapping[tuple[int, int], tuple[int, int]],
               primary: Mapping[int, int]) -> np.ndarray:
    """Mask of the steps reaching out of their rank's primary device's active window (``losses._edges``)."""
    out = np.zeros(len(steps), bool)
    r = steps["rank"].to_numpy() if len(steps) else np.zeros(0, np.int64)
    s, e = (steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()) if len(steps) else (r, r)
    for rank, dev in primary.items():
        w0, w1 = bounds[(rank, dev)]
        on = r == rank
        out |= on & ((s < w0) | (e > w1))
    return out


def step_order(parts: list[Part]) -> np.ndarray:
    """The positions, in the parts' steps taken window after window, of the step table's rows in order."""
    rows = np.concatenate([p.step_rows for p in parts]) if parts else np.zeros(0, np.int64)
    return np.argsort(rows, kind="stable")
