"""The host-activity model: what each host thread was doing, layer by layer, innermost wins.

Built once per trace (``HostActivity(tl, rule)``) and read by attribution, steps and comm. Per
thread, in priority order (a layer only claims time no earlier layer claimed):

1. ``STAGE_*``   engine stage ranges (ours, SGLang's, vLLM's aliases; ``probes.stages``), innermost;
                 kernel-stage time inside a launch burst is ``STAGE_LAUNCH``
2. ``ENGINE_*``  Python frames of known engine functions (``probes.stages.ENGINE_FUNCTIONS``)
3. ``COLD_API``  allocation and set-up calls, and any launch/set-up call slower than ``SLOW_CALL_NS``
4. ``SYNC_COPY`` blocking copies (pageable staging), then ``SYNC_API`` synchronisation calls
5. ``IO``        OS runtime I/O calls; ranges, operators or frames named for I/O or data loading
6. ``COMPILE``   ranges, operators or frames named for compilation, autotuning, warm-up
7. ``LAUNCH``    bursts of kernel launches
8. ``MODEL_OP``  framework operators (Kineto ``cpu_op``, NVTX ``aten::*``) and module frames
9. ``API``       any other CUDA API call (a lone launch, an event record)
Time no layer claims is ``IDLE`` (the caller may still explain it, e.g. by another thread).
Each activity maps to one bubble class and one cause (``Activity.bubble_class`` / ``.cause``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_threads import (
    BurstRule,
    DomainRows,
    blocking_mask,
    cold_mask,
    innermost_segments,
    launch_bursts,
    rows_by_thread,
    stage_names,
    stage_threads,
)
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import isin, str_codes
from srtscope.analyzers.model.names import HostWork, host_work
from srtscope.analyzers.model.timeline import OP_DOMAIN, PYTHON_DOMAIN, ApiKind, Timeline
from srtscope.analyzers.model.vocab import BubbleClass, Cause
from srtscope.probes.stages import StageClass, engine_function, forward_engines, resolve_stage


class Activity(str, Enum):
    """One layer of the model; value = the name used in reports."""

    STAGE_SCHEDULER = "stage.scheduler"
    STAGE_PREP = "stage.prep"
    STAGE_KERNEL = "stage.kernel"
    STAGE_LAUNCH = "stage.launch"
    STAGE_SYNC = "stage.sync"
    ENGINE_SCHEDULER = "engine.scheduler"
    ENGINE_PREP = "engine.prep"
    ENGINE_KERNEL = "engine.kernel"
    COLD_API = "cold_api"
    SYNC_COPY = "sync_copy"
    SYNC_API = "sync_api"
    IO = "io"
    COMPILE = "compile"
    LAUNCH = "launch"
    MODEL_OP = "model_op"
    API = "api"

    @property
    def bubble_class(self) -> BubbleClass:
        return _BUBBLE_CLASS[self]

    @property
    def cause(self) -> Cause:
        """The cause, before the step context (eager fallback) and engine evidence refine it."""
        return _CAUSE[self]


_BUBBLE_CLASS = {
    Activity.STAGE_SCHEDULER: BubbleClass.SCHEDULER, Activity.STAGE_PREP: BubbleClass.PREP,
    Activity.STAGE_KERNEL: BubbleClass.KERNEL, Activity.STAGE_LAUNCH: BubbleClass.LAUNCH,
    Activity.STAGE_SYNC: BubbleClass.SYNC, Activity.ENGINE_SCHEDULER: BubbleClass.SCHEDULER,
    Activity.ENGINE_PREP: BubbleClass.PREP, Activity.ENGINE_KERNEL: BubbleClass.KERNEL,
    Activity.COLD_API: BubbleClass.HOST, Activity.SYNC_API: BubbleClass.SYNC,
    Activity.SYNC_COPY: BubbleClass.SYNC, Activity.IO: BubbleClass.HOST,
    Activity.COMPILE: BubbleClass.HOST, Activity.LAUNCH: BubbleClass.LAUNCH,
    Activity.MODEL_OP: BubbleClass.KERNEL, Activity.API: BubbleClass.LAUNCH,
}
_CAUSE = {
    Activity.STAGE_SCHEDULER: Cause.SCHED_CPU, Activity.STAGE_PREP: Cause.BATCH_PREP,
    Activity.STAGE_KERNEL: Cause.LAUNCH_BOUND, Activity.STAGE_LAUNCH: Cause.LAUNCH_BOUND,
    Activity.STAGE_SYNC: Cause.SCHED_CPU, Activity.ENGINE_SCHEDULER: Cause.SCHED_CPU,
    Activity.ENGINE_PREP: Cause.BATCH_PREP, Activity.ENGINE_KERNEL: Cause.LAUNCH_BOUND,
    Activity.COLD_API: Cause.COLD_START, Activity.SYNC_API: Cause.HOST_UNATTRIBUTED,
    Activity.SYNC_COPY: Cause.MEMCPY,
    Activity.IO: Cause.HOST_IO, Activity.COMPILE: Cause.COLD_START, Activity.LAUNCH: Cause.LAUNCH_BOUND,
    Activity.MODEL_OP: Cause.LAUNCH_BOUND, Activity.API: Cause.LAUNCH_BOUND,
}
_STAGE_ACTIVITY = {StageClass.SCHEDULER.value: Activity.STAGE_SCHEDULER, StageClass.PREP.value: Activity.STAGE_PREP,
                   StageClass.KERNEL.value: Activity.STAGE_KERNEL, StageClass.SYNC.value: Activity.STAGE_SYNC}
_ENGINE_ACTIVITY = {StageClass.SCHEDULER: Activity.ENGINE_SCHEDULER, StageClass.PREP: Activity.ENGINE_PREP,
                    StageClass.KERNEL: Activity.ENGINE_KERNEL}

Key = tuple[int, int, int]   # (rank, pid, tid)


@dataclass(frozen=True)
class ThreadLayers:
    """One thread's activity: disjoint interval sets per activity (priority already applied), the
    stage segments for per-stage figures, and what the thread had open at all."""

    sets: dict[Activity, iv.IntervalSet]
    stage_segments: tuple[np.ndarray, np.ndarray, np.ndarray]   # (starts, ends, stage-name codes)
    ranges: iv.IntervalSet          # any annotation open (NVTX coverage)
    busy: iv.IntervalSet            # ranges, frames, operators or API calls: the thread was not idle
    claimed: iv.IntervalSet         # union of ``sets``


class HostActivity:
    """The host-activity model of one trace; per-thread layers are built on first use and kept."""

    def __init__(self, tl: Timeline, rule: BurstRule | None = None, forward: set[str] | None = None) -> None:
        """``forward``: the engines with forward ranges in the whole trace, where ``tl`` is a window."""
        self.tl = tl
        self.rule = rule or BurstRule()
        rg, api = tl.host_ranges, tl.api
        self.forward = forward if forward is not None else \
            forward_engines([str(n) for n in str_codes(rg["name"])[1]] if len(rg) else [])
        self.stage_names, self.stage_codes, self.stage_classes = stage_names(rg, self.forward)
        self._rg_work = _work_of(rg)
        self._is_launch = isin(api["kind"], [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH]) if len(api) \
            else np.zeros(0, bool)
        self._blocking = blocking_mask(api)
        self._sync_copy = self._blocking & isin(api["kind"], [ApiKind.MEMCPY]) if len(api) else self._blocking
        self._cold = cold_mask(api)
        self._os = isin(api["kind"], [ApiKind.OS_IO, ApiKind.OS_WAIT, ApiKind.OS_OTHER]) if len(api) \
            else np.zeros(0, bool)
        self._os_io = isin(api["kind"], [ApiKind.OS_IO]) if len(api) else np.zeros(0, bool)
        self._cache: dict[Key, ThreadLayers] = {}
        self._bursts: dict[Key, iv.IntervalSet] = {}
        self._rows: dict[str, dict[Key, np.ndarray]] = {}
        self._spans: dict[tuple[str, Key], tuple[np.ndarray, np.ndarray] | None] = {}
        # NOTE: a model of one window of a trace is told what only the whole trace shows
        self.whole_evidence: bool | None = None
        self.whole_helpers: dict[Key, Key] | None = None

    # NOTE: the operators and frames (and what their names say) when first asked: a model of a whole
    # trace read in windows asks only whether engine frames are there
    @cached_property
    def ops(self) -> DomainRows:
        return DomainRows.of(self.tl.ranges, OP_DOMAIN)

    @cached_property
    def frames(self) -> DomainRows:
        return DomainRows.of(self.tl.ranges, PYTHON_DOMAIN)

    @cached_property
    def _op_work(self) -> np.ndarray:
        return _work_of(self.tl.ranges if len(self.ops) else self.tl.ranges.iloc[:0])

    @cached_property
    def _frame_work(self) -> tuple[np.ndarray, np.ndarray]:
        return _frame_work(self.tl.ranges if len(self.frames) else self.tl.ranges.iloc[:0])

    @property
    def cold_calls(self) -> np.ndarray:
        """Mask of the API rows that are start-up cost (``cold_mask``), computed once."""
        return self._cold

    @property
    def has_engine_evidence(self) -> bool:
        """Stage ranges or engine frames anywhere in the trace: scheduler/prep can be named."""
        if self.whole_evidence is not None:
            return self.whole_evidence
        if (self.stage_codes >= 0).any():
            return True
        eng = self._frame_work[1] >= 0            # per range row: only a frame's counts
        return bool(eng.any()) and bool((eng & isin(self.tl.ranges["domain"], [PYTHON_DOMAIN])).any())

    def helper_threads(self, keys: list[Key]) -> dict[Key, Key]:
        """``stage_threads`` of ``keys`` over the trace's ranges (or the whole trace's, when given)."""
        if self.whole_helpers is not None:
            return {k: self.whole_helpers[k] for k in keys if k in self.whole_helpers}
        return stage_threads(self.tl.host_ranges, self.stage_codes, keys)

    @cached_property
    def program_functions(self) -> tuple[np.ndarray, np.ndarray]:
        """Per Python frame row (a position in the trace's ranges, ``DomainRows``), the code of the
        program's function it is (``python_functions``), and the names: once per model, whatever asks."""
        return python_functions(self.tl.ranges if len(self.frames) else self.tl.ranges.iloc[:0])

    @property
    def has_python_frames(self) -> bool:
        return len(self.frames) > 0

    def prefetch(self, keys: list[Key]) -> None:
        """Group the rows of all tables for these threads at once (few masks, not per-thread scans)."""
        tl = self.tl
        for name, df in (("rg", tl.host_ranges), ("api", tl.api), ("ops", self.ops), ("frames", self.frames)):
            have = self._rows.setdefault(name, {})
            todo = [k for k in keys if k not in have]
            if todo:
                got = df.by_thread(todo) if isinstance(df, DomainRows) else rows_by_thread(df, todo)
                for k in todo:
                    have[k] = got.get(k, np.zeros(0, np.int64))

    def _thread_rows(self, name: str, key: Key) -> np.ndarray:
        if key not in self._rows.get(name, {}):
            self.prefetch([key])
        return self._rows[name][key]

    def layers(self, key: Key, focus: iv.IntervalSet | None = None) -> ThreadLayers:
        """The thread's layers; with ``focus`` (a normal-form set), exact inside it only: rows that
        do not overlap it are left out (millions of launches around a few bubbles), except the
        launches, whose bursts depend on their neighbours."""
        if focus is not None:
            return self._build(key, focus)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._build(key)
        return got

    def bursts(self, key: Key) -> iv.IntervalSet:
        """The thread's launch bursts (``launch_bursts``), computed once."""
        burst = self._bursts.get(key)
        if burst is None:
            ai = self._thread_rows("api", key)
            a_s, a_e = self.tl.api["start_ns"].to_numpy(), self.tl.api["end_ns"].to_numpy()
            # NOTE: a thread holding the whole table (ascending distinct rows) selects by the mask
            launches = self._is_launch if len(ai) == len(a_s) else ai[self._is_launch[ai]]
            burst = self._bursts[key] = launch_bursts(a_s[launches], a_e[launches], self.rule)
        return burst

    def _build(self, key: Key, focus: iv.IntervalSet | None = None) -> ThreadLayers:
        tl = self.tl
        rg, api = tl.host_ranges, tl.api
        ri, ai = self._thread_rows("rg", key), self._thread_rows("api", key)
        oi, fi = self._thread_rows("ops", key), self._thread_rows("frames", key)
        r_s, r_e = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
        a_s, a_e = api["start_ns"].to_numpy(), api["end_ns"].to_numpy()
        burst = self.bursts(key)
        if focus is not None:
            # NOTE: every layer but the bursts is a union of rows (or innermost segments, decided by
            # the rows covering each instant): inside ``focus`` only overlapping rows matter
            ri, ai = self._touching("rg", key, ri, r_s, r_e, focus), self._touching("api", key, ai, a_s, a_e, focus)
            oi = self._touching("ops", key, oi, self.ops["start_ns"].to_numpy(), self.ops["end_ns"].to_numpy(), focus)
            fi = self._touching("frames", key, fi, self.frames["start_ns"].to_numpy(),
                                self.frames["end_ns"].to_numpy(), focus)
            burst = iv.intersect(burst, focus)
        codes = self.stage_codes
        sel = ri[codes[ri] >= 0] if len(ri) else ri
        seg = innermost_segments(r_s[sel], r_e[sel], codes[sel])
        ls, le, ll = seg
        cand: list[tuple[Activity, iv.IntervalSet]] = []
        # 1. stages (disjoint innermost segments); kernel-stage time inside a launch burst -> launch
        by_act: dict[Activity, list[np.ndarray]] = {}
        for code in np.unique(ll):
            act = _STAGE_ACTIVITY.get(str(self.stage_classes[code]))
            if act is not None:
                by_act.setdefault(act, []).append(ll == code)
        for act, masks in by_act.items():
            m = np.logical_or.reduce(masks)
            s = iv.union(ls[m], le[m])
            if act is Activity.STAGE_KERNEL:
                cand.append((Activity.STAGE_LAUNCH, iv.intersect(s, burst)))
            cand.append((act, s))
        # 2. engine functions in Python frames (innermost engine frame)
        f_s, f_e = self.frames["start_ns"].to_numpy(), self.frames["end_ns"].to_numpy()
        fcode = self._frame_work[1]
        eng = fi[fcode[fi] >= 0] if len(fi) else fi
        if len(eng):
            es, ee, el = innermost_segments(f_s[eng], f_e[eng], fcode[eng])
            for c in np.unique(el):
                act = _ENGINE_ACTIVITY.get(_STAGE_CLASS_LIST[int(c)])
                if act is not None:
                    cand.append((act, iv.union(es[el == c], ee[el == c])))
        # 3-4. cold start calls, then blocking calls
        cand.append((Activity.COLD_API, _calls(a_s, a_e, ai, self._cold)))
        cand.append((Activity.SYNC_COPY, _calls(a_s, a_e, ai, self._sync_copy)))
        cand.append((Activity.SYNC_API, _calls(a_s, a_e, ai, self._blocking)))
        # 5-6. I/O and compilation, by OS call or by name (annotations, operators, frames)
        o_s, o_e = self.ops["start_ns"].to_numpy(), self.ops["end_ns"].to_numpy()
        named = ((r_s, r_e, ri, self._rg_work), (o_s, o_e, oi, self._op_work),
                 (f_s, f_e, fi, self._frame_work[0]))
        io_parts = [_calls(a_s, a_e, ai, self._os_io)] + [_named(s, e, i, w, HostWork.IO) for s, e, i, w in named]
        cand.append((Activity.IO, _union_all(io_parts)))
        cand.append((Activity.COMPILE, _union_all([_named(s, e, i, w, HostWork.COMPILE) for s, e, i, w in named])))
        # 7. launch bursts; 8. operators and module frames; 9. any other CUDA call
        cand.append((Activity.LAUNCH, burst))
        cand.append((Activity.MODEL_OP, _union_all([_named(s, e, i, w, HostWork.MODEL_OP) for s, e, i, w in named])))
        cuda = ai[~self._os[ai]] if len(ai) else ai
        cand.append((Activity.API, iv.union(a_s[cuda], a_e[cuda])))
        sets: dict[Activity, iv.IntervalSet] = {}
        claimed = iv.empty()
        for act, s in cand:
            part = iv.subtract(s, claimed)
            if len(part[0]):
                sets[act] = iv.union(*_cat([sets.get(act, iv.empty()), part]))
                claimed = iv.union(*_cat([claimed, part]))
        ranges = iv.union(r_s[ri], r_e[ri]) if len(ri) else iv.empty()
        busy = _union_all([ranges, iv.union(o_s[oi], o_e[oi]) if len(oi) else iv.empty(),
                           iv.union(f_s[fi], f_e[fi]) if len(fi) else iv.empty(),
                           iv.union(a_s[ai], a_e[ai]) if len(ai) else iv.empty(), burst])
        return ThreadLayers(sets, seg, ranges, busy, claimed)

    def _touching(self, name: str, key: Key, rows: np.ndarray, s: np.ndarray, e: np.ndarray,
                  focus: iv.IntervalSet) -> np.ndarray:
        """The thread's rows (of table ``name``) whose [s, e) overlaps ``focus``.

        NOTE: the thread's rows are start-sorted (tables are): their starts and running max end,
        kept per thread, narrow the rows to test to those near ``focus`` (``intervals.may_touch``)
        instead of testing millions of calls for a few bubbles. Unsorted rows are all tested.
        """
        if len(rows) == 0 or len(focus[0]) == 0:
            return rows[:0]
        if (name, key) not in self._spans:
            whole = len(rows) == len(s)              # ascending distinct rows: all of the table
            rs, re_ = (s, e) if whole else (s[rows], e[rows])
            self._spans[(name, key)] = (rs, iv.running_max(re_)) if iv.is_sorted(rs) else None
        spans = self._spans[(name, key)]
        if spans is not None:
            rows = rows[iv.may_touch(spans[0], spans[1], focus)]
        return _touching(rows, s, e, focus)


def _touching(rows: np.ndarray, s: np.ndarray, e: np.ndarray, focus: iv.IntervalSet) -> np.ndarray:
    """The rows whose [s, e) overlaps ``focus``."""
    fs, fe = focus
    if len(rows) == 0 or len(fs) == 0:
        return rows[:0]
    i = np.searchsorted(fe, s[rows], side="right")       # the first focus interval ending after s
    ok = i < len(fs)
    ok[ok] = fs[i[ok]] < e[rows][ok]
    return rows[ok]


def _calls(s: np.ndarray, e: np.ndarray, rows: np.ndarray, mask: np.ndarray) -> iv.IntervalSet:
    if len(rows) == 0:
        return iv.empty()
    r = rows[mask[rows]]
    return iv.union(s[r], e[r]) if len(r) else iv.empty()


def _named(s: np.ndarray, e: np.ndarray, rows: np.ndarray, work: np.ndarray, want: HostWork) -> iv.IntervalSet:
    if len(rows) == 0:
        return iv.empty()
    r = rows[work_is(work, rows, want)]
    return iv.union(s[r], e[r]) if len(r) else iv.empty()


def _cat(sets: list[iv.IntervalSet]) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([x[0] for x in sets]) if sets else np.zeros(0, np.int64),
            np.concatenate([x[1] for x in sets]) if sets else np.zeros(0, np.int64))


