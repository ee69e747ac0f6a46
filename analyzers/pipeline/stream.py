"""The windowed diagnosis of a trace read as start-sorted chunks: memory bounded by the window.

``diagnose_streamed(src, params, max_rows)`` takes a ``ChunkSource`` — the trace's metadata, ranges
and counters whole, its device and API rows as chunks in start order (``iter_device`` /
``iter_api``, callable again) — and gives the ``Diagnosis`` ``diagnose`` gives on the whole Timeline:
1. a first pass over the chunks (``first_pass``) gathers the ``Context`` (the steps when the API
   rows give them; the device side in ``devices.DeviceScan``: each device's active window
   and busy time, every rank's collectives, each device's next row past every step start; the
   launch counts and bursts of each thread, per step its busy time, launches and graph kernels,
   where the device rows fall between the steps);
2. a second pass cuts the rows into windows (``window.plan``; per rank its own edges, past its
   open steps: ``window.rank_edges``), per rank a Timeline of its rows overlapping its contexts —
   per device its own, the host rows over the widest — and analyses each (``window.window_part``);
   launch calls whose work has not started yet are carried to the windows that may ask for them;
   with ``workers=2`` the later windows are walked in a forked copy of the process beside this one
   (``split_at``, ``forked.Beside``), which carries the rows over the earlier windows without
   analysing them; its parts come back pickled, and where it fails its windows are walked here;
3. ``reduce.reduce`` adds the parts up; the collectives are matched there, once.
Peak memory: one window's rows (read to the step edge after it), the carried calls and rows that
outlive their window; held whole: the per-step tables, the row ending each device gap that spans a
step edge, the collective rows and the bubble table — not the trace's device or API tables.
NOTE: the host rows are read over the widest device context: a device idle for a long stretch (its
gap touching the window) keeps the host rows since its last activity in hand, as a bubble that long
needs them.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.attribution import LAUNCH_CALL_KINDS
from srtscope.analyzers.analyses.comm import _instances, straggler_queries
from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.analyses.host_threads import default_threads
from srtscope.analyzers.analyses.steps import find_steps, step_windows, steps_from_ranges
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import group_rows, isin, rows_where
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.results import Diagnosis
from srtscope.analyzers.model.timeline import ApiKind, Timeline, TimelineMeta, validate_table
from srtscope.analyzers.pipeline.devices import (
    DeviceScan,
    carried,
    contexts,
    in_contexts,
    next_rows,
    of_rank,
    primary_of,
    raise_running,
    rank_windows,
    started_before,
)
from srtscope.analyzers.pipeline.first_pass import ChunkSource, NotWindowable, first_pass
from srtscope.analyzers.pipeline.forked import Beside, available, resident_bytes, trim_heap
from srtscope.analyzers.pipeline.reduce import edge_steps, range_threads, reduce, whole_helpers
from srtscope.analyzers.pipeline.window import CALL_COLUMNS, Calls, Context, Window, overlapping, plan, window_part


@dataclass
class TimelineChunks:
    """A Timeline's device and API tables handed out in chunks of ``rows`` (a ``ChunkSource``)."""

    tl: Timeline
    rows: int

    @property
    def meta(self) -> TimelineMeta:
        return self.tl.meta

    @property
    def ranges(self) -> pd.DataFrame:
        return self.tl.ranges

    @property
    def counters(self) -> pd.DataFrame:
        return self.tl.counters

    @property
    def one_device(self) -> bool:
        d = self.tl.device
        r, v = d["rank"].to_numpy(), d["device"].to_numpy()
        return bool((r == r[0]).all() and (v == v[0]).all()) if len(d) else True

    @property
    def graph_launches(self) -> bool:
        return bool(isin(self.tl.api["kind"], [ApiKind.GRAPH_LAUNCH]).any())

    def iter_device(self) -> Iterator[pd.DataFrame]:
        return _chunks(self.tl.device, self.rows)

    def iter_api(self) -> Iterator[pd.DataFrame]:
        return _chunks(self.tl.api, self.rows)


def _chunks(df: pd.DataFrame, rows: int) -> Iterator[pd.DataFrame]:
    for i in range(0, len(df), rows):
        yield df.iloc[i:i + rows]


