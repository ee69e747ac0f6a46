"""Attribution: split each bubble by what the host thread that launches the next device work was doing.

Per time point of a bubble, on that thread, first match wins:
1. the innermost *stage* range (our names or real engines' aliases, ``probes.stages``) -> its class
   (scheduler / prep / kernel / sync); kernel-class time inside a burst of launches -> ``launch``;
2. else CUDA API state: inside a synchronize or a blocking copy -> ``sync``; inside a launch burst
   -> ``launch``;
3. else, where the thread has no range open at all (it idles, waiting for work), the innermost
   stage of the process's other stage-emitting thread (an overlap loop's forward thread waits for
   the scheduler thread);
4. else ``unattributed`` (host, unannotated).
The parts are exact integer nanoseconds and add up to each queried interval.

NOTE: the launching thread is the one whose API call is correlated (rank, pid, correlation) with the
device activity that ends the bubble; for probe traces (CPU stand-in rows) the thread of the forward
span that starts with it; else the rank's busiest launching (or stage-emitting) thread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.columns import group_rows, isin, str_codes
from srtscope.analyzers.names import range_family
from srtscope.analyzers.results import BUBBLE_CLASSES
from srtscope.analyzers.timeline import ApiKind, Timeline
from srtscope.probes.stages import StageClass, resolve_stage

_STAGE_CLASSES = (StageClass.SCHEDULER, StageClass.PREP, StageClass.KERNEL, StageClass.SYNC)


@dataclass(frozen=True)
class BurstRule:
    """A launch burst: >= ``min_launches`` launch calls, each starting <= ``gap_ns`` after the last ended."""

    gap_ns: int = 30_000
    min_launches: int = 4

    def __post_init__(self) -> None:
        if self.gap_ns < 0 or self.min_launches < 1:
            raise ValueError(f"bad launch-burst rule: gap_ns={self.gap_ns}, min_launches={self.min_launches}")


def stage_names(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(names, codes per range row, class per name) for the ranges that are non-container stages.

    codes is -1 for ranges that are not stages (unknown names and ``loop.step`` containers).
    """
    if len(ranges) == 0:
        return np.zeros(0, object), np.zeros(0, np.int64), np.zeros(0, object)
    codes, names = str_codes(ranges["name"])
    stages = [resolve_stage(n) for n in names]
    is_stage = np.array([s is not None and s.cls in _STAGE_CLASSES for s in stages], dtype=bool)
    ok = np.zeros(len(codes), dtype=bool)
    known = codes >= 0                      # -1: missing name
    ok[known] = is_stage[codes[known]]
    codes = np.where(ok, codes, -1)
    classes = np.array([s.cls.value if s is not None else "" for s in stages], dtype=object)
    return names, codes, classes


def innermost_segments(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray):
    """Flatten nested ranges of one thread into disjoint segments labelled by the innermost range.

    Returns (seg_starts, seg_ends, seg_labels); uncovered time has no segment. Vectorised: the
    innermost range at a point is the last-started one at the covering depth.
    """
    s, e, lab = np.asarray(starts, np.int64), np.asarray(ends, np.int64), np.asarray(labels)
    keep = e > s
    s, e, lab = s[keep], e[keep], lab[keep]
    if len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, lab.dtype)
    order = np.lexsort((-e, s))
    s, e, lab = s[order], e[order], lab[order]
    ends_sorted = np.sort(e)
    depth = np.arange(len(s)) - np.searchsorted(ends_sorted, s, side="right")
    bounds = iv.sorted_unique(np.concatenate([s, e]))
    left, right = bounds[:-1], bounds[1:]
    n_started = np.searchsorted(s, left, side="right")
    cover = n_started - np.searchsorted(ends_sorted, left, side="right")
    last = n_started - 1
    owner = np.full(len(left), -1, dtype=np.int64)
    for d in np.unique(cover[cover > 0] - 1):
        sel = np.flatnonzero(cover - 1 == d)
        level = np.flatnonzero(depth == d)
        if len(level) == 0:
            continue
        pos = np.searchsorted(level, last[sel], side="right") - 1
        ok = pos >= 0
        owner[sel[ok]] = level[pos[ok]]
    valid = owner >= 0
    valid[valid] = e[owner[valid]] > left[valid]
    return left[valid], right[valid], lab[owner[valid]]