def _union_all(sets: list[iv.IntervalSet]) -> iv.IntervalSet:
    return iv.union(*_cat([x for x in sets if len(x[0])])) if any(len(x[0]) for x in sets) else iv.empty()


#: a ``HostWork``'s code in the per-row work arrays (``_work_of``, ``_frame_work``); -1: a stage's row
WORK_CODES = {w: np.int8(i) for i, w in enumerate(HostWork)}


def work_is(work: np.ndarray, rows: np.ndarray, want: HostWork) -> np.ndarray:
    """Which of ``rows`` a per-row work array (``_work_of``, ``_frame_work``) says are ``want``."""
    return work[rows] == WORK_CODES[want]


def _work_of(ranges: pd.DataFrame) -> np.ndarray:
    """``HostWork`` code (``WORK_CODES``) per range row (classified once per distinct name); stage
    ranges are -1. int8: one byte a row of millions of operators."""
    if len(ranges) == 0:
        return np.zeros(0, np.int8)
    codes, names = str_codes(ranges["name"])
    lut = np.array([(-1 if resolve_stage(str(n)) is not None else WORK_CODES[host_work(str(n))]) for n in names]
                   + [-1], dtype=np.int8)
    return lut[codes]


_STAGE_CLASS_LIST = list(StageClass)
_MODULE_FRAME = ("nn.Module:", "torch/nn/modules/", "torch/nn/functional", "torch/_ops.py")