@dataclass(frozen=True)
class Held:
    """What the first pass leaves held, that the windows' size is chosen from (``Resize``)."""

    resident_bytes: int                 # this process's, its heap trimmed
    steps: int                          # of every rank
    collectives: int                    # rows of every rank's collectives, held whole, matched at the end
    range_rows: int = 0                 # the trace's ranges (held whole; a window copies its own)
    device_rows: int = 0                # device rows before the last step's start: the windows' measure


#: ``resize(held, rows, workers)``: after the first pass, the (rows a window, walks) to walk with
#: instead of ``(rows, workers)``
Resize = Callable[[Held, int, int], "tuple[int, int]"]


def diagnose_streamed(src: ChunkSource, params: DiagnoseParams, max_rows: int,
                      progress: Callable[[float], None] | None = None, workers: int = 1,
                      resize: Resize | None = None) -> Diagnosis:
    """``diagnose`` of the trace ``src`` holds, window by window (module doc). Raises
    ``NotWindowable`` for a step range, or steps that an engine's step openers give with the
    device rows.
    ``progress(fraction)``: after the first pass and each window. ``workers``: 2 walks the later
    windows in a forked copy beside this process (``split_at``), each holding a window of
    ``max_rows``: the same Diagnosis. ``resize``: the windows sized again from what the first pass
    left held (where the system says: ``forked.resident_bytes``); any size gives the same Diagnosis."""
    if params.step_range is not None:
        raise NotWindowable("a step range is diagnosed from the whole trace")
    w = _walked(src, params, max_rows, progress, workers, resize)
    ctx, edge_api, edges_q = w.ctx, w.edge_api, w.edges_q

    def rows_of(lo: int, hi: int) -> Timeline:
        # NOTE: the ranges over the edge steps' time only, as the API rows kept: the first and the
        # last steps asked for span the whole trace, and a model of all its ranges is not needed
        m = (edge_api["end_ns"].to_numpy() > lo) & (edge_api["start_ns"].to_numpy() < hi)
        rg = src.ranges
        rs, re_ = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
        on = np.zeros(len(rg), bool)
        for q0, q1 in edges_q:
            on |= ((re_ > max(lo, q0)) & (rs < min(hi, q1))) | (rs == max(lo, q0))
        return Timeline(validate_table(None, "device"), edge_api[m].reset_index(drop=True), rows_where(rg, on),
                        src.counters, src.meta)
    trim_heap()                         # the windows' freed arrays: the reduction's tables are others
    return reduce(w.parts, ctx, params, w.small, w.span, rows_of, w.comm, n_comm=w.n_comm)


@dataclass
class _Walked:
    """What the reduction needs of the walk (``_walked``)."""

    parts: list
    ctx: Context
    small: Timeline
    span: tuple[int, int]
    comm: tuple
    n_comm: int | None
    edge_api: pd.DataFrame              # the API rows over the edge steps (``_edge_ranges``)
    edges_q: list[tuple[int, int]]


