"""The windowed diagnosis of a trace read as start-sorted chunks: memory bounded by the window.

``diagnose_streamed(src, params, max_rows)`` takes a ``ChunkSource`` — the trace's metadata, ranges
and counters whole, its device and API rows as chunks in start order (``iter_device`` /
``iter_api``, callable again) — and gives the ``Diagnosis`` ``diagnose`` gives on the whole Timeline:
1. a first pass over the chunks (``windowed_first``) gathers the ``Context`` (the steps when the API
   rows give them, each device's active window, the launch counts and bursts of each thread, the
   collectives, per step its busy time, launches and graph kernels, where the device rows fall
   between the steps);
2. a second pass cuts the rows into windows (``windowed.plan``), each a Timeline of its context's
   rows, and analyses each (``windowed.window_part``); launch calls whose work has not started yet
   are carried to the windows that may ask for them;
3. ``windowed_reduce.reduce`` adds the parts up.
Peak memory: one window's rows, the carried calls and rows that outlive their window, the per-step
tables and the bubble table — not the trace's device or API tables.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.comm import _instances
from srtscope.analyzers.analyses.steps import find_steps, step_windows, steps_from_ranges
from srtscope.analyzers.columns import isin
from srtscope.analyzers.host_activity import HostActivity, default_threads
from srtscope.analyzers.params import DiagnoseParams
from srtscope.analyzers.results import Diagnosis
from srtscope.analyzers.timeline import ApiKind, Timeline, TimelineMeta, validate_table
from srtscope.analyzers.windowed import Context, Window, context_of, overlapping, plan, window_part
from srtscope.analyzers.windowed_first import ChunkSource, NotWindowable, first_pass
from srtscope.analyzers.windowed_reduce import reduce, whole_helpers

#: API kinds whose calls device rows correlate to: carried until their work starts
_CALL_KINDS = [ApiKind.LAUNCH, ApiKind.MEMCPY]


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

    def iter_device(self) -> Iterator[pd.DataFrame]:
        return _chunks(self.tl.device, self.rows)

    def iter_api(self) -> Iterator[pd.DataFrame]:
        return _chunks(self.tl.api, self.rows)


def _chunks(df: pd.DataFrame, rows: int) -> Iterator[pd.DataFrame]:
    for i in range(0, len(df), rows):
        yield df.iloc[i:i + rows]


def diagnose_streamed(src: ChunkSource, params: DiagnoseParams, max_rows: int,
                      progress: Callable[[float], None] | None = None) -> Diagnosis:
    """``diagnose`` of the trace ``src`` holds, window by window (module doc). Raises
    ``NotWindowable`` for a trace of several ranks or devices, a step range, or steps that an
    engine's step openers give with the device rows. ``progress(fraction)``: after the first pass
    and each window."""
    if params.step_range is not None:
        raise NotWindowable("a step range is diagnosed from the whole trace")
    small = Timeline(validate_table(None, "device"), validate_table(None, "api"), src.ranges, src.counters,
                     src.meta)
    source, w = step_windows(small, params.step_rule)
    # "none" from the ranges alone: the API rows give the steps (found in the first pass)
    if not steps_from_ranges(small, source) and source != "none":
        raise NotWindowable(f"steps from {source!r} need the device rows")
    first = first_pass(src, small, (source, w) if source != "none" else None, params)
    source = first.source
    _, steps = find_steps(small, params.step_rule, counts=first.counts, any_api=first.any_api,
                          windows=(source, first.windows))
    model = HostActivity(small, params.burst_rule)
    model._bursts.update(first.bursts)
    keys = sorted(first.bounds)
    comm = (first.comm_source, first.comm_rows) if first.comm_n else _instances(small, np.zeros(0, bool))
    ctx = Context(steps, source, first.bounds, {k[0]: k[1] for k in keys}, first.comm_ranks, model,
                  default_threads(small, first.launches), _empty_calls(), model.has_engine_evidence,
                  whole_helpers(small, model, first.threads))
    rows_before = first.rows_before
    edges_q = _edge_ranges(steps, first.bounds)
    kept: list[pd.DataFrame] = []
    parts = []
    dev, api = _Rows(src.iter_device()), _Rows(src.iter_api())
    carry_d, carry_a = validate_table(None, "device"), validate_table(None, "api")
    pending = _empty_calls()
    running: int | None = None
    windows = plan(steps, rows_before, max_rows)
    if progress is not None:
        progress(0.1)
    for i, (lo, hi) in enumerate(windows):
        if progress is not None and i:
            progress(0.1 + 0.9 * i / len(windows))
        clo, chi = context_of(lo, hi, running, dev.first_at_or_after(hi))
        new_a = api.before(chi)
        d = overlapping(_cat(carry_d, dev.before(chi)), clo, chi)
        a = overlapping(_cat(carry_a, new_a), clo, chi)
        before = d["start_ns"].to_numpy() < hi
        if before.any():
            top = int(d["end_ns"].to_numpy()[before].max())
            running = top if running is None else max(running, top)
        if len(new_a):
            calls = new_a[isin(new_a["kind"], _CALL_KINDS + [ApiKind.GRAPH_LAUNCH])
                          & (new_a["correlation"].to_numpy() >= 0)]
            pending = _cat(pending, calls[list(pending.columns)])
        ctx.calls = pending
        tlw = Timeline(d, a, overlapping(src.ranges, clo, chi), src.counters, src.meta)
        parts.append(window_part(tlw, Window(lo, hi, clo, chi), ctx, params))
        if edges_q and len(new_a):
            ns_, ne_ = new_a["start_ns"].to_numpy(), new_a["end_ns"].to_numpy()
            kept.append(new_a[np.logical_or.reduce([(ne_ > q0) & (ns_ < q1) for q0, q1 in edges_q])])
        pending = _settled(pending, d[before])
        nlo = hi if running is None or running > hi else running - 1
        carry_d = d[(d["end_ns"].to_numpy() > nlo) | (d["start_ns"].to_numpy() >= nlo)].reset_index(drop=True)
        carry_a = a[(a["end_ns"].to_numpy() > nlo) | (a["start_ns"].to_numpy() >= nlo)].reset_index(drop=True)
    # NOTE: each window's new rows, once each: in start order
    edge_api = pd.concat(kept, ignore_index=True) if kept else validate_table(None, "api")

    def rows_of(lo: int, hi: int) -> Timeline:
        m = (edge_api["end_ns"].to_numpy() > lo) & (edge_api["start_ns"].to_numpy() < hi)
        return Timeline(validate_table(None, "device"), edge_api[m].reset_index(drop=True), src.ranges,
                        src.counters, src.meta)
    return reduce(parts, ctx, params, small, first.span, rows_of, comm, n_comm=first.comm_n)


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in
                         ("rank", "pid", "tid", "correlation", "start_ns", "end_ns")}).assign(
        kind=pd.Series([], dtype=object), name=pd.Series([], dtype=object))


def _cat(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    if len(b) == 0 or len(b.columns) == 0:
        return a
    if len(a) == 0:
        return b.reset_index(drop=True)
    return pd.concat([a, b], ignore_index=True)


def _settled(pending: pd.DataFrame, started: pd.DataFrame) -> pd.DataFrame:
    """The calls whose work has not started yet (graph launches stay: many rows share their id)."""
    if len(pending) == 0 or len(started) == 0:
        return pending
    drop = _in_keys(pending, started) & ~isin(pending["kind"], [ApiKind.GRAPH_LAUNCH])
    return pending[~drop].reset_index(drop=True)


def _in_keys(rows: pd.DataFrame, of: pd.DataFrame) -> np.ndarray:
    """Mask of ``rows`` whose (rank, pid, correlation) some row of ``of`` has."""
    cols = ("rank", "pid", "correlation")
    a = [rows[c].to_numpy(np.int64) for c in cols]
    b = [of[c].to_numpy(np.int64) for c in cols]
    if all((x == x[0]).all() and (y == x[0]).all() for x, y in zip(a[:2], b[:2])):
        return np.isin(a[2], b[2])                 # one process: the correlation ids alone
    return pd.MultiIndex.from_arrays(a).isin(pd.MultiIndex.from_arrays(b))


def _edge_ranges(steps: pd.DataFrame, bounds: dict) -> list[tuple[int, int]]:
    """The time of the steps outside the device's active window (``losses.edge_losses`` reads it)."""
    if len(steps) == 0 or not bounds:
        return []
    w0 = min(b[0] for b in bounds.values())
    w1 = max(b[1] for b in bounds.values())
    s, e = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    out = []
    if (s < w0).any():
        out.append((int(s[s < w0].min()), int(w0)))
    if (e > w1).any():
        out.append((int(w1), int(e[e > w1].max())))
    return out


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

    def first_at_or_after(self, t: int) -> int | None:
        """The first start at or after ``t`` (reads ahead as needed; nothing is handed out)."""
        i = 0
        while True:
            while i < len(self.buf):
                s = self.buf[i]["start_ns"].to_numpy()
                j = int(np.searchsorted(s, t, side="left"))
                if j < len(s):
                    return int(s[j])
                i += 1
            if not self._more():
                return None

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
