"""Steps from the API rows, where no range marks them (``steps._windows``' last resort), fed in start order.

Per launching thread (``ThreadSteps``), from its launch (kernel and graph) and blocking calls
(``host_threads.blocking_mask``):
- ``sync``: a step starts at the thread's first launch and at each end, after it, of the union of
  its blocking calls; the last step runs to the later of the thread's last launch end and the
  rank's last device end (at least 1 ns past its start);
- ``bursts`` (fewer than two such ends): a step starts at each launch that starts more than
  ``StepRule.gap_ns`` after every earlier launch of the thread ended; the last runs to that end.
A step in which the thread starts no launch is dropped. The thread a rank's steps come from is the
one ``host_threads.default_threads`` picks.

The whole read feeds each default thread's calls at once; the windowed read feeds every thread's
calls a chunk at a time (``ApiSteps``) and picks the threads at the end: both give the table with
``api_step_table``. Memory per thread: its kept steps and a few numbers, never its calls.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_threads import blocking_mask, run_starts
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import group_rows, isin
from srtscope.analyzers.model.timeline import ApiKind

Key = tuple[int, int, int]          # (rank, pid, tid)
#: a time past every row, ns: the last step's end before the device's last end is known
END_OF_TIME = int(np.iinfo(np.int64).max) // 2
_LAUNCH_KINDS = [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH]
_NONE = np.zeros(0, np.int64)


class ThreadSteps:
    """One thread's ``sync`` and ``bursts`` steps (module doc), fed its calls in start order."""

    def __init__(self, gap_ns: int) -> None:
        self.gap_ns = gap_ns
        self.first: int | None = None           # first launch start, ns
        self.last_end: int | None = None        # latest launch end, ns
        self.top = (-END_OF_TIME, 0)            # latest launch start, launches that start there
        self.open: tuple[int, int] | None = None   # the blocking calls' union interval that may grow
        self.n_syncs = 0                        # union ends after the first launch
        self.cur: int | None = None             # sync: the open step's start ...
        self.cur_n = 0                          # ... and the launches that start in it so far
        self.sync: list[tuple[np.ndarray, np.ndarray]] = []    # sync: closed steps with a launch
        self.run_end: int | None = None         # bursts: latest launch end so far
        self.bursts: list[np.ndarray] = []      # bursts: step starts

    def add(self, s: np.ndarray, e: np.ndarray, launch: np.ndarray, blocking: np.ndarray, upto: int) -> None:
        """Calls (int64 starts and ends, sorted by start) that start before ``upto``, ns; no call
        fed later starts before it. ``launch`` / ``blocking``: which are which."""
        ls, le = s[launch], e[launch]
        if len(ls):
            if self.first is None:
                self.first = int(ls[0])
            top = int(ls[-1])
            n_top = len(ls) - int(np.searchsorted(ls, top, side="left"))
            self.top = (top, n_top + (self.top[1] if self.top[0] == top else 0))
            self.last_end = max(int(le.max()), self.last_end if self.last_end is not None else int(le.max()))
            new, run_end = run_starts(ls, le, self.gap_ns, self.run_end)
            self.run_end = int(run_end[-1])
            if new.any():
                self.bursts.append(ls[new])
        bs, be = s[blocking], e[blocking]
        if self.open is not None:
            bs, be = np.r_[self.open[0], bs], np.r_[self.open[1], be]
        us, ue = iv.union(bs, be) if len(bs) else (_NONE, _NONE)
        # NOTE: an interval ending before ``upto`` is final (every later call starts after its end);
        # the last may grow while a call starting at or before its end can still come
        done = int(np.searchsorted(ue, upto, side="left"))
        self.open = (int(us[done]), int(ue[done])) if done < len(ue) else None
        if self.first is None:
            return                              # a union ending before the first launch bounds nothing
        bounds = ue[:done][ue[:done] > self.first]
        self.n_syncs += len(bounds)
        if self.cur is None:
            self.cur = self.first
        # every launch fed so far starts before ``upto``, so before any bound not yet final
        per = np.bincount(np.searchsorted(bounds, ls, side="right"), minlength=len(bounds) + 1)
        per[0] += self.cur_n
        if len(bounds):
            keep = per[:-1] > 0
            if keep.any():
                self.sync.append((np.r_[self.cur, bounds[:-1]][keep], bounds[keep]))
            self.cur = int(bounds[-1])
        self.cur_n = int(per[-1])

    def close(self) -> None:
        """No more calls: the open union interval is final."""
        self.add(_NONE, _NONE, np.zeros(0, bool), np.zeros(0, bool), END_OF_TIME)

    def steps(self, device_end: int | None) -> tuple[str, np.ndarray, np.ndarray] | None:
        """(``sync`` or ``bursts``, step starts, step ends), ns, after ``close``; None when the thread
        launched nothing. ``device_end``: the rank's last device end (None: no device rows)."""
        if self.first is None or self.last_end is None or self.cur is None:
            return None
        last = self.last_end if device_end is None else max(self.last_end, device_end)
        if self.n_syncs >= 2:
            end = max(last, self.cur + 1)
            # launches start at or before the last launch end: only one that starts there can be
            # past the end
            n = self.cur_n - (self.top[1] if self.top[0] == end else 0)
            tail = [(np.array([self.cur], np.int64), np.array([end], np.int64))] if n > 0 else []
            parts = self.sync + tail
            return "sync", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        b = np.concatenate(self.bursts)
        ends = np.r_[b[1:], last]
        # each step holds the launch it starts at, the last one unless that launch starts at its end
        keep = np.r_[np.ones(len(b) - 1, bool), b[-1] < last]
        return "bursts", b[keep], ends[keep]