def _walked(src: ChunkSource, params: DiagnoseParams, max_rows: int, progress: Callable[[float], None] | None,
            workers: int, resize: Resize | None = None) -> _Walked:
    """The first pass and the windows (module doc, steps 1 and 2). NOTE: its own function so that the
    walk and the first pass's step tables (O(steps) each) are not held through the reduction."""
    small = Timeline(validate_table(None, "device"), validate_table(None, "api"), src.ranges, src.counters,
                     src.meta)
    source, w = step_windows(small, params.step_rule)
    # "none" from the ranges alone: the API rows give the steps (found in the first pass)
    if not steps_from_ranges(small, source) and source != "none":
        raise NotWindowable(f"steps from {source!r} need the device rows")
    first = first_pass(src, small, (source, w) if source != "none" else None, params)
    trim_heap()                         # the chunks' heap, before the context's tables (matching the collectives)
    source = first.source
    _, steps = find_steps(small, params.step_rule, counts=first.counts, any_api=first.any_api,
                          windows=(source, first.windows))
    model = HostActivity(small, params.burst_rule)
    model._bursts.update(first.bursts)
    scan = first.scan
    keys = sorted(scan.bounds)
    comm = scan.comm_rows() if scan.has_comm else _instances(small, np.zeros(0, bool))
    ctx = Context(steps, source, scan.bounds, primary_of(scan.busy), first.comm_ranks, model,
                  default_threads(small, first.launches), Calls(_empty_calls()), model.has_engine_evidence,
                  # NOTE: the threads with ranges too (a probe trace has no API rows): a merged server's
                  # worker idles between messages while its engine core's stages explain the gap
                  whole_helpers(small, model, first.threads | range_threads(small)),
                  straggler_queries(small, *comm, int(params.min_skew_us * 1000)))
    walk = _Walk(src, ctx, params, scan, keys, _edge_ranges(steps, scan.bounds, ctx.primary))
    ranks = sorted({k[0] for k in keys} | {t[0] for t in first.threads}
                   | {int(x) for df in (src.ranges, steps) for x in df["rank"].unique()})
    # NOTE: cut on the steps the device pass saw (``First.cut_steps``: API steps before the device's
    # last end was known, each rank's last one open to the end of time): the candidate edges it kept
    cut, rows_before, span = first.cut_steps, first.cut_rows_before, first.span
    del first                           # its step tables: the Context and the cut hold what is needed
    # NOTE: the heap the spill's and the first pass's chunks left free is given back: the windows'
    # larger arrays do not fit its holes, and would grow the process past it (10 GB: 1.4 GiB held)
    gc.collect()
    trim_heap()
    if resize is not None and (held := resident_bytes()) is not None:
        dev_rows = int(rows_before[-1]) if len(rows_before) else 0
        max_rows, workers = resize(Held(held, len(steps), len(comm[1]), len(src.ranges), dev_rows), max_rows, workers)
    windows = rank_windows(cut, plan(cut, rows_before, max_rows), ranks)
    del cut, rows_before
    if progress is not None:
        progress(0.1)
    k = split_at(len(windows), workers)
    mine = len(windows) if k is None else k

    def walk_to(stop: int) -> None:
        for i in range(len(walk.parts_of), stop):
            if progress is not None and i:
                progress(0.1 + 0.9 * min(1.0, i / mine))
            walk.window(windows[i])
    if k is None:
        walk_to(len(windows))
    else:
        def theirs() -> tuple[list, list]:
            for spans in windows[:k]:
                walk.window(spans, analyse=False)
            walk.parts_of, walk.kept = [], []
            for spans in windows[k:]:
                walk.window(spans)
            return walk.parts_of, walk.kept
        with Beside(theirs) as other:
            walk_to(k)
            got = other.result()
        if got is None:
            walk_to(len(windows))          # the copy failed: its windows walked here
        else:
            walk.parts_of += got[0]
            walk.kept += got[1]
    # NOTE: each window's new rows, once each: in start order
    edge_api = pd.concat(walk.kept, ignore_index=True) if walk.kept else validate_table(None, "api")
    return _Walked([p for ps in walk.parts_of for p in ps], ctx, small, span, comm,
                   None if scan.keep_comm_rows else scan.comm_n, edge_api, walk.edges_q)


#: of a window's time, the part spent on what a replay repeats (reading, carrying, settling: not
#: ``window_part``), measured on the generated 1 GB export (1.5 s of 3.7)
REPLAY_SHARE = 0.4


def split_at(n: int, workers: int) -> int | None:
    """With two workers, the window where the copy (``forked.Beside``) takes over: the first ``k``
    windows analysed here, the rest by a copy that walks the first ``k`` without analysing them (to
    carry the same rows) — each side about the same time. None: one walk (one worker, one window,
    or no fork here)."""
    if workers < 2 or n < 2 or not available():
        return None
    return min(n - 1, max(1, round(n / (2 - REPLAY_SHARE))))