def _frame_work(frames: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per Python frame row: (HostWork code, ``WORK_CODES``, -1 for an engine function; engine
    stage-class code or -1), int8. The stage-class code indexes ``StageClass`` values: a frame of a
    known engine function carries that stage's class."""
    if len(frames) == 0:
        return np.zeros(0, np.int8), np.zeros(0, np.int8)
    codes, names = str_codes(frames["name"])
    classes = _STAGE_CLASS_LIST
    work: list[int] = []
    eng: list[int] = []
    for n in map(str, names):
        st = engine_function(n)
        eng.append(classes.index(st.cls) if st is not None else -1)
        func = n.rpartition("): ")[2] or n
        w = host_work(func)
        if w is HostWork.NONE and (n.startswith(_MODULE_FRAME[0]) or any(m in n for m in _MODULE_FRAME[1:])):
            w = HostWork.MODEL_OP
        work.append(-1 if st is not None else WORK_CODES[w])
    w_lut = np.array(work + [-1], dtype=np.int8)
    e_lut = np.array(eng + [-1], dtype=np.int8)
    return w_lut[codes], e_lut[codes]


#: frames that name no function of the program: the interpreter's calls into C, the profiler's own
_NOT_PROGRAM = ("<built-in", "<method", "torch/profiler/", "torch/autograd/profiler")


def python_functions(frames: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per Python frame row, the code of its function's name (-1: a built-in or the profiler's own),
    and the names: ``"path/file.py(123): normalize"`` -> ``normalize``."""
    if len(frames) == 0:
        return np.zeros(0, np.int64), np.zeros(0, object)
    codes, names = str_codes(frames["name"])
    funcs = [("" if any(m in str(n) for m in _NOT_PROGRAM) else str(n).rpartition("): ")[2].strip())
             for n in names]
    uniq, inv = np.unique(np.array(funcs + [""], dtype=object), return_inverse=True)
    lut = inv.reshape(-1).astype(np.int32)
    empty = int(np.flatnonzero(uniq == "")[0])
    lut = np.where(lut == empty, np.int32(-1), lut)
    return lut[codes], uniq
