"""``diagnose(tl) -> Diagnosis`` runs every analysis; ``compare(before, after)`` diffs two diagnoses.

A whole read is one window of the windowed analyses (``reduce.one_window``): each figure
is written once, as a window's part and the parts' combine.

Pure: no printing, no I/O. The CLI renders ``Diagnosis`` / ``DiagnosisDiff`` and their ``to_json()``.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.diff import DiagnosisDiff, FigureDelta, compare
from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.results import Diagnosis
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.model.vocab import StepSource
from srtscope.analyzers.pipeline.reduce import one_window

__all__ = ["DiagnoseParams", "diagnose", "compare", "crop", "DiagnosisDiff", "FigureDelta"]


class DiagnoseInputError(ValueError):
    """The trace and the parameters together select nothing to analyse (e.g. an empty step range)."""


def crop(tl: Timeline, lo_ns: int, hi_ns: int) -> Timeline:
    """The rows overlapping [lo, hi), clipped to it (metadata shared)."""
    def cut(df: pd.DataFrame) -> pd.DataFrame:
        m = (df["end_ns"].to_numpy() > lo_ns) & (df["start_ns"].to_numpy() < hi_ns)
        out = df[m].copy()
        out["start_ns"] = np.maximum(out["start_ns"].to_numpy(), lo_ns)
        out["end_ns"] = np.minimum(out["end_ns"].to_numpy(), hi_ns)
        return out.reset_index(drop=True)
    c = tl.counters
    c = c[(c["t_ns"] >= lo_ns) & (c["t_ns"] < hi_ns)].reset_index(drop=True)
    return Timeline(cut(tl.device), cut(tl.api), cut(tl.ranges), c, tl.meta)


def _select_steps(tl: Timeline, params: DiagnoseParams) -> tuple[Timeline, str, pd.DataFrame, DeviceSets]:
    """(the Timeline cropped to the selected steps, step source, steps, its device sets)."""
    sets = DeviceSets(tl)
    source, steps = find_steps(tl, params.step_rule, sets)
    if params.step_range is None:
        return tl, source, steps, sets
    a, b = params.step_range
    sel = steps[(steps["step"] >= a) & (steps["step"] <= b)]
    if len(sel) == 0:
        have = (f"steps {int(steps['step'].min())}..{int(steps['step'].max())}" if len(steps)
                else "no steps")
        raise DiagnoseInputError(f"step range {a}..{b} selects no step (the trace has {have})")
    tl = crop(tl, int(sel["start_ns"].min()), int(sel["end_ns"].max()))
    sets = DeviceSets(tl)
    if not StepSource(source).own_numbers:
        # NOTE: the whole trace's steps, bounds and numbers: found again in the cropped trace, steps
        # of a derived rhythm (syncs, launch bursts) start elsewhere (the first of --steps 10:30 was
        # lost) and steps without numbers of their own restart from 0
        return tl, source, sel.reset_index(drop=True), sets
    # numbered steps are found again in the crop, as a read of their window alone finds them
    source, steps = find_steps(tl, params.step_rule, sets)
    return tl, source, steps[(steps["step"] >= a) & (steps["step"] <= b)].reset_index(drop=True), sets


_DEFAULT_PARAMS = DiagnoseParams()


def diagnose(tl: Timeline, params: DiagnoseParams = _DEFAULT_PARAMS, *,
             shrink_ns: Mapping[str, int] | None = None) -> Diagnosis:
    """Every analysis over one Timeline, and the verdict. ``shrink_ns`` (cause -> host ns cut per
    step, ``analyses.whatif.SHRINKABLE``): the what-if of those causes shrinks them instead of removing them."""
    tl, source, steps, sets = _select_steps(tl, params)
    return one_window(tl, source, steps, sets, params, shrink_ns)