class _Walk:
    """The windows walked in time order, carrying what outlives each (module doc, step 2)."""

    def __init__(self, src: ChunkSource, ctx: Context, params: DiagnoseParams, scan: DeviceScan, keys: list,
                 edges_q: list[tuple[int, int]]) -> None:
        self.src, self.ctx, self.params, self.scan, self.keys, self.edges_q = src, ctx, params, scan, keys, edges_q
        self.dev, self.api = _Rows(src.iter_device()), _Rows(src.iter_api())
        self.carry_d, self.carry_a = validate_table(None, "device"), validate_table(None, "api")
        self.pending = _empty_calls()
        self.running: dict[tuple[int, int], int] = {}
        self.parts_of: list[list] = []        # per window walked, its parts (none when not analysed)
        self.kept: list[pd.DataFrame] = []    # API rows over the edge steps (``_edge_ranges``)

    def window(self, spans: list[tuple[int, int, int]], analyse: bool = True) -> None:
        """One window: ``spans`` per rank (rank, lo, hi); ``analyse`` False only carries its rows on."""
        scan, keys, ctx, src, running = self.scan, self.keys, self.ctx, self.src, self.running
        # per rank its owned time and contexts; the device rows are read to the candidate edge after
        # each rank's edge: a busy device's next row is among them, an idle one's kept by the first pass
        his = {r: hi for r, _, hi in spans}
        spans = [x for x in spans if x[2] > x[1]]
        d = _cat(self.carry_d, self.dev.before(max([*his.values(), *(scan.read_to(hi) for _, _, hi in spans)])))
        ctxs = {}
        for r, lo, hi in spans:
            starts, unread = next_rows(d, hi, r, scan)
            ctxs[r] = (*contexts(lo, hi, [k for k in keys if k[0] == r], running, starts), unread)
        chi = max([*(c[2] for c in ctxs.values()), *his.values()])
        # NOTE: not cut to this window's contexts: a rank owning nothing here reads its rows later
        a = _cat(self.carry_a, self.api.before(chi))
        new_a = a.iloc[len(self.carry_a):].reset_index(drop=True)   # the new rows: a view, not a copy
        is_call = (isin(new_a["kind"], list(LAUNCH_CALL_KINDS))
                   & (new_a["correlation"].to_numpy() >= 0)) if len(new_a) else np.zeros(0, bool)
        parts = []
        if analyse:
            ctx.calls = Calls(self.pending, new_a, is_call)
            for r, lo, hi in spans:
                per, rlo, rhi, unread = ctxs[r]
                dr = of_rank(d, r)
                dw = in_contexts(_cat(dr, pd.concat(unread, ignore_index=True)) if unread else dr, per)
                tlw = Timeline(dw, overlapping(of_rank(a, r), rlo, rhi),
                               overlapping(of_rank(src.ranges, r), rlo, rhi), src.counters, src.meta)
                parts.append(window_part(tlw, Window(lo, hi, rlo, rhi, r), ctx, self.params))
            ctx.calls = Calls(self.pending)          # the window's rows are not held into the next
            if self.edges_q and len(new_a):
                ns_, ne_ = new_a["start_ns"].to_numpy(), new_a["end_ns"].to_numpy()
                self.kept.append(new_a[np.logical_or.reduce([(ne_ > q0) & (ns_ < q1) for q0, q1 in self.edges_q])])
        self.parts_of.append(parts)
        # NOTE: the columns ``raise_running`` and ``_settled`` read, not every column of the window
        done = d.loc[started_before(d, his), ["rank", "device", "pid", "correlation", "end_ns"]]
        raise_running(running, done)
        self.pending = _settled(self.pending, new_a, is_call, done)
        self.carry_d = _own(carried(d, his, running), d)
        nlo = min([*his.values(), *(min(his[k[0]], r - 1) for k, r in running.items() if k[0] in his)])
        self.carry_a = _own(rows_where(a, (a["end_ns"].to_numpy() > nlo) | (a["start_ns"].to_numpy() >= nlo)), a)


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: np.zeros(0, np.int64) for c in CALL_COLUMNS}).assign(graph=np.zeros(0, bool))


