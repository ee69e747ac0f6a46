"""Attribution: split each bubble by what the host thread that launches the next device work was doing.

The host-activity model (``host_activity.HostActivity``) says, per thread and layer, what the host
was doing; a bubble piece takes, in order:
1. ``queued``: time after the next work's launch call returned (plus ``QUEUE_SLACK_NS``) — the work
   was already queued, so the device waited on a dependency (another stream, a peer), not the host;
2. the launching thread's layers: stages, engine frames, start-up calls, syncs, I/O, compilation,
   launch bursts, model operators, other CUDA calls (``host_activity`` gives the order);
3. where the thread idles (nothing open, no call), the innermost stage of the process's other
   stage-emitting thread (an overlap loop's forward thread waits for the scheduler thread);
4. else ``unattributed``.
Each part has a bubble class and a cause; both add up to each queried interval, in exact ns.

NOTE: the launching thread is the one whose API call is correlated (rank, pid, correlation) with the
device activity that ends the bubble; for probe traces (CPU stand-in rows) the thread of the forward
span that starts with it; else the rank's busiest launching (or stage-emitting) thread.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_activity import Activity, HostActivity
from srtscope.analyzers.analyses.host_threads import BurstRule, default_threads, innermost_segments, stage_names
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import isin, str_codes
from srtscope.analyzers.model.names import comm_mask, range_family
from srtscope.analyzers.model.timeline import ApiKind, Timeline
from srtscope.analyzers.model.vocab import BUBBLE_CLASSES, BubbleClass, Cause
from srtscope.probes.stages import resolve_stage

__all__ = ["BurstRule", "QUEUE_SLACK_NS", "attribute", "innermost_segments", "launch_calls",
           "launching_threads", "stage_names", "BUBBLE_CAUSES"]

#: after a launch call returns, the device takes a few µs to start the work; beyond this, it waits
QUEUE_SLACK_NS = 20_000
#: the API calls a device row's correlation id is looked up in: its launch (a kernel, a graph, a copy
#: or memset), whatever the path (a window carries these calls until their work starts)
LAUNCH_CALL_KINDS = (ApiKind.LAUNCH, ApiKind.MEMCPY, ApiKind.GRAPH_LAUNCH)

#: the causes a bubble's time can have (a straggler shows as collective time, not as bubbles; eager
#: fallback is told apart from launch_bound by the step, in ``diagnose``)
BUBBLE_CAUSES: tuple[str, ...] = tuple(c.value for c in Cause if c is not Cause.STRAGGLER)

def launching_threads(tl: Timeline, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) of the host thread that launched each given device row (-1 when unknown)."""
    pid, tid, _ = launch_calls(tl, rows)
    return pid, tid


