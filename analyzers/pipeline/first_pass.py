"""The windowed diagnosis's first pass: what the windows need from the whole trace, from its chunks.

``first_pass(src, small, windows, params)`` reads a ``ChunkSource``'s start-sorted API and device
chunks and gives the steps and, per step, what ``steps.step_counts`` gives (busy time, graph kernels,
launches), the device side (``devices.DeviceScan``: each device's active window and busy
time, the collectives, the rows that end device gaps across step edges), the launch counts and
bursts of each thread and the device rows before each step (``window.plan``).

Steps from ranges are known before the pass: one pass over each table. Steps from the API rows
(``analyses/api_steps``) are found while the API chunks are read; the device pass then counts on
them with the last step of each rank running to the end of time (its true end, the device's last
end, is known only after that pass; no device row starts past it but at it), and a second pass over
the API chunks counts the launches per step. The windows are cut on the steps the device pass saw
(the scan keeps its rows for their edges): a provisional last step holds the final one. The device
pass runs beside the API pass that does not feed it, in a second thread (``_beside``). Memory: the
per-step tables, per-thread state, what ``DeviceScan`` holds, a chunk of each table in hand, and
the launch starts of each rank's last provisional step (``_Tail``, at most 4 M).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.api_steps import END_OF_TIME, ApiSteps
from srtscope.analyzers.analyses.host_threads import BurstTracker, default_threads, launch_counts
from srtscope.analyzers.analyses.step_index import StepIndex
from srtscope.analyzers.analyses.steps import COUNT_COLUMNS, api_step_windows
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import distinct_keys, group_rows, isin
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import ApiKind, DeviceKind, Timeline, TimelineMeta, validate_table
from srtscope.analyzers.pipeline.devices import DeviceScan

_D = TypeVar("_D")
_A = TypeVar("_A")


class NotWindowable(ValueError):
    """The trace is outside what the windowed path covers (it says why)."""


class ChunkSource(Protocol):
    meta: TimelineMeta
    ranges: pd.DataFrame
    counters: pd.DataFrame

    @property
    def one_device(self) -> bool:
        """Whether every device row is of one (rank, device), known before the chunks are read."""
        ...

    @property
    def graph_launches(self) -> bool:
        """Whether any API row is a graph launch, known before the chunks are read (False only
        where none is)."""
        ...

    def iter_device(self) -> Iterator[pd.DataFrame]: ...

    def iter_api(self) -> Iterator[pd.DataFrame]: ...


@dataclass
class First:
    source: str                         # where the steps come from (``find_steps``)
    windows: pd.DataFrame               # the steps (``step_windows``), by rank then start
    scan: DeviceScan                    # each device's bounds, busy time, next rows; the collectives
    span: tuple[int, int]
    counts: dict[str, np.ndarray]
    any_api: bool
    launches: pd.DataFrame
    bursts: dict
    comm_ranks: set[int]
    threads: set                        # (rank, pid, tid) of every thread with API rows
    cut_steps: pd.DataFrame             # the steps the windows are cut on (``DeviceScan``'s edges)
    cut_rows_before: np.ndarray         # per step of ``cut_steps`` in start order, device rows before it


def first_pass(src: ChunkSource, small: Timeline, windows: tuple[str, pd.DataFrame] | None,
               params: DiagnoseParams) -> First:
    """The first pass (module doc). ``small``: the trace's ranges, counters and metadata;
    ``windows``: the steps when the ranges give them (``step_windows``), None when the API rows do.
    The windows are cut on the steps the device pass saw (``First.cut_steps``).
    NOTE: the device pass and an API pass that needs nothing from it run at once, in two threads
    (numpy leaves the GIL for most of their time): the device pass needs the graph launches' keys
    from the API first only where the trace has graph launches."""
    if windows is not None:
        source, w = windows
        counts = {c: np.zeros(len(w), np.int64) for c in COUNT_COLUMNS}
        if src.graph_launches:
            api = _api_pass(src, params, (counts, StepIndex(w)), None)
            dev = _device_pass(src, w, counts, api.gkeys)
        else:
            dev, api = _beside(src, lambda s: _device_pass(s, w, counts, None),
                               lambda s: _api_pass(s, params, (counts, StepIndex(w)), None))
        return _first(source, w, counts, api, dev, w)
    tracker = ApiSteps(params.step_rule.gap_ns)
    api = _api_pass(src, params, None, tracker)
    threads = tracker.close()
    default = default_threads(small, api.launches)
    _, prov = api_step_windows(threads, default, {r: END_OF_TIME for r in default})
    counts = {c: np.zeros(len(prov), np.int64) for c in COUNT_COLUMNS}
    # NOTE: the launches per step are counted on the provisional steps beside the device pass; a
    # rank's last step then loses the calls at or past its true end (the tail's)
    tail = _Tail(prov)
    dev, _ = _beside(src, lambda s: _device_pass(s, prov, counts, api.gkeys),
                     lambda s: _launch_pass(s, counts, prov, tail))
    ends: dict[int, int] = {}
    for (rank, _), (_, hi) in dev.scan.bounds.items():
        ends[rank] = max(hi, ends.get(rank, hi))
    source, w = api_step_windows(threads, default, ends)
    keep = _kept(prov, w)
    _last_graph_kernels(prov, w, keep, counts, dev.gk_top)
    if tail.whole:
        tail.trim(prov, w, keep, counts)
        counts = {c: v[keep] for c, v in counts.items()}
    else:                                # the tail outgrew its bound: counted again on the final steps
        counts = {c: v[keep] for c, v in counts.items()}
        for c in ("launches", "graph_launches"):
            counts[c][:] = 0
        _launch_pass(src, counts, w, None)
    return _first(source, w, counts, api, dev, prov)


def _beside(src: ChunkSource, main: Callable[[ChunkSource], _D],
            other: Callable[[ChunkSource], _A]) -> tuple[_D, _A]:
    """``main(src)`` here and ``other(src)`` in a thread at the same time: both results. An error of
    either stops the other at its next chunk and is raised, once both are done (a pass that stopped
    early gives nothing out)."""
    stop = threading.Event()
    both = cast(ChunkSource, _Stoppable(src, stop))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="srtscope-first-pass") as pool:
        fut = pool.submit(other, both)
        fut.add_done_callback(lambda f: stop.set() if not f.cancelled() and f.exception() is not None else None)
        try:
            done = main(both)
        except BaseException:
            stop.set()
            raise
        return done, fut.result()


class _Stoppable:
    """``src`` whose chunks end early once ``stop`` is set (the other pass failed)."""

    def __init__(self, src: ChunkSource, stop: threading.Event) -> None:
        self._src, self._stop = src, stop

    def __getattr__(self, name: str) -> object:
        return getattr(self._src, name)

    def iter_device(self) -> Iterator[pd.DataFrame]:
        return self._until(self._src.iter_device())

    def iter_api(self) -> Iterator[pd.DataFrame]:
        return self._until(self._src.iter_api())

    def _until(self, chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for c in chunks:
            if self._stop.is_set():
                return
            yield c


def _launch_pass(src: ChunkSource, counts: dict[str, np.ndarray], w: pd.DataFrame, tail: _Tail | None) -> None:
    """Launches and graph launches per step of ``w`` over the API chunks (``tail`` sees each)."""
    steps = StepIndex(w)
    for a in src.iter_api():
        if len(a):
            _count_launches(a, counts, steps)
            if tail is not None:
                tail.add(a)


class _Tail:
    """The launch and graph-launch starts in each rank's last provisional step (open to the end of
    time), to take those at or past its true end off its counts. At most ``MAX_TAIL`` starts held:
    past that, ``whole`` is False and nothing more is kept."""

    MAX_TAIL = 1 << 22

    def __init__(self, prov: pd.DataFrame) -> None:
        self.first = {int(cast(int, r)): int(prov["start_ns"].to_numpy()[idx[-1]])
                      for r, idx in prov.groupby("rank").indices.items()}
        self.starts: dict[tuple[int, str], list[np.ndarray]] = {}
        self.n = 0
        self.whole = True

    def add(self, a: pd.DataFrame) -> None:
        if not self.whole:
            return
        s_, r_ = a["start_ns"].to_numpy(), a["rank"].to_numpy()
        for kind in (ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH):
            is_k = isin(a["kind"], [kind])
            for rank, first in self.first.items():
                got = s_[is_k & (r_ == rank) & (s_ >= first)]
                if len(got):
                    self.starts.setdefault((rank, kind.value), []).append(got)
                    self.n += len(got)
        if self.n > self.MAX_TAIL:
            self.whole, self.starts = False, {}

    def trim(self, prov: pd.DataFrame, final: pd.DataFrame, keep: np.ndarray, counts: dict[str, np.ndarray]) -> None:
        """Each rank's last kept step loses the calls that start at or past its final end."""
        for rank, idx in prov.groupby("rank").indices.items():
            last = int(idx[-1])
            if not keep[last]:
                continue
            end = int(final.loc[final["rank"] == rank, "end_ns"].max())
            for kind, col in ((ApiKind.LAUNCH, "launches"), (ApiKind.GRAPH_LAUNCH, "graph_launches")):
                parts = self.starts.get((int(cast(int, rank)), kind.value))
                if parts:
                    counts[col][last] -= int(sum(int((p >= end).sum()) for p in parts))