def _bursts(s: np.ndarray, e: np.ndarray, rule: BurstRule) -> iv.IntervalSet:
    if len(s) < rule.min_launches:
        return iv.empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    new = np.r_[True, (s[1:] - e[:-1]) > rule.gap_ns]
    first = np.flatnonzero(new)
    counts = np.diff(np.r_[first, len(s)])
    last = np.r_[first[1:], len(s)] - 1
    keep = counts >= rule.min_launches
    return iv.union(s[first[keep]], e[last[keep]])


def launching_threads(tl: Timeline, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) of the host thread that launched each given device row (-1 when unknown)."""
    dev = tl.device.iloc[rows]
    n = len(rows)
    pid = np.full(n, -1, np.int64)
    tid = np.full(n, -1, np.int64)
    if n == 0:
        return pid, tid
    q = pd.DataFrame({"i": np.arange(n), "rank": dev["rank"].to_numpy(), "pid": dev["pid"].to_numpy(),
                      "correlation": dev["correlation"].to_numpy(), "start_ns": dev["start_ns"].to_numpy(),
                      "end_ns": dev["end_ns"].to_numpy()})
    api = tl.api
    if len(api):
        # only the API rows whose correlation id is asked for (a few per bubble, of millions)
        qc = q["correlation"].to_numpy()
        corr = api["correlation"].to_numpy()
        hit = np.flatnonzero(np.isin(corr, np.unique(qc[qc >= 0])))
        a = api.iloc[hit][["rank", "pid", "correlation", "tid"]]
        a = a.drop_duplicates(["rank", "pid", "correlation"])
        m = q[q["correlation"] >= 0].merge(a, on=["rank", "pid", "correlation"], how="inner")
        pid[m["i"].to_numpy()] = m["pid"].to_numpy()
        tid[m["i"].to_numpy()] = m["tid"].to_numpy()
    todo = tid < 0
    if todo.any() and len(tl.host_ranges):  # probe traces: the forward span that is the device row
        r = tl.host_ranges[["rank", "start_ns", "end_ns", "pid", "tid"]].drop_duplicates(
            ["rank", "start_ns", "end_ns"])
        m = q[todo].drop(columns=["pid"]).merge(r, on=["rank", "start_ns", "end_ns"], how="inner")
        pid[m["i"].to_numpy()] = m["pid"].to_numpy()
        tid[m["i"].to_numpy()] = m["tid"].to_numpy()
    todo = tid < 0
    if todo.any():
        default = _default_threads(tl)
        ranks = q["rank"].to_numpy()
        for rank in np.unique(ranks[todo]):
            if int(rank) in default:
                sel = todo & (ranks == rank)
                pid[sel], tid[sel] = default[int(rank)]
    return pid, tid


def _default_threads(tl: Timeline) -> dict[int, tuple[int, int]]:
    """Per rank, the thread issuing the most launches, else the one with the most stage ranges."""
    out: dict[int, tuple[int, int]] = {}
    api = tl.api
    if len(api):
        launches = api[api["kind"].isin([ApiKind.LAUNCH.value, ApiKind.GRAPH_LAUNCH.value])]
        if len(launches):
            top = launches.groupby(["rank", "pid", "tid"]).size().reset_index(name="n")
            for row in top.sort_values("n").itertuples():
                out[int(row.rank)] = (int(row.pid), int(row.tid))
    if len(tl.host_ranges):
        _, codes, _ = stage_names(tl.host_ranges)
        st = tl.host_ranges[codes >= 0]
        if len(st):
            top = st.groupby(["rank", "pid", "tid"]).size().reset_index(name="n")
            for row in top.sort_values("n").itertuples():
                out.setdefault(int(row.rank), (int(row.pid), int(row.tid)))
    return out


def attribute(tl: Timeline, queries: pd.DataFrame, rule: BurstRule = BurstRule()
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """Split each query interval (columns rank, pid, tid, start_ns, end_ns) by the host's activity.

    Returns (classes, stages, user_ranges). classes and stages are indexed like ``queries``: classes
    has one ``<class>_ns`` column per ``BUBBLE_CLASSES`` (adding up to end_ns - start_ns),
    ``covered_ns`` (time with any range open on the thread) and ``top_stage``; stages has one
    column per stage range name (innermost time, ns). user_ranges: of the unattributed time, how
    much lay inside each of the trace's own ranges that name no stage (innermost of those, by
    ``names.range_family``, ns, largest first) — what to name after a stage. NOTE: where queries of one thread overlap (bubbles
    of several devices at once) that time counts once there.
    """
    n = len(queries)
    qs = queries["start_ns"].to_numpy(np.int64)
    qe = queries["end_ns"].to_numpy(np.int64)
    out = {f"{c}_ns": np.zeros(n, np.int64) for c in BUBBLE_CLASSES}
    covered = np.zeros(n, np.int64)
    names, codes, classes = stage_names(tl.host_ranges)
    # one column per stage name that occurs (not per range name: Kineto has thousands of those)
    used = np.unique(codes[codes >= 0])
    col_of = np.full(len(names), -1, np.int64)
    col_of[used] = np.arange(len(used))
    stage_mat = np.zeros((n, len(used)), np.int64)
    rg, api = tl.host_ranges, tl.api
    # the trace's own ranges that name no stage, grouped by family (instance numbers dropped)
    rcodes, rnames = str_codes(rg["name"]) if len(rg) else (np.zeros(0, np.int64), np.zeros(0, object))
    user_row = np.array([resolve_stage(str(x)) is None for x in rnames] + [False], dtype=bool)[rcodes]
    unames, fam = np.unique(np.array([range_family(str(x)) for x in rnames] + [""], dtype=object),
                            return_inverse=True)
    ucodes = fam.reshape(-1)[rcodes]
    user_ns = np.zeros(len(unames), np.int64)
    qgroups = queries.reset_index(drop=True).groupby(["rank", "pid", "tid"]).indices if n else {}
    keys = [k for k in qgroups if k[2] >= 0]
    helper = _stage_threads(rg, codes, keys)
    rgroups = _rows_by_thread(rg, keys + sorted(set(helper.values())))
    agroups = _rows_by_thread(api, keys)
    is_launch = isin(api["kind"], [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH]) if len(api) else np.zeros(0, bool)
    blocking = _blocking_mask(api)
    r_s, r_e = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
    a_s, a_e = (api["start_ns"].to_numpy(), api["end_ns"].to_numpy()) if len(api) else (None, None)
    for key, qi in qgroups.items():
        if key[2] < 0:
            continue
        a, b = qs[qi], qe[qi]
        ri = rgroups.get(key, np.zeros(0, np.int64))
        covered[qi] = iv.overlap(iv.union(r_s[ri], r_e[ri]), a, b)
        sc = codes[ri]
        sel = ri[sc >= 0]
        ls, le, ll = innermost_segments(r_s[sel], r_e[sel], codes[sel])
        nvtx = iv.union(ls, le)
        cls_sets = {}
        for code in np.unique(ll):
            m = ll == code
            ov = iv.overlap((ls[m], le[m]), a, b)
            stage_mat[qi, col_of[code]] += ov
            cls_sets.setdefault(classes[code], []).append(m)
        def cls_set(c: str) -> iv.IntervalSet:
            ms = cls_sets.get(c)
            if not ms:
                return iv.empty()
            m = np.logical_or.reduce(ms)
            return iv.union(ls[m], le[m])
        ai = agroups.get(key, np.zeros(0, np.int64))
        lm = is_launch[ai]
        burst = _bursts(a_s[ai[lm]], a_e[ai[lm]], rule) if len(ai) else iv.empty()
        sync_api = iv.union(a_s[ai[blocking[ai]]], a_e[ai[blocking[ai]]]) if len(ai) else iv.empty()
        sync_free = iv.subtract(sync_api, nvtx)
        kern = cls_set(StageClass.KERNEL.value)
        launch_in_kernel = iv.intersect(kern, burst)
        launch_free = iv.subtract(iv.subtract(burst, nvtx), sync_api)
        lik = iv.overlap(launch_in_kernel, a, b)
        out["scheduler_ns"][qi] = iv.overlap(cls_set(StageClass.SCHEDULER.value), a, b)
        out["prep_ns"][qi] = iv.overlap(cls_set(StageClass.PREP.value), a, b)
        out["kernel_ns"][qi] = iv.overlap(kern, a, b) - lik
        out["sync_ns"][qi] = iv.overlap(cls_set(StageClass.SYNC.value), a, b) + iv.overlap(sync_free, a, b)
        out["launch_ns"][qi] = lik + iv.overlap(launch_free, a, b)
        other = rgroups.get(helper.get(key), np.zeros(0, np.int64))
        if len(other):
            # the launching thread idles (no range of its own, no API call): the time is the wait
            # for the thread that hands it work, so that thread's innermost stage explains it
            calls = (a_s[ai], a_e[ai]) if len(ai) else iv.empty()
            busy = iv.union(np.r_[r_s[ri], calls[0], burst[0]], np.r_[r_e[ri], calls[1], burst[1]])
            idle = iv.subtract(iv.union(a, b), busy)
            sel = other[codes[other] >= 0]
            fs, fe, fl = innermost_segments(r_s[sel], r_e[sel], codes[sel])
            for code in np.unique(fl):
                part = iv.intersect(iv.union(fs[fl == code], fe[fl == code]), idle)
                ov = iv.overlap(part, a, b)
                stage_mat[qi, col_of[code]] += ov
                out[f"{classes[code]}_ns"][qi] += ov
        ui = ri[user_row[ri]]
        if len(ui):
            _user_ranges(user_ns, (r_s[ui], r_e[ui], ucodes[ui]), (nvtx, sync_api, burst), (a, b))
    attributed = sum(out[f"{c}_ns"] for c in BUBBLE_CLASSES if c != "unattributed")
    out["unattributed_ns"] = (qe - qs) - attributed
    res = pd.DataFrame(out, index=queries.index)
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
    return res, stages, user


def _user_ranges(acc: np.ndarray, rows: tuple, explained: tuple, queries: tuple) -> None:
    """Add to ``acc[label]`` the query time inside each innermost user range that no stage range,
    sync or launch burst explains."""
    ss, se, sl = innermost_segments(*rows)          # disjoint
    sets = [x for x in explained if len(x[0])]
    why = iv.union(np.concatenate([x[0] for x in sets]), np.concatenate([x[1] for x in sets])) \
        if sets else iv.empty()
    unexplained = iv.subtract(iv.union(*queries), why)
    if len(ss) and len(unexplained[0]):
        np.add.at(acc, sl, iv.overlap(unexplained, ss, se))


def _stage_threads(rg: pd.DataFrame, codes: np.ndarray, keys: list[tuple]) -> dict[tuple, tuple]:
    """Per launching thread (rank, pid, tid) in ``keys``: the other thread of its process with the
    most stage ranges (an overlap loop's scheduler thread), when there is one."""
    st = rg[codes >= 0]
    if len(st) == 0 or not keys:
        return {}
    n = st.groupby(["rank", "pid", "tid"]).size().sort_values(ascending=False, kind="stable")
    out: dict[tuple, tuple] = {}
    for key in keys:
        for (r, p, t) in n.index:
            if (r, p) == key[:2] and t != key[2]:
                out[key] = (int(r), int(p), int(t))
                break
    return out


def _rows_by_thread(df: pd.DataFrame, keys: list[tuple]) -> dict[tuple, np.ndarray]:
    """Row indices of ``df`` per (rank, pid, tid) in ``keys``: a few masks instead of grouping
    millions of rows when few threads are asked for."""
    if len(df) == 0 or not keys:
        return {}
    if len(keys) > 8:
        return group_rows(df, ["rank", "pid", "tid"])
    r, p, t = (df[c].to_numpy() for c in ("rank", "pid", "tid"))
    out = {}
    for k in keys:
        rows = np.flatnonzero((r == k[0]) & (p == k[1]) & (t == k[2]))
        if len(rows):
            out[k] = rows
    return out


def _blocking_mask(api: pd.DataFrame) -> np.ndarray:
    """API rows during which the host is blocked on the device: syncs and synchronous copies."""
    if len(api) == 0:
        return np.zeros(0, bool)
    codes, cats = str_codes(api["name"])
    sync_copy = np.array(["Async" not in n for n in cats], dtype=bool)
    is_sync_copy = sync_copy[codes] if len(cats) else np.zeros(len(api), bool)
    return isin(api["kind"], [ApiKind.SYNC]) | (isin(api["kind"], [ApiKind.MEMCPY]) & is_sync_copy)