def launch_calls(tl: Timeline, rows: np.ndarray, default: dict[int, tuple[int, int]] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pid, tid, end_ns) per given device row: the launching host thread (-1 when unknown) and
    the end of the correlated launch call (``LAUNCH_CALL_KINDS``; -1 when none). One join for both. ``default``:
    per rank, the thread taken where no call or range says (``default_threads``; computed when None)."""
    n = len(rows)
    pid = np.full(n, -1, np.int64)
    tid = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    if n == 0:
        return pid, tid, end
    # NOTE: the needed columns gathered as arrays: ``iloc`` on the whole tables takes every column
    dev = tl.device
    q = pd.DataFrame({"i": np.arange(n), **{c: dev[c].to_numpy()[rows] for c in
                                            ("rank", "pid", "correlation", "start_ns", "end_ns")}})
    api = tl.api
    if len(api):
        # only the API rows whose correlation id is asked for (a few per bubble, of millions)
        qc = q["correlation"].to_numpy()
        corr = api["correlation"].to_numpy()
        hit = np.flatnonzero(np.isin(corr, np.unique(qc[qc >= 0])))
        if "kind" in api.columns:       # a window's carried calls are launch calls already
            hit = hit[isin(api["kind"].iloc[hit], list(LAUNCH_CALL_KINDS))]
        a = pd.DataFrame({c: api[c].to_numpy()[hit] for c in ("rank", "pid", "correlation", "tid", "end_ns")})
        a = a.drop_duplicates(["rank", "pid", "correlation"]).rename(columns={"end_ns": "call_end_ns"})
        m = q[q["correlation"] >= 0].merge(a, on=["rank", "pid", "correlation"], how="inner")
        pid[m["i"].to_numpy()] = m["pid"].to_numpy()
        tid[m["i"].to_numpy()] = m["tid"].to_numpy()
        end[m["i"].to_numpy()] = m["call_end_ns"].to_numpy()
    todo = tid < 0
    if todo.any() and len(tl.host_ranges):  # probe traces: the forward span that is the device row
        r = tl.host_ranges[["rank", "start_ns", "end_ns", "pid", "tid"]].drop_duplicates(
            ["rank", "start_ns", "end_ns"])
        m = q[todo].drop(columns=["pid"]).merge(r, on=["rank", "start_ns", "end_ns"], how="inner")
        pid[m["i"].to_numpy()] = m["pid"].to_numpy()
        tid[m["i"].to_numpy()] = m["tid"].to_numpy()
    todo = tid < 0
    if todo.any():
        default = default_threads(tl) if default is None else default
        ranks = q["rank"].to_numpy()
        for rank in np.unique(ranks[todo]):
            if int(rank) in default:
                sel = todo & (ranks == rank)
                pid[sel], tid[sel] = default[int(rank)]
    return pid, tid, end



_DEFAULT_RULE = BurstRule()


def attribute(tl: Timeline, queries: pd.DataFrame, rule: BurstRule = _DEFAULT_RULE,
              model: HostActivity | None = None, comm_ranks: set[int] | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """Split each query interval (columns rank, pid, tid, start_ns, end_ns, optional queued_ns: the
    next work's launch end) by the host's activity.

    Returns (classes, stages, user_ranges). classes, indexed like ``queries``: one ``<class>_ns``
    column per ``BUBBLE_CLASSES`` and one ``cause.<cause>_ns`` per ``BUBBLE_CAUSES`` (each set adds
    up to end_ns - start_ns), ``covered_ns`` (time with any annotation open on the thread) and
    ``top_stage``. stages: one column per stage range name (innermost time, ns). user_ranges: of the
    unattributed time, how much lay inside each of the trace's own ranges that name no stage
    (innermost, by ``names.range_family``, ns, largest first), then, of the time no range covers,
    inside each Python function of the program (innermost frame not a built-in, named
    ``<function> (Python)``).
    ``comm_ranks``: the ranks with collective kernels (computed here when not given).
    NOTE: where queries of one thread overlap (bubbles of several devices at once) that time counts
    once per query.
    """
    model = model or HostActivity(tl, rule)
    n = len(queries)
    qs = queries["start_ns"].to_numpy(np.int64)
    qe = queries["end_ns"].to_numpy(np.int64)
    qq = queries["queued_ns"].to_numpy(np.int64) if "queued_ns" in queries else np.full(n, -1, np.int64)
    out = {f"{c}_ns": np.zeros(n, np.int64) for c in BUBBLE_CLASSES}
    cause = {c: np.zeros(n, np.int64) for c in BUBBLE_CAUSES}
    covered = np.zeros(n, np.int64)
    names, codes, classes = model.stage_names, model.stage_codes, model.stage_classes
    used = np.unique(codes[codes >= 0])
    col_of = np.full(len(names), -1, np.int64)
    col_of[used] = np.arange(len(used))
    stage_mat = np.zeros((n, len(used)), np.int64)
    rg = tl.host_ranges
    rcodes, rnames = str_codes(rg["name"]) if len(rg) else (np.zeros(0, np.int64), np.zeros(0, object))
    # NOTE: a step marker (``ProfilerStep#N``) covers the whole step: it names no work
    user_row = np.array([resolve_stage(str(x)) is None and not str(x).startswith("ProfilerStep#")
                         for x in rnames] + [False], dtype=bool)[rcodes]
    unames, fam = np.unique(np.array([range_family(str(x)) for x in rnames] + [""], dtype=object),
                            return_inverse=True)
    ucodes = fam.reshape(-1)[rcodes]
    user_ns = np.zeros(len(unames), np.int64)
    fcodes, fnames = model.program_functions
    frame_ns = np.zeros(len(fnames), np.int64)
    f_s, f_e = model.frames["start_ns"].to_numpy(), model.frames["end_ns"].to_numpy()
    engine = model.has_engine_evidence
    comm_ranks = _comm_ranks(tl) if comm_ranks is None else comm_ranks
    qgroups = queries.reset_index(drop=True).groupby(["rank", "pid", "tid"]).indices if n else {}
    keys = [k for k in qgroups if k[2] >= 0]
    helper = model.helper_threads(keys)
    model.prefetch(keys + sorted(set(helper.values())))
    r_s, r_e = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
    for key, qi in qgroups.items():
        a, b = qs[qi], qe[qi]
        # 1. queued: the device waited with the next work already launched
        qstart = np.where(qq[qi] >= 0, np.maximum(qq[qi] + QUEUE_SLACK_NS, a), b)
        qd = np.maximum(b - qstart, 0)
        out["queued_ns"][qi] += qd
        cause[(Cause.EXPOSED_COMM if key[0] in comm_ranks else Cause.COMPUTE).value][qi] += qd
        b = np.minimum(b, qstart)          # the rest of each piece is the host's
        if key[2] < 0:
            out["unattributed_ns"][qi] += b - a
            cause[Cause.HOST_UNATTRIBUTED.value][qi] += b - a
            continue
        th = model.layers(key, iv.union(a, b))
        covered[qi] = iv.overlap(th.ranges, a, b)
        ls, le, ll = th.stage_segments
        for code in np.unique(ll):
            m = ll == code
            stage_mat[qi, col_of[code]] += iv.overlap((ls[m], le[m]), a, b)
        claimed_here = np.zeros(len(qi), np.int64)
        for act, s in th.sets.items():
            ov = iv.overlap(s, a, b)
            out[f"{act.bubble_class.value}_ns"][qi] += ov
            c = act.cause
            if act is Activity.SYNC_API and engine:
                c = Cause.SCHED_CPU
            cause[c.value][qi] += ov
            claimed_here += ov
        other = model._thread_rows("rg", helper[key]) if key in helper else np.zeros(0, np.int64)
        if len(other):
            # the launching thread idles (nothing open, no call): the time is the wait for the thread
            # that hands it work, so that thread's innermost stage explains it (its sync.wait: the
            # hand-off, ``_STAGE_CAUSE``)
            idle = iv.subtract(iv.union(a, b), th.busy)
            sel = other[codes[other] >= 0]
            fs, fe, fl = innermost_segments(r_s[sel], r_e[sel], codes[sel])
            for code in np.unique(fl):
                part = iv.intersect(iv.union(fs[fl == code], fe[fl == code]), idle)
                ov = iv.overlap(part, a, b)
                stage_mat[qi, col_of[code]] += ov
                cls = str(classes[code])
                out[f"{cls}_ns"][qi] += ov
                cause[_STAGE_CAUSE[cls].value][qi] += ov
                claimed_here += ov
        rest = (b - a) - claimed_here
        out["unattributed_ns"][qi] += rest
        cause[Cause.HOST_UNATTRIBUTED.value][qi] += rest
        ri = model._thread_rows("rg", key)
        ui = ri[user_row[ri]] if len(ri) else ri
        if len(ui):
            _user_ranges(user_ns, (r_s[ui], r_e[ui], ucodes[ui]), (th.claimed,), (a, b))
        fi = model._thread_rows("frames", key) if len(fnames) else np.zeros(0, np.int64)
        fi = fi[fcodes[fi] >= 0] if len(fi) else fi
        if len(fi):
            # what no range explains, the Python functions running name (innermost of the program's own)
            ranged = iv.union(r_s[ui], r_e[ui]) if len(ui) else iv.empty()
            _user_ranges(frame_ns, (f_s[fi], f_e[fi], fcodes[fi]), (th.claimed, ranged), (a, b))
    res = pd.DataFrame(out, index=queries.index)
    for name in BUBBLE_CAUSES:
        res[f"cause.{name}_ns"] = cause[name]
    res["covered_ns"] = covered
    snames = names[used]
    if len(snames) and n:
        top = stage_mat.argmax(axis=1)
        has = stage_mat.max(axis=1) > 0
        res["top_stage"] = np.where(has, snames[top], "")
    else:
        res["top_stage"] = ""
    keep = stage_mat.sum(axis=0) > 0
    stages = pd.DataFrame(stage_mat[:, keep], index=queries.index, columns=list(snames[keep]))
    order = np.argsort(-user_ns, kind="stable")
    user = {str(unames[i]): int(user_ns[i]) for i in order if user_ns[i] > 0}
    for i in np.argsort(-frame_ns, kind="stable"):
        if frame_ns[i] > 0:
            label = f"{fnames[i]}{PYTHON_LABEL}"
            user[label] = user.get(label, 0) + int(frame_ns[i])
    return res, stages, user


#: the suffix of a Python function's name among the user ranges (``attribute``)
PYTHON_LABEL = " (Python)"


#: the cause of the time the launching thread idles while the thread that hands it work is inside a
#: stage of this class. ``sync``: that thread is itself blocked on results (vLLM's engine core in
#: ``MultiprocExecutor.collective_rpc`` / ``FutureWrapper.result``, waiting on this very worker), so
#: neither thread works on a stage: the hand-off between them (the messages, their serialising, the
#: wake-ups), none of the scheduler's own time. Recounted on a real vLLM server (clean, 36 steps): the
#: engine core's wait is 31.3 ms a step, 26.3 of it beside the worker's forward (no gap), 1.5 beside the
#: worker's own stages, 3.5 with neither process in a stage.
_STAGE_CAUSE = {BubbleClass.SCHEDULER.value: Cause.SCHED_CPU, BubbleClass.PREP.value: Cause.BATCH_PREP,
                BubbleClass.KERNEL.value: Cause.LAUNCH_BOUND, BubbleClass.SYNC.value: Cause.HANDOFF}


def comm_ranks_of(tl: Timeline, mask: np.ndarray) -> set[int]:
    """Ranks with collective kernels on their devices (``mask``: ``names.comm_mask``'s rows)."""
    return set(np.unique(tl.device["rank"].to_numpy()[mask]).tolist()) if mask.any() else set()


def _comm_ranks(tl: Timeline) -> set[int]:
    return comm_ranks_of(tl, comm_mask(tl.device))

def _user_ranges(acc: np.ndarray, rows: tuple, explained: tuple, queries: tuple) -> None:
    """Add to ``acc[label]`` the query time inside each innermost user range that no stage range,
    sync or launch burst explains."""
    sets = [x for x in explained if len(x[0])]
    why = iv.union(np.concatenate([x[0] for x in sets]), np.concatenate([x[1] for x in sets])) \
        if sets else iv.empty()
    unexplained = iv.subtract(iv.union(*queries), why)
    if not len(unexplained[0]):
        return
    # NOTE: the innermost range at a moment is one of those open then: the rows that miss the
    # unexplained time (most of a trace's Python frames, for a few bubbles) are left out first
    s, e, lab = rows
    near = (e > unexplained[0][0]) & (s < unexplained[1][-1])
    near[near] = iv.touches(unexplained, s[near], e[near])
    ss, se, sl = innermost_segments(s[near], e[near], lab[near])          # disjoint
    if len(ss):
        np.add.at(acc, sl, iv.overlap(unexplained, ss, se))