def _first(source: str, w: pd.DataFrame, counts: dict[str, np.ndarray], api: _Api, dev: _Device,
           cut: pd.DataFrame) -> First:
    scan = dev.scan
    comm_ranks = {int(r) for r in scan.comm_rows()[1]["rank"].unique()} if scan.has_comm else set()
    spans = [x for x in (api.span, dev.span) if x is not None]
    span = (min(x[0] for x in spans), max(x[1] for x in spans)) if spans else (0, 0)
    return First(source, w, scan, span, counts, api.any_api, api.launches, api.bursts, comm_ranks,
                 api.threads, cut, dev.rows_before)


def _kept(prov: pd.DataFrame, final: pd.DataFrame) -> np.ndarray:
    """Mask of the provisional steps that are final steps (the same but a rank's last one may go)."""
    key = ["rank", "start_ns"]
    return pd.MultiIndex.from_frame(prov[key].astype(np.int64)).isin(
        pd.MultiIndex.from_frame(final[key].astype(np.int64)))


def _last_graph_kernels(prov: pd.DataFrame, final: pd.DataFrame, keep: np.ndarray, counts: dict[str, np.ndarray],
                        gk_top: dict[int, tuple[int, int]]) -> None:
    """Graph kernels of each rank's last step counted up to the end of time, less those that start
    at its true end (``[start, end)``): only rows that start at the device's last end can."""
    for rank, idx in prov.groupby("rank").indices.items():
        last = int(idx[-1])
        top = gk_top.get(int(cast(int, rank)))
        if not keep[last] or top is None:
            continue
        end = int(final.loc[final["rank"] == rank, "end_ns"].max())
        if top[0] >= end:
            counts["graph_kernels"][last] -= top[1]


