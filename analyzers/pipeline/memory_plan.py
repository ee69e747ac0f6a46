"""How to read an nsys export within a memory budget: whole, or one time window, and which.

    plan = plan_read(path, rank, est, budget_bytes, params)   # None: read it whole, as ever

- ``--steps A:B`` on an export whose step numbers are its own (``loop.step`` with ``step=``,
  ``ProfilerStep#N``): the window of those steps, read alone (``read_nsys(window=...)``) when the
  whole read is over the budget or would not be cached (``push_steps``). The Timeline is the one
  ``diagnose`` crops to those steps, so the diagnosis is the same, to the byte.
- over the budget without ``--steps``: the most whole steps around the middle of the capture
  (warm-up is at its start) whose window fits, else the widest time window around the middle; the
  caller says so in a ``window_cut`` warning (``window_message``).
- nothing fits, or the file cannot be windowed (Kineto, probe traces): ``BudgetError``, one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.diagnose import crop
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline, merge_timelines
from srtscope.analyzers.model.units import fmt_mem, plural
from srtscope.analyzers.model.vocab import StepSource
from srtscope.analyzers.readers import rank_from_name
from srtscope.analyzers.readers.memory_estimate import BASE_BYTES, MemoryEstimate, nsys_peak, nsys_rows_within
from srtscope.analyzers.readers.window_plan import (
    Sample,
    device_pids,
    middle_steps,
    middle_time,
    preview,
    rows_in,
    sample_tables,
    span_of,
)

#: share of the budget a planned window may fill (the rest: the sample's error)
PLAN_SHARE = 0.9
#: step sources whose numbers are the trace's own: a window of them keeps their numbers
OWN_NUMBERS = tuple(s.value for s in StepSource if s.own_numbers)


class BudgetError(ValueError):
    """The diagnosis cannot be done within the memory budget (one line, for the user)."""


@dataclass(frozen=True)
class ReadPlan:
    """A windowed read: ``window`` [lo, hi) ns of the export's clock, its estimated rows and peak
    (bytes); ``steps``: (first, last, count) of the whole steps in it (None: a time window);
    ``of_steps``: steps in the capture; ``pushed``: an exact ``--steps`` selection (no warning)."""

    window: tuple[int, int]
    rows: int
    peak_bytes: int
    estimate: MemoryEstimate
    steps: tuple[int, int, int] | None
    of_steps: int
    pushed: bool


def _gib_up(n: int) -> str:
    """A budget that holds ``n`` bytes, as an option value: ``10GiB``."""
    return f"{-(-n // (1 << 30))}GiB"


def over_message(est: MemoryEstimate, budget: int, steps: bool = True) -> str:
    """The one line of a diagnosis over ``budget``: what it needs, and the options that help."""
    name = Path(est.path).name
    more = " or diagnose fewer steps (--steps A:B)" if steps else ""
    return (f"{name}: a diagnosis needs ~{fmt_mem(est.peak_bytes)}, over --memory-budget {fmt_mem(budget)}; "
            f"raise it (--memory-budget {_gib_up(est.peak_bytes)}){more}")


def _numbers_hold(pv: Timeline, params: DiagnoseParams, sel: pd.DataFrame, lo: int, hi: int) -> bool:
    """Whether the steps found in the window alone carry the numbers they carry in the whole trace."""
    a, b = params.step_range or (0, 0)
    _, again = find_steps(crop(pv, lo, hi), params.step_rule)
    got = again[(again["step"] >= a) & (again["step"] <= b)]
    return sorted(zip(got["rank"].tolist(), got["step"].tolist())) == \
        sorted(zip(sel["rank"].tolist(), sel["step"].tolist()))


def combined(ests: list[MemoryEstimate]) -> MemoryEstimate:
    """The estimate of a diagnosis of several files (one per rank) in one process: one base."""
    if len(ests) == 1:
        return ests[0]
    rows: dict[str, int] = {}
    for e in ests:
        for t, n in e.rows.items():
            rows[t] = rows.get(t, 0) + n
    fmt = next((e.format for e in ests if not e.windowable), ests[0].format)
    return MemoryEstimate(f"{len(ests)} files", fmt,
                          sum(e.peak_bytes for e in ests) - BASE_BYTES * (len(ests) - 1), rows)


def plan_read(path: Path, rank: int, est: MemoryEstimate, budget: int | None, params: DiagnoseParams,
              push_steps: bool = False) -> ReadPlan | None:
    """How to read ``path`` (estimated ``est``, its first process rank ``rank``) within ``budget``
    bytes (None: no limit); None = whole. ``push_steps``: read ``params.step_range`` alone even within
    the budget. BudgetError when it cannot be done."""
    return plan_files([path], [est], budget, params, push_steps, ranks=[rank])


def _previews(paths: list[Path], ests: list[MemoryEstimate], ranks: list[int] | None
              ) -> tuple[list[Sample], Timeline]:
    """The big tables' samples of every file, and their NVTX ranges as one Timeline, ranked as
    ``load_timeline`` ranks them (a rank in the file name, else the next after the previous file's)."""
    samples: list[Sample] = []
    views = []
    next_rank = 0
    for i, (p, e) in enumerate(zip(paths, ests)):
        mine = sample_tables(p, e)
        pids = device_pids(mine, e)
        named = rank_from_name(p)
        rank = ranks[i] if ranks is not None else (named if named is not None else next_rank)
        next_rank = rank + max(1, len(pids))
        samples += mine
        views.append(preview(p, rank, pids))
    return samples, merge_timelines(views)


def plan_files(paths: list[Path], ests: list[MemoryEstimate], budget: int | None, params: DiagnoseParams,
               push_steps: bool = False, ranks: list[int] | None = None) -> ReadPlan | None:
    """``plan_read`` of one or more files read together (one per rank): one window for all of them
    (their Timeline's clock). ``ranks``: each file's first rank (default: as ``load_timeline``)."""
    est = combined(ests)
    over = budget is not None and est.peak_bytes > budget
    if not est.windowable:
        if over:
            raise BudgetError(over_message(est, budget or 0, steps=False) + " (only nsys exports can be "
                              "read by time window)")
        return None
    if not over and (params.step_range is None or not push_steps):
        return None
    samples, pv = _previews(paths, ests, ranks)
    source, steps = find_steps(pv, params.step_rule)
    if params.step_range is not None:
        a, b = params.step_range
        sel = steps[(steps["step"] >= a) & (steps["step"] <= b)]
        if source in OWN_NUMBERS and len(sel):
            lo, hi = int(sel["start_ns"].min()), int(sel["end_ns"].max())
            if _numbers_hold(pv, params, sel, lo, hi):
                rows = rows_in(samples, lo, hi)
                peak = nsys_peak(est.nvtx_rows + rows)
                if budget is not None and peak > budget:
                    raise BudgetError(f"{Path(est.path).name}: steps {a}..{b} need ~{fmt_mem(peak)}, over "
                                      f"--memory-budget {fmt_mem(budget)}; raise it (--memory-budget "
                                      f"{_gib_up(peak)}) or diagnose fewer steps (--steps A:B)")
                return ReadPlan((lo, hi), int(rows), peak, est, (a, b, len(sel)), len(steps), True)
        if over and source in OWN_NUMBERS and len(steps) and not len(sel):
            raise BudgetError(f"{Path(est.path).name}: step range {a}..{b} selects no step (the trace has steps "
                              f"{int(steps['step'].min())}..{int(steps['step'].max())})")
        if over:
            raise BudgetError(over_message(est, budget or 0, steps=False) + f" (the steps of --steps {a}:{b + 1} "
                              "cannot be read alone: they have no numbers of their own in the trace)")
        return None
    max_rows = nsys_rows_within(int((budget or 0) * PLAN_SHARE)) - est.nvtx_rows
    if max_rows <= 0:
        raise BudgetError(over_message(est, budget or 0, steps=False) + " (its NVTX ranges alone need "
                          f"~{fmt_mem(nsys_peak(est.nvtx_rows))})")
    if source != StepSource.NONE.value and len(steps):
        chosen = middle_steps(steps, samples, max_rows)
        if not len(chosen):
            raise BudgetError(over_message(est, budget or 0, steps=False) + " (not even one step fits)")
        lo, hi = int(chosen["start_ns"].min()), int(chosen["end_ns"].max())
        rows = rows_in(samples, lo, hi)
        held = (int(chosen["step"].iloc[0]), int(chosen["step"].iloc[-1]), len(chosen))   # in time order
        return ReadPlan((lo, hi), int(rows), nsys_peak(est.nvtx_rows + rows), est, held,
                        int(steps.groupby("rank").size().max()), False)
    span = span_of(samples, steps)
    win = middle_time(span, samples, max_rows) if span is not None else None
    if win is None:
        raise BudgetError(over_message(est, budget or 0))
    rows = rows_in(samples, *win)
    return ReadPlan(win, int(rows), nsys_peak(est.nvtx_rows + rows), est, None, 0, False)


def window_message(plan: ReadPlan, budget: int, capture_start_ns: int) -> str:
    """The ``window_cut`` warning of a read cut to fit the budget: the window in seconds of the
    capture, its steps, the estimates and the budget, and how to see more."""
    lo, hi = plan.window
    where = f"{(lo - capture_start_ns) / 1e9:.3f}-{(hi - capture_start_ns) / 1e9:.3f} s of the capture"
    held = (f", {plural(plan.steps[2], 'whole step')} of {plan.of_steps}, from step {plan.steps[0]} "
            f"to step {plan.steps[1]}" if plan.steps else " (a time window: no step ranges in the trace)")
    return (f"memory budget: only {where} was diagnosed{held}: the whole trace needs "
            f"~{fmt_mem(plan.estimate.peak_bytes)}, over --memory-budget {fmt_mem(budget)} "
            f"(this window ~{fmt_mem(plan.peak_bytes)}); for more, raise --memory-budget "
            f"(--memory-budget {_gib_up(plan.estimate.peak_bytes)} for all) or choose steps (--steps A:B)")