def _cat(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    if len(b) == 0 or len(b.columns) == 0:
        return a
    if len(a) == 0:
        return b.reset_index(drop=True)
    return pd.concat([a, b], ignore_index=True)


def _own(kept: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``kept`` (rows of the window's ``rows``, carried to the next) in arrays of its own where it is
    under half of them: a slice would hold the whole window's columns into the next window."""
    return kept.copy() if 2 * len(kept) < len(rows) else kept


def _settled(pending: pd.DataFrame, new: pd.DataFrame, is_call: np.ndarray, started: pd.DataFrame) -> pd.DataFrame:
    """Of the carried calls ``pending`` and the calls among ``new`` (``is_call``), in that order, those
    whose work has not started yet: not in ``started`` (graph launches stay: many rows share their id)."""
    old = pending
    if len(pending) and len(started):
        drop = _in_keys(pending, started) & ~pending["graph"].to_numpy()
        old = rows_where(pending, ~drop)
    if not (len(new) and is_call.any()):
        return old
    graph = isin(new["kind"], [ApiKind.GRAPH_LAUNCH])
    keep = is_call & ~(_in_keys(new, started) & ~graph) if len(started) else is_call
    return _cat(old, pd.DataFrame({c: new[c].to_numpy()[keep] for c in CALL_COLUMNS}).assign(graph=graph[keep]))


def _in_keys(rows: pd.DataFrame, of: pd.DataFrame) -> np.ndarray:
    """Mask of ``rows`` whose (rank, pid, correlation) some row of ``of`` has.
    NOTE: per (rank, pid) the correlation ids alone: the processes are few, and a MultiIndex of a
    window's million rows hashed and sorted all three took a third of a two-rank export's windows."""
    ca, cb = rows["correlation"].to_numpy(np.int64), of["correlation"].to_numpy(np.int64)
    if not len(ca) or not len(cb):
        return np.zeros(len(ca), bool)
    a = [rows[c].to_numpy(np.int64) for c in ("rank", "pid")]
    b = [of[c].to_numpy(np.int64) for c in ("rank", "pid")]
    if all((x == x[0]).all() and (y == x[0]).all() for x, y in zip(a, b)):
        return np.isin(ca, cb)                     # one process: the correlation ids alone
    out = np.zeros(len(ca), bool)
    theirs = group_rows(of, ["rank", "pid"])
    for key, idx in group_rows(rows, ["rank", "pid"]).items():
        other = theirs.get(key)
        if other is not None:
            out[idx] = np.isin(ca[idx], cb[other])
    return out


def _edge_ranges(steps: pd.DataFrame, bounds: dict, primary: dict[int, int]) -> list[tuple[int, int]]:
    """The time of the steps outside their rank's primary device's active window (``losses.edge_losses``
    reads it), as disjoint intervals."""
    out = edge_steps(steps, bounds, primary)
    if not out.any():
        return []
    r, s, e = (steps[c].to_numpy()[out] for c in ("rank", "start_ns", "end_ns"))
    w0 = np.array([bounds[(int(x), primary[int(x)])][0] for x in r], np.int64)
    w1 = np.array([bounds[(int(x), primary[int(x)])][1] for x in r], np.int64)
    qs, qe = np.r_[s, np.maximum(s, w1)], np.r_[np.minimum(e, w0), e]
    keep = qe > qs
    us, ue = iv.union(qs[keep], qe[keep])
    return [(int(a), int(b)) for a, b in zip(us, ue)]


class _Rows:
    """Rows of a start-sorted chunk stream, handed out by time."""

    def __init__(self, chunks: Iterator[pd.DataFrame]) -> None:
        self.it = chunks
        self.buf: list[pd.DataFrame] = []
        self.done = False

    def _more(self) -> bool:
        for chunk in self.it:
            if len(chunk):
                self.buf.append(chunk)
                return True
        self.done = True
        return False

    def before(self, t: int) -> pd.DataFrame:
        """The rows not handed out yet that start before ``t``, in order."""
        out = []
        while True:
            while self.buf:
                s = self.buf[0]["start_ns"].to_numpy()
                j = int(np.searchsorted(s, t, side="left"))
                if j < len(s):
                    out.append(self.buf[0].iloc[:j])
                    self.buf[0] = self.buf[0].iloc[j:]
                    return pd.concat(out, ignore_index=True) if out else self.buf[0].iloc[:0]
                out.append(self.buf.pop(0))
            if not self._more():
                return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