def api_step_table(trackers: Mapping[Key, ThreadSteps], threads: Mapping[int, tuple[int, int]],
                   device_end: Mapping[int, int]) -> tuple[str, pd.DataFrame | None]:
    """(source, rank, pid, tid, start_ns, end_ns of the steps of each rank's thread in ``threads``
    (``default_threads``)), by rank then start; ``none`` and None when those threads launched
    nothing. ``device_end``: per rank, its last device end, ns (absent: no device rows)."""
    parts, source = [], "sync"
    for rank, (pid, tid) in sorted(threads.items()):
        t = trackers.get((rank, pid, tid))
        got = t.steps(device_end.get(rank)) if t is not None else None
        if got is None:
            continue
        kind, s, e = got
        if kind == "bursts":
            source = "bursts"
        parts.append(pd.DataFrame({"rank": rank, "pid": pid, "tid": tid, "start_ns": s, "end_ns": e}))
    if not parts:
        return "none", None
    return source, pd.concat(parts, ignore_index=True)


def thread_steps(s: np.ndarray, e: np.ndarray, launch: np.ndarray, blocking: np.ndarray,
                 gap_ns: int) -> ThreadSteps:
    """A thread's ``ThreadSteps`` fed all its calls at once."""
    s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
    if not iv.is_sorted(s):
        order = np.argsort(s, kind="stable")
        s, e, launch, blocking = s[order], e[order], launch[order], blocking[order]
    t = ThreadSteps(gap_ns)
    t.add(s, e, launch, blocking, END_OF_TIME)
    t.close()
    return t


class ApiSteps:
    """``ThreadSteps`` of every thread, fed API chunks whose starts never go back (each chunk's
    starts >= the previous chunk's). The calls at a chunk's last start wait for the next chunk, so a
    thread's calls that start together are fed together (a tie across two chunks)."""

    def __init__(self, gap_ns: int) -> None:
        self.gap_ns = gap_ns
        self.threads: dict[Key, ThreadSteps] = {}
        self.held: tuple[np.ndarray, ...] | None = None     # key, start, end, launch, blocking

    def add(self, api: pd.DataFrame) -> None:
        if len(api) == 0:
            return
        launch = isin(api["kind"], _LAUNCH_KINDS)
        blocking = blocking_mask(api) & (api["end_ns"].to_numpy() > api["start_ns"].to_numpy())
        m = np.flatnonzero(launch | blocking)
        keys = api[["rank", "pid", "tid"]].to_numpy(np.int64) if len(m) else np.zeros((0, 3), np.int64)
        rows: tuple[np.ndarray, ...] = (keys[m], api["start_ns"].to_numpy(np.int64)[m],
                                        api["end_ns"].to_numpy(np.int64)[m], launch[m], blocking[m])
        if self.held is not None:
            # the held calls and this chunk's that start with them, fed before the rest
            tie = int(np.searchsorted(rows[1], self.held[1][0], side="right"))
            rows_tie = tuple(np.concatenate([h, r[:tie]]) for h, r in zip(self.held, rows))
            self.held, rows = None, tuple(r[tie:] for r in rows)
            if len(rows[1]) == 0:
                self.held = rows_tie            # this chunk's calls all start with them: wait on
                return
            self._feed(rows_tie, int(rows[1][0]))
        upto = int(rows[1][-1]) if len(rows[1]) else None
        if upto is None:
            return
        now = int(np.searchsorted(rows[1], upto, side="left"))
        self._feed(tuple(r[:now] for r in rows), upto)
        self.held = tuple(r[now:] for r in rows)

    def close(self) -> dict[Key, ThreadSteps]:
        """No more chunks: every thread's steps, final."""
        if self.held is not None:
            self._feed(self.held, END_OF_TIME)
            self.held = None
        for t in self.threads.values():
            t.close()
        return self.threads

    def _feed(self, rows: tuple[np.ndarray, ...], upto: int) -> None:
        keys, s, e, launch, blocking = rows
        if len(s) == 0:
            return
        if (keys == keys[0]).all():
            groups: list[tuple[np.ndarray, np.ndarray | slice]] = [(keys[0], slice(None))]
        else:
            # each thread's rows, in start order
            groups = [(np.asarray(k), idx) for k, idx in
                      group_rows(pd.DataFrame(keys, columns=["rank", "pid", "tid"]), ["rank", "pid", "tid"]).items()]
        for k, idx in groups:
            key: Key = (int(k[0]), int(k[1]), int(k[2]))
            t = self.threads.get(key)
            if t is None:
                t = self.threads[key] = ThreadSteps(self.gap_ns)
            t.add(s[idx], e[idx], launch[idx], blocking[idx], upto)
