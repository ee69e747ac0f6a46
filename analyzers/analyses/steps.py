"""Steps: segment the run into engine steps and describe each one.

Sources, first that applies per trace (``vocab.StepSource``), the program's own rhythm before any
guess: ``loop.step`` ranges (attrs step/mode/bs/tokens); engines' step openers (SGLang: each loop
turn that runs a forward, from its ``recv_requests``; vLLM's ``llm_engine step``; else the
scheduler's ranges); an engine's once-a-step function in Python frames
(``stages.ENGINE_STEP_FRAMES``: vLLM's ``EngineCore.step``, a worker's ``execute_model``, SGLang's
``run_batch``); torch.profiler's ``ProfilerStep#N``; vLLM's ``execute_*_context_*`` /
``execute_*_generation_*`` ranges; one recurring per-iteration marker
(``enumerate(DataLoader)#...__next__``, ``Optimizer.step#*.step``: each to the next); without any
marker, the launching thread's host synchronisation points, else its launch bursts separated by
idle gaps.

Per step: wall time, device busy (union over the rank's devices), launches, graph launches, kernels
inside graphs, and ``exec``: graph (any graph launch / graph kernel / ``run.graph_replay``), eager
(launches or ``run.eager``), idle. ``reason`` is the ``run.eager`` range's ``reason`` attribute.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.api_steps import Key, ThreadSteps, api_step_table, thread_steps
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.host_threads import blocking_mask as _blocking_mask
from srtscope.analyzers.analyses.host_threads import default_threads as _default_threads
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import isin, str_codes
from srtscope.analyzers.model.timeline import OP_DOMAIN, PYTHON_DOMAIN, ApiKind, Timeline
from srtscope.analyzers.model.vocab import StepExec, StepSource
from srtscope.probes.stages import (
    ENGINE_STEP_FRAMES,
    NameRole,
    Stage,
    StepMode,
    engine_name,
    name_role,
    resolve_stage,
    step_frame,
)

STEP_COLUMNS = ("step", "rank", "pid", "tid", "start_ns", "end_ns", "wall_ns", "mode", "bs", "padded_bs",
                "tokens", "exec", "reason", "busy_ns", "launches", "graph_launches", "graph_kernels")


@dataclass(frozen=True)
class StepRule:
    """Fallback segmentation without NVTX: a gap > ``gap_ns`` between launches ends a step."""

    gap_ns: int = 200_000

    def __post_init__(self) -> None:
        if self.gap_ns <= 0:
            raise ValueError(f"step gap must be > 0 ns, got {self.gap_ns}")


def _resolved(ranges: pd.DataFrame) -> np.ndarray:
    """The stage value ('' when none) of every range row, resolved once per distinct name.

    NOTE: plain strings, not Stage members: numpy compares str-Enums by ``str()``, not by value.
    """
    if len(ranges) == 0:
        return np.zeros(0, object)
    codes, cats = str_codes(ranges["name"])
    lut = np.array([(s.value if (s := resolve_stage(n)) is not None else "") for n in cats]
                   + [""], dtype=object)
    return lut[codes]


def _attr_int(attrs: np.ndarray, key: str) -> np.ndarray:
    out = np.full(len(attrs), -1, np.int64)
    for i, a in enumerate(attrs):  # one per step, not per event
        if isinstance(a, dict) and key in a:
            try:
                out[i] = int(float(a[key]))
            except (TypeError, ValueError):
                pass
    return out


def _attr_str(attrs: np.ndarray, key: str) -> np.ndarray:
    return np.array([str(a[key]) if isinstance(a, dict) and key in a else "" for a in attrs], dtype=object)


def _windows(tl: Timeline, stages: np.ndarray, rule: StepRule) -> tuple[str, pd.DataFrame]:
    """(source, DataFrame of rank, pid, tid, start_ns, end_ns, step, mode, bs, tokens)."""
    rg = tl.host_ranges
    loop = stages == Stage.LOOP_STEP.value
    if loop.any():
        r = rg[loop]
        attrs = r["attrs"].to_numpy()
        df = pd.DataFrame({"rank": r["rank"].to_numpy(), "pid": r["pid"].to_numpy(), "tid": r["tid"].to_numpy(),
                           "start_ns": r["start_ns"].to_numpy(), "end_ns": r["end_ns"].to_numpy(),
                           "step": _attr_int(attrs, "step"), "mode": _attr_str(attrs, "mode"),
                           "bs": _attr_int(attrs, "bs"), "tokens": _attr_int(attrs, "tokens")})
        return "loop.step", df
    opened = _opened_steps(tl, stages)
    if opened is not None:
        return opened
    framed = _frame_steps(tl)
    if len(framed):
        return StepSource.ENGINE_FRAMES.value, framed
    for marker, rx in ((StepSource.PROFILER_STEP, _PROFILER_STEP), (StepSource.VLLM, _VLLM_STEP),
                       *((StepSource.ITERATION, x) for x in _ITERATION)):
        marked = _marker_steps(tl, rx, to_next=marker is not StepSource.PROFILER_STEP,
                               least=2 if marker is StepSource.ITERATION else 1)
        if len(marked):
            return marker.value, marked
    api = tl.api
    if len(api) == 0:
        return "none", _blank_attrs(pd.DataFrame(columns=["rank", "pid", "tid", "start_ns", "end_ns"]))
    threads = _default_threads(tl)
    blocking = _blocking_mask(api)
    launch = isin(api["kind"], [ApiKind.LAUNCH, ApiKind.GRAPH_LAUNCH])
    a_s, a_e = api["start_ns"].to_numpy(np.int64), api["end_ns"].to_numpy(np.int64)
    trackers, device_end = {}, {}
    for rank, (pid, tid) in threads.items():
        on = (api["rank"].to_numpy() == rank) & (api["pid"].to_numpy() == pid) & (api["tid"].to_numpy() == tid)
        mine = np.flatnonzero(on & (launch | blocking))
        trackers[(rank, pid, tid)] = thread_steps(a_s[mine], a_e[mine], launch[mine], blocking[mine], rule.gap_ns)
        dev_end = tl.device.loc[tl.device["rank"] == rank, "end_ns"]
        if len(dev_end):
            device_end[rank] = int(dev_end.max())
    return api_step_windows(trackers, threads, device_end)


def api_step_windows(trackers: Mapping[Key, ThreadSteps], threads: Mapping[int, tuple[int, int]],
                     device_end: Mapping[int, int]) -> tuple[str, pd.DataFrame]:
    """``step_windows`` of a trace whose steps come from its API rows (``api_steps``), from each
    thread's ``ThreadSteps`` (fed all its calls and closed), ``threads`` (``default_threads``) and
    per rank its last device end, ns."""
    source, w = api_step_table(trackers, threads, device_end)
    return source, _blank_attrs(w if w is not None else pd.DataFrame(columns=["rank", "pid", "tid", "start_ns",
                                                                              "end_ns"]))


def _opened_steps(tl: Timeline, stages: np.ndarray) -> tuple[str, pd.DataFrame] | None:
    """Steps from an engine's own ranges: a step runs from one opener to the next, so the scheduler's
    time lies inside a step. Openers are the ranges whose role is STEP (vLLM's in-process
    ``llm_engine step: get_output``, SGLang's ``scheduler.recv_requests``), else the scheduler's
    ``sched.schedule`` ranges (SGLang's ``get_next_batch_to_run``, vLLM's ``schedule: *``). Top-level
    occurrences only (nested ones merge), and an opener with no forward since the last one is not a
    new step: ranges repeated within a step (``schedule: allocate_slots`` once per request) never
    become step markers. None when the trace has no opener."""
    rg = tl.host_ranges
    if len(stages) == 0:
        return None
    codes, names = str_codes(rg["name"])
    roles = [name_role(str(n)) for n in names]
    engines = [(e.engine if (e := engine_name(str(n))) is not None else "") for n in names]
    nonzero = rg["end_ns"].to_numpy() > rg["start_ns"].to_numpy()   # a zero-length range marks no step
    step_lut = np.array([r is NameRole.STEP and s is not Stage.LOOP_STEP for r, s in
                         zip(roles, (resolve_stage(str(n)) for n in names))] + [False], dtype=bool)
    opener = step_lut[codes] & nonzero
    if not opener.any():
        opener = (stages == Stage.SCHED_SCHEDULE.value) & nonzero
    if not opener.any():
        return None
    # SGLang's loop turns open its steps: its recv_requests, or under --instrument sglang (no
    # loop.step) our sched.schedule around its get_next_batch_to_run, once a turn
    turns = {engines[c] for c in np.unique(codes[opener]) if c >= 0} <= {"sglang", ""}
    fwd_lut = np.array([r in (NameRole.FORWARD, NameRole.EXECUTE) for r in roles] + [False], dtype=bool)
    forward = fwd_lut[codes]
    known = stages != ""
    r_s, r_e = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
    r_rank, r_tid = rg["rank"].to_numpy(), rg["tid"].to_numpy()
    parts = []
    for (rank, pid, tid), idx in rg[opener].groupby(["rank", "pid", "tid"]).indices.items():
        rows = np.flatnonzero(opener)[idx]
        starts, u_end = iv.union(r_s[rows], r_e[rows])
        fwd = np.sort(r_s[forward & (r_rank == rank)])
        if len(fwd) == 0 and len(tl.device):
            fwd = np.sort(tl.device.loc[tl.device["rank"] == rank, "start_ns"].to_numpy())
        same = known & (r_rank == rank) & (r_tid == tid)
        last_end = max(int(r_e[same].max()), int(u_end[-1]))
        ends = None
        if len(fwd):
            seen = np.searchsorted(fwd, starts, side="left")
            tail = np.r_[seen[1:] != seen[:-1], True]          # the last opener before a forward
            if turns:
                # SGLang's loop turns: a step is the turn that runs a forward, to the next turn's
                # start; idle turns (scheduler.idle: before the first forward, between runs, after
                # the last) are no steps
                at = np.flatnonzero(tail & (seen < len(fwd)))
                ends = np.r_[starts, last_end][at + 1]
                starts = starts[at]
            else:
                # an opener with no forward since the last one is not a new step (the turns before
                # the first forward give way to the last of them, those after the last end the run)
                keep = np.r_[True, seen[1:] != seen[:-1]] & (seen > 0) | tail & (seen == 0)
                starts = starts[keep]
                if len(starts) > 1 and starts[-1] > fwd[-1]:
                    last_end, starts = int(starts[-1]), starts[:-1]
        if ends is None:
            ends = np.r_[starts[1:], last_end]
        parts.append(pd.DataFrame({"rank": rank, "pid": pid, "tid": tid, "start_ns": starts, "end_ns": ends}))
    df = pd.concat(parts, ignore_index=True)
    # keep, per rank, the thread with the most steps
    best = df.groupby(["rank", "pid", "tid"]).size().reset_index(name="n").sort_values("n").drop_duplicates(
        "rank", keep="last")
    df = df.merge(best[["rank", "pid", "tid"]], on=["rank", "pid", "tid"])
    used = {engines[c] for c in np.unique(codes[opener]) if c >= 0}
    source = StepSource.VLLM if used == {"vllm"} else StepSource.SGLANG
    return source.value, _blank_attrs(df)


#: vLLM's per-step annotation: context (prefill) and generation (decode) requests and tokens, plain
#: (``execute_context_1(96)_generation_3(3)``) or detailed (``execute_8192_context_9(sq8155sk...)_
#: generation_37(sq37sk...)``, ``detailed_trace_annotation``)
_VLLM_ITERATION = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)")


#: SGLang's forward span (0.5.23, ``ModelRunner.forward``): ``step[DECODE bs=8]``, ``step[EXTEND bs=8
#: toks=192]``; the label splits as name ``step[DECODE`` and attrs ``bs=8]`` (``readers.labels``)
_SGLANG_STEP = re.compile(r"^step\[([A-Z_0-9]+)")


def _iteration(name: str, attrs: object) -> tuple[str, int, int] | None:
    """(mode, requests, tokens; -1 unknown) a step's forward range says, or None: vLLM's
    ``execute_context_N(T)_generation_M(U)`` (N prefill and M decode requests: extend when M = 0,
    decode when N = 0, else mixed), SGLang's ``step[MODE bs=N toks=T]`` (its ForwardMode; draft and
    verify steps carry no mode of ours)."""
    m = _VLLM_ITERATION.match(name)
    if m is not None:
        ctx, ctx_tok, gen, gen_tok = (int(x) for x in m.groups())
        mode = (StepMode.MIXED if ctx and gen else StepMode.EXTEND if ctx else
                StepMode.DECODE if gen else StepMode.IDLE).value
        return mode, ctx + gen, ctx_tok + gen_tok
    g = _SGLANG_STEP.match(name)
    if g is None:
        return None
    a = attrs if isinstance(attrs, dict) else {}
    nums = {k: int(v.rstrip("]")) if v.rstrip("]").isdigit() else -1 for k, v in a.items() if isinstance(v, str)}
    mode = g.group(1).lower()
    bs = nums.get("bs", -1)
    tokens = nums.get("toks", bs if mode == StepMode.DECODE.value else -1)
    return (mode if mode in {m.value for m in StepMode} else ""), bs, tokens


def _engine_step_attrs(tl: Timeline, w: pd.DataFrame) -> None:
    """Fill blank ``mode`` / ``bs`` / ``tokens`` of steps from the engine's forward ranges inside
    them (``_iteration``) — so a prefill, eager by design, is never taken for an eager decode."""
    rg = tl.host_ranges
    if len(rg) == 0 or len(w) == 0:
        return
    codes, names = str_codes(rg["name"])
    known = [bool(_VLLM_ITERATION.match(str(n)) or _SGLANG_STEP.match(str(n))) for n in names]
    if not any(known):
        return
    hit = np.array(known + [False], dtype=bool)[codes]
    rows = np.flatnonzero(hit)
    attrs = rg["attrs"].to_numpy()
    mode, bs, tokens = w["mode"].to_numpy().copy(), w["bs"].to_numpy().copy(), w["tokens"].to_numpy().copy()
    for rank, idx in w.groupby("rank").indices.items():
        s, e = w["start_ns"].to_numpy()[idx], w["end_ns"].to_numpy()[idx]
        rr = rows[rg["rank"].to_numpy()[rows] == rank]
        rs = rg["start_ns"].to_numpy()[rr]
        pos = np.searchsorted(s, rs, side="right") - 1
        for k, (j, p) in enumerate(zip(rr, pos)):          # one per step
            if p < 0 or rs[k] >= e[p]:
                continue
            t = idx[p]
            got = _iteration(str(names[codes[j]]), attrs[j])
            assert got is not None
            if not mode[t]:
                mode[t] = got[0]
            if bs[t] < 0:
                bs[t] = got[1]
            if tokens[t] < 0:
                tokens[t] = got[2]
    w["mode"], w["bs"], w["tokens"] = mode, bs, tokens


_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_MODES = frozenset(m.value for m in StepMode)
_VLLM_STEP = re.compile(r"^execute_.*(_context_|_generation_)")
#: one marker a training or inference loop records once per iteration, the iteration's start first:
#: the DataLoader's next batch, then the optimizer's step (``torch.optim``'s record_function names)
_ITERATION = (re.compile(r"^enumerate\(DataLoader\)#.*__next__$"), re.compile(r"^Optimizer\.step#.*\.step$"))


def _frame_steps(tl: Timeline) -> pd.DataFrame:
    """Steps from an engine's once-a-step function in Python frames (``stages.ENGINE_STEP_FRAMES``,
    the most telling kind present): each top-level call opens a step that runs to the next call,
    per rank on the thread with the most of them; at least two calls. Empty when none."""
    py = tl.domain_ranges(PYTHON_DOMAIN, lambda n: step_frame(n) is not None)    # the few step frames
    if len(py) == 0:
        return pd.DataFrame()
    codes, names = str_codes(py["name"])
    tiers = sorted({f.stage.value: 0 for f in ENGINE_STEP_FRAMES}, key=[f.stage.value for f in
                                                                       ENGINE_STEP_FRAMES].index)
    tier = np.array([tiers.index(f.stage.value) if (f := step_frame(str(n))) is not None else -1 for n in names]
                    + [-1], dtype=np.int64)[codes]
    for k in range(len(tiers)):
        hit = tier == k
        if int(hit.sum()) < 2:
            continue
        r = py[hit]
        parts = []
        for (rank, pid, tid), idx in r.groupby(["rank", "pid", "tid"]).indices.items():
            s, e = iv.union(r["start_ns"].to_numpy()[idx], r["end_ns"].to_numpy()[idx])   # nested calls merge
            parts.append(pd.DataFrame({"rank": rank, "pid": pid, "tid": tid, "start_ns": s, "end_ns": e}))
        got = _to_steps(pd.concat(parts, ignore_index=True), to_next=True, least=2)
        if len(got):
            return got
    return pd.DataFrame()


def _marker_steps(tl: Timeline, rx: re.Pattern, to_next: bool = False, least: int = 1) -> pd.DataFrame:
    """Steps from marker ranges (annotations or operators) whose name matches ``rx``: per rank, the
    thread with the most of them (``least`` at least); one step per range, numbered by the name's
    number when it has one. ``to_next``: a step runs on to the next marker's start (vLLM's
    ``execute_*`` ranges cover the model's part of a step only: the scheduler's time between them
    belongs to a step too)."""
    parts = []
    for rg in (tl.host_ranges, tl.domain_ranges(OP_DOMAIN)):
        if len(rg) == 0:
            continue
        codes, names = str_codes(rg["name"])
        hit = np.array([bool(rx.search(str(n))) for n in names] + [False], dtype=bool)[codes]
        if hit.any():
            parts.append(rg[hit])
    if not parts:
        return pd.DataFrame()
    r = pd.concat(parts, ignore_index=True).drop_duplicates(["rank", "start_ns", "end_ns"])
    r = r[r["end_ns"] > r["start_ns"]]
    if len(r) == 0:
        return pd.DataFrame()
    return _to_steps(r, to_next, least, rx)


def _to_steps(r: pd.DataFrame, to_next: bool, least: int, rx: re.Pattern | None = None) -> pd.DataFrame:
    """One step per row of ``r`` (rank, pid, tid, start_ns, end_ns; ``name`` when ``rx`` numbers them)
    on each rank's thread with the most rows, when it has ``least`` rows or more (module doc)."""
    best = r.groupby(["rank", "pid", "tid"]).size().reset_index(name="n").sort_values("n").drop_duplicates(
        "rank", keep="last")
    best = best[best["n"] >= least]
    if len(best) == 0:
        return pd.DataFrame()
    r = r.merge(best[["rank", "pid", "tid"]], on=["rank", "pid", "tid"])
    df = _blank_attrs(r[["rank", "pid", "tid", "start_ns", "end_ns"]].reset_index(drop=True))
    if to_next:
        df = df.sort_values(["rank", "start_ns"], ignore_index=True)
        nxt = df.groupby("rank")["start_ns"].shift(-1)
        df["end_ns"] = np.where(nxt.notna(), nxt.fillna(0).astype(np.int64), df["end_ns"].to_numpy())
        r = r.sort_values(["rank", "start_ns"], ignore_index=True)
    if rx is not None:
        num = [rx.match(str(n)) for n in r["name"].to_numpy()]
        df["step"] = [int(m.group(1)) if m and m.groups() and m.group(1).isdigit() else -1 for m in num]
    return df