@dataclass
class _Api:
    span: tuple[int, int] | None
    any_api: bool
    launches: pd.DataFrame
    bursts: dict
    threads: set
    gkeys: pd.DataFrame | None           # (rank, pid, correlation) of the graph launches


def _api_pass(src: ChunkSource, params: DiagnoseParams, steps: tuple | None, tracker: ApiSteps | None) -> _Api:
    """API chunks: the time span, launches per thread, bursts, graph launches; launches per step
    when the steps are known (``steps``: counts, starts, ends, ranks), else the calls are fed to
    ``tracker``."""
    lo = hi = None
    rg = src.ranges
    if len(rg):
        lo, hi = int(rg["start_ns"].min()), int(rg["end_ns"].max())
    trackers: dict[tuple[int, int, int], BurstTracker] = {}
    lc: list[pd.DataFrame] = []
    glaunch: list[pd.DataFrame] = []
    any_api = False
    threads: set = set()
    for a in src.iter_api():
        if len(a) == 0:
            continue
        any_api = True
        lo = int(a["start_ns"].min()) if lo is None else min(lo, int(a["start_ns"].min()))
        hi = int(a["end_ns"].max()) if hi is None else max(hi, int(a["end_ns"].max()))
        lc.append(launch_counts(a))
        threads.update(distinct_keys(*(a[c].to_numpy() for c in ("rank", "pid", "tid"))))
        if steps is not None:
            _count_launches(a, *steps)
        if tracker is not None:
            tracker.add(a)
        is_l, is_g = isin(a["kind"], [ApiKind.LAUNCH]), isin(a["kind"], [ApiKind.GRAPH_LAUNCH])
        if is_g.any():
            glaunch.append(a.loc[is_g & (a["correlation"].to_numpy() >= 0), ["rank", "pid", "correlation"]])
        both = is_l | is_g
        if both.any():
            la = a[both]
            for key, idx in group_rows(la, ["rank", "pid", "tid"]).items():
                k = (int(key[0]), int(key[1]), int(key[2]))
                t = trackers.setdefault(k, BurstTracker(params.burst_rule))
                t.add(la["start_ns"].to_numpy()[idx], la["end_ns"].to_numpy()[idx])
    launches = (cast(pd.DataFrame, pd.concat(lc, ignore_index=True).groupby(["rank", "pid", "tid"],
                                                                           as_index=False)["n"].sum())
                if lc else launch_counts(validate_table(None, "api")))
    gkeys = (pd.concat(glaunch, ignore_index=True).drop_duplicates() if glaunch else None)
    return _Api(None if lo is None or hi is None else (lo, hi), any_api, launches,
                {k: t.bursts() for k, t in trackers.items()}, threads, gkeys)


def _count_launches(a: pd.DataFrame, counts: dict[str, np.ndarray], steps: StepIndex) -> None:
    """Adds the launch and graph-launch calls of the chunk ``a`` that start in each step."""
    is_l, is_g = isin(a["kind"], [ApiKind.LAUNCH]), isin(a["kind"], [ApiKind.GRAPH_LAUNCH])
    s_, r_ = a["start_ns"].to_numpy(), a["rank"].to_numpy()
    for rank in steps.ranks:
        mine = r_ == rank
        for col, m in (("launches", is_l), ("graph_launches", is_g)):
            ts = s_[mine & m]
            if len(ts):
                on = steps.near(rank, int(ts[0]), int(ts[-1]))
                counts[col][on] += _count_in(ts, steps.ws[on], steps.we[on])