def _blank_attrs(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["step"] = -1
    df["mode"] = ""
    df["bs"] = -1
    df["tokens"] = -1
    return df


#: per step, what the device and API rows say (``step_counts``): busy time, graph kernels, launches
COUNT_COLUMNS = ("busy_ns", "graph_kernels", "launches", "graph_launches")


def step_windows(tl: Timeline, rule: StepRule = StepRule()) -> tuple[str, pd.DataFrame]:
    """(source, the steps' rank, pid, tid, start_ns, end_ns, step, mode, bs, tokens), sorted by rank
    then start, before ``find_steps`` counts and classifies them."""
    source, w = _windows(tl, _resolved(tl.host_ranges), rule)
    return source, w.sort_values(["rank", "start_ns"], ignore_index=True)


def steps_from_ranges(tl: Timeline, source: str) -> bool:
    """Whether ``step_windows`` of ``source`` reads the ranges alone (not the device or API rows):
    ``loop.step``, ``ProfilerStep#N`` and vLLM's execute markers always; engines' step openers
    where forward ranges say which openers begin a step (else the device rows do)."""
    if source in ("loop.step", StepSource.PROFILER_STEP.value, StepSource.ENGINE_FRAMES.value,
                  StepSource.ITERATION.value):
        return True
    if source not in (StepSource.SGLANG.value, StepSource.VLLM.value):
        return False
    rg = tl.host_ranges
    if len(rg) == 0:
        return False
    _, names = str_codes(rg["name"])
    return any(name_role(str(n)) in (NameRole.FORWARD, NameRole.EXECUTE) for n in names)


def step_counts(tl: Timeline, w: pd.DataFrame, sets: DeviceSets | None = None) -> dict[str, np.ndarray]:
    """Per step of ``w`` (``step_windows``), ``COUNT_COLUMNS``: the rank's device busy time inside it,
    the graph kernels and the launch and graph-launch calls that start in it."""
    n = len(w)
    cols = {c: np.zeros(n, np.int64) for c in COUNT_COLUMNS}
    dev, api = tl.device, tl.api
    sets = DeviceSets.of(tl, sets)
    graph_kernel = sets.graph_mask()
    is_launch = isin(api["kind"], [ApiKind.LAUNCH]) if len(api) else np.zeros(0, bool)
    is_glaunch = isin(api["kind"], [ApiKind.GRAPH_LAUNCH]) if len(api) else np.zeros(0, bool)
    for rank, idx in (w.groupby("rank").indices.items() if n else []):
        s, e = w["start_ns"].to_numpy()[idx], w["end_ns"].to_numpy()[idx]
        d = dev["rank"].to_numpy() == rank
        cols["busy_ns"][idx] = iv.overlap(sets.rank_union(int(cast(int, rank))), s, e)
        cols["graph_kernels"][idx] = _count_in(dev["start_ns"].to_numpy()[d & graph_kernel], s, e)
        if len(api):
            on = api["rank"].to_numpy() == rank
            cols["launches"][idx] = _count_in(api["start_ns"].to_numpy()[on & is_launch], s, e)
            cols["graph_launches"][idx] = _count_in(api["start_ns"].to_numpy()[on & is_glaunch], s, e)
    return cols


def find_steps(tl: Timeline, rule: StepRule = StepRule(), sets: DeviceSets | None = None,
               counts: dict[str, np.ndarray] | None = None, any_api: bool | None = None,
               windows: tuple[str, pd.DataFrame] | None = None) -> tuple[str, pd.DataFrame]:
    """(source, table with ``STEP_COLUMNS``), sorted by rank then start. ``sets``: the trace's
    device sets (built when None). ``counts`` (``step_counts`` of ``step_windows``), ``any_api``
    (the trace has API rows) and ``windows`` (``step_windows``): given when the device and API rows
    are not in ``tl``."""
    stages = _resolved(tl.host_ranges)
    source, w = _windows(tl, stages, rule) if windows is None else (windows[0], windows[1].copy())
    if len(w) == 0:
        return "none", pd.DataFrame({c: pd.Series([], dtype=object if c in ("mode", "exec", "reason")
                                                  else np.int64) for c in STEP_COLUMNS})
    for c in ("rank", "pid", "tid", "start_ns", "end_ns", "step", "bs", "tokens"):
        w[c] = w[c].astype(np.int64)
    w = w.sort_values(["rank", "start_ns"], ignore_index=True)
    _engine_step_attrs(tl, w)
    ordinal = w.groupby("rank").cumcount().to_numpy()
    w["step"] = np.where(w["step"].to_numpy() >= 0, w["step"].to_numpy(), ordinal)
    n = len(w)
    cols = {c: np.zeros(n, np.int64) for c in ("n_eager", "n_graph")}
    cols.update(step_counts(tl, w, sets) if counts is None else counts)
    padded = np.full(n, -1, np.int64)
    run_bs = np.full(n, -1, np.int64)
    mode = w["mode"].to_numpy().copy()
    reason = np.full(n, "", dtype=object)
    rg = tl.host_ranges
    run = (stages == Stage.RUN_EAGER.value) | (stages == Stage.RUN_GRAPH_REPLAY.value)
    for rank, idx in w.groupby("rank").indices.items():
        s, e = w["start_ns"].to_numpy()[idx], w["end_ns"].to_numpy()[idx]
        if len(run) and run.any():
            rr = np.flatnonzero(run & (rg["rank"].to_numpy() == rank))
            rs = rg["start_ns"].to_numpy()[rr]
            pos = np.searchsorted(s, rs, side="right") - 1
            ok = (pos >= 0) & (rs < e[np.maximum(pos, 0)])
            rr, pos = rr[ok], pos[ok]
            is_graph = stages[rr] == Stage.RUN_GRAPH_REPLAY.value
            np.add.at(cols["n_graph"], idx[pos[is_graph]], 1)
            np.add.at(cols["n_eager"], idx[pos[~is_graph]], 1)
            attrs = rg["attrs"].to_numpy()[rr]
            bs_r, pad_r, why = _attr_int(attrs, "bs"), _attr_int(attrs, "padded_bs"), _attr_str(attrs, "reason")
            # a forward's own mode (--instrument sglang: the batch's ForwardMode, at the range's start)
            # fills a step that none of the step ranges gave one
            mode_r = _attr_str(attrs, "mode")
            for j in range(len(rr)):  # one per forward range
                t = idx[pos[j]]
                run_bs[t] = max(run_bs[t], bs_r[j])
                padded[t] = max(padded[t], pad_r[j])
                if why[j] and not reason[t]:
                    reason[t] = why[j]
                if mode_r[j] in _MODES and not mode[t]:
                    mode[t] = mode_r[j]
    # NOTE: device activity alone (busy time, graph kernels) classifies a step only when nothing says
    # what was launched when; with forward ranges or launch calls, a step that launched nothing is
    # idle even if the device still ran earlier work (an overlap loop's forward outlives its step)
    evidence = (run.any() if len(run) else False) or (bool(len(tl.api)) if any_api is None else any_api)
    graph = (cols["graph_launches"] > 0) | (cols["n_graph"] > 0) \
        | ((cols["graph_kernels"] > 0) & (not evidence))
    eager = ~graph & ((cols["launches"] > 0) | (cols["n_eager"] > 0)
                      | ((cols["busy_ns"] > 0) & (not evidence)))
    w["mode"] = mode
    w["exec"] = np.where(graph, StepExec.GRAPH.value, np.where(eager, StepExec.EAGER.value, StepExec.IDLE.value))
    w["reason"] = np.where(eager, reason, "")
    w["bs"] = np.where(w["bs"].to_numpy() >= 0, w["bs"].to_numpy(), run_bs)
    w["padded_bs"] = padded
    w["wall_ns"] = w["end_ns"] - w["start_ns"]
    for c in ("busy_ns", "launches", "graph_launches", "graph_kernels"):
        w[c] = cols[c]
    return source, w[list(STEP_COLUMNS)]


def _count_in(times: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    t = times if iv.is_sorted(times) else np.sort(times, kind="stable")   # start-sorted already: no copy
    return np.searchsorted(t, e, side="left") - np.searchsorted(t, s, side="left")