@dataclass
class _Device:
    scan: DeviceScan
    span: tuple[int, int] | None          # (first start, last end) of the device rows, ns
    rows_before: np.ndarray
    gk_top: dict[int, tuple[int, int]]     # per rank, the latest graph-kernel start and its rows


def _device_pass(src: ChunkSource, w: pd.DataFrame, counts: dict[str, np.ndarray],
                 gkeys: pd.DataFrame | None) -> _Device:
    """Device chunks: each device's figures (``DeviceScan``, its candidate edges the starts and ends
    of ``w``), per step of ``w`` its busy time and graph kernels (added to ``counts``), the rows
    before each step (in start order)."""
    steps = StepIndex(w)
    ws, we = steps.ws, steps.we
    lo: int | None = None
    hi: int | None = None
    order = np.argsort(ws, kind="stable")
    wso = ws[order]
    scan = DeviceScan(np.unique(np.r_[ws, we]), comm_rows=not src.one_device)
    # per step in start order, the rows before it: counted where a chunk's starts reach the step,
    # the chunk's every row added at once to the steps past it (a running sum at the end)
    rows_at = np.zeros(len(w), np.int64)
    past = np.zeros(len(w) + 1, np.int64)
    open_iv: dict[int, tuple[int, int]] = {}
    gk_top: dict[int, tuple[int, int]] = {}
    for d in src.iter_device():
        if len(d) == 0:
            continue
        scan.add(d)
        s_, e_ = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
        lo = int(s_.min()) if lo is None else min(lo, int(s_.min()))
        hi = int(e_.max()) if hi is None else max(hi, int(e_.max()))
        j0 = int(np.searchsorted(wso, s_[0], side="right"))
        j1 = int(np.searchsorted(wso, s_[-1], side="right"))
        rows_at[j0:j1] += np.searchsorted(s_, wso[j0:j1], side="left")
        past[j1] += len(s_)
        r_ = d["rank"].to_numpy(np.int64)
        gk = ((d["graph_id"].to_numpy() >= 0) | (d["graph_node"].to_numpy() >= 0)
              | isin(d["kind"], [DeviceKind.GRAPH]))
        if gkeys is not None and len(gkeys):
            q = pd.DataFrame({"i": np.arange(len(d)),
                              **{c: d[c].to_numpy(np.int64) for c in ("rank", "pid", "correlation")}})
            gk[q.merge(gkeys.astype(np.int64), on=["rank", "pid", "correlation"])["i"].to_numpy()] = True
        # NOTE: one rank in the chunk (a rank's export): its rows whole, no sort, no masks
        one = bool(len(r_)) and bool((r_ == r_[0]).all())
        for rank in (r_[:1] if one else np.unique(r_)):
            mine = slice(None) if one else r_ == rank
            gs = s_[gk] if one else s_[mine & gk]
            if len(gs):
                on = steps.near(int(rank), int(gs[0]), int(gs[-1]))
                counts["graph_kernels"][on] += _count_in(gs, ws[on], we[on])
                top, n_top = int(gs[-1]), len(gs) - int(np.searchsorted(gs, gs[-1], side="left"))
                prev = gk_top.get(int(rank))
                gk_top[int(rank)] = (top, n_top + (prev[1] if prev is not None and prev[0] == top else 0))
            prev_iv = open_iv.get(int(rank))
            if prev_iv is None:
                us, ue = iv.union(s_[mine], e_[mine])
            else:
                us, ue = iv.union(np.r_[prev_iv[0], s_[mine]], np.r_[prev_iv[1], e_[mine]])
            # all but the last interval are whole: the next chunk starts at or after the last start
            if len(us) > 1:
                on = steps.near(int(rank), int(us[0]), int(ue[-2]))
                counts["busy_ns"][on] += iv.overlap((us[:-1], ue[:-1]), ws[on], we[on])
            open_iv[int(rank)] = (int(us[-1]), int(ue[-1]))
    rows_before = rows_at + np.cumsum(past)[:-1]
    for rank, (a_, b_) in open_iv.items():
        on = steps.near(rank, a_, b_)
        counts["busy_ns"][on] += iv.overlap((np.array([a_]), np.array([b_])), ws[on], we[on])
    scan.finish()
    return _Device(scan, None if lo is None or hi is None else (lo, hi), rows_before, gk_top)


def _count_in(times: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    return np.searchsorted(times, e, side="left") - np.searchsorted(times, s, side="left")
