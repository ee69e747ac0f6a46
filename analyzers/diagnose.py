"""``diagnose(tl) -> Diagnosis`` runs every analysis; ``compare(before, after)`` diffs two diagnoses.

A whole read is one window of the windowed analyses (``reduce.one_window``): each figure
is written once, as a window's part and the parts' combine.

Pure: no printing, no I/O. The CLI renders ``Diagnosis`` / ``DiagnosisDiff`` and their ``to_json()``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.attribution import BUBBLE_CAUSES
from srtscope.analyzers.analyses.bubbles import histogram
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.analyses.diff import DiagnosisDiff, FigureDelta, compare
from srtscope.analyzers.analyses.eager import fallback_mask
from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.results import BUBBLE_CLASSES, BubbleResult, CaptureInfo, Diagnosis
from srtscope.analyzers.model.timeline import Timeline, TimelineMeta
from srtscope.analyzers.model.vocab import Cause

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
    source, steps = find_steps(tl, params.step_rule, sets)
    # NOTE: steps without numbers of their own (vLLM's, SGLang's, the fallbacks) are numbered by
    # their order, which restarts in the cropped trace: they are the selected steps by start time
    number = dict(zip(zip(sel["rank"].tolist(), sel["start_ns"].tolist()), sel["step"].tolist()))
    keys = list(zip(steps["rank"].tolist(), steps["start_ns"].tolist()))
    if any(k in number for k in keys):
        steps = steps[[k in number for k in keys]].copy()
        steps["step"] = [number[k] for k in zip(steps["rank"].tolist(), steps["start_ns"].tolist())]
        return tl, source, steps.reset_index(drop=True), sets
    return tl, source, steps[(steps["step"] >= a) & (steps["step"] <= b)].reset_index(drop=True), sets


def _pieces(bubbles: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Bubbles cut at their rank's step boundaries; ``step_row`` = row of ``steps`` holding the piece."""
    parts = []
    for rank, bidx in (bubbles.groupby("rank").indices.items() if len(bubbles) else []):
        b = bubbles.iloc[bidx]
        st = steps[steps["rank"] == rank]
        cuts = np.r_[st["start_ns"].to_numpy(), st["end_ns"].to_numpy()]
        ps, pe, src = iv.split_at(b["start_ns"].to_numpy(), b["end_ns"].to_numpy(), cuts)
        row = np.full(len(ps), -1, np.int64)
        if len(st):
            order = np.argsort(st["start_ns"].to_numpy(), kind="stable")
            s_sorted = st["start_ns"].to_numpy()[order]
            pos = np.searchsorted(s_sorted, ps, side="right") - 1
            ok = pos >= 0
            cand = order[np.maximum(pos, 0)]
            ok &= ps < st["end_ns"].to_numpy()[cand]
            row = np.where(ok, st.index.to_numpy()[cand], -1)
        parts.append(pd.DataFrame({"bubble": bidx[src], "rank": rank, "device": b["device"].to_numpy()[src],
                                   "pid": b["pid"].to_numpy()[src], "tid": b["tid"].to_numpy()[src],
                                   "start_ns": ps, "end_ns": pe, "step_row": row,
                                   "queued_ns": b["queued_ns"].to_numpy()[src]}))
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in
                             ("bubble", "rank", "device", "pid", "tid", "start_ns", "end_ns", "step_row",
                              "queued_ns")})
    return pd.concat(parts, ignore_index=True)


_DEFAULT_PARAMS = DiagnoseParams()


def diagnose(tl: Timeline, params: DiagnoseParams = _DEFAULT_PARAMS, *,
             shrink_ns: Mapping[str, int] | None = None) -> Diagnosis:
    """Every analysis over one Timeline, and the verdict. ``shrink_ns`` (cause -> host ns cut per
    step, ``analyses.whatif.SHRINKABLE``): the what-if of those causes shrinks them instead of removing them."""
    from srtscope.analyzers.pipeline.reduce import one_window  # noqa: PLC0415
    tl, source, steps, sets = _select_steps(tl, params)
    return one_window(tl, source, steps, sets, params, shrink_ns)


def with_causes(pieces: pd.DataFrame, classes: pd.DataFrame, steps: pd.DataFrame,
                fb_rows: np.ndarray | None = None) -> pd.DataFrame:
    """Attributed bubble pieces: ``pieces`` (their ``queued_ns`` dropped) beside ``attribute``'s
    ``classes``, with the launch-bound time of eager-fallback steps moved to the fallback (in place).
    ``fb_rows``: ``steps``' eager-fallback rows when known already (``fallback_rows``)."""
    if fb_rows is None:
        fb_rows = fallback_rows(steps)
    in_fb = np.isin(pieces["step_row"].to_numpy(), fb_rows) if len(fb_rows) else np.zeros(len(pieces), bool)
    lb, ef = f"cause.{Cause.LAUNCH_BOUND.value}_ns", f"cause.{Cause.EAGER_FALLBACK.value}_ns"
    classes.loc[in_fb, ef] += classes.loc[in_fb, lb]
    classes.loc[in_fb, lb] = 0
    return pd.concat([pieces.drop(columns=["queued_ns"]), classes], axis=1)


def fallback_rows(steps: pd.DataFrame) -> np.ndarray:
    """The index labels of ``steps`` that are an eager fallback (``eager.fallback_mask``)."""
    return steps.index.to_numpy()[fallback_mask(steps)]


def bubble_result(bubbles: pd.DataFrame, pieces: pd.DataFrame, stages: pd.DataFrame, by_device: pd.DataFrame,
                  by_stream: pd.DataFrame, user_ranges: dict[str, int], threshold_ns: int,
                  has_ranges: bool) -> BubbleResult:
    """The bubble figures: ``bubbles`` (rank, device, pid, tid, start_ns, end_ns, dur_ns; row = the
    pieces' ``bubble``) with their attributed ``pieces`` and per-piece ``stages`` (``attribute``'s)
    summed per bubble; ``has_ranges``: the trace has host ranges (NVTX coverage is then known)."""
    ccols = [f"{c}_ns" for c in BUBBLE_CLASSES] + ["covered_ns"]
    kcols = [f"cause.{c}_ns" for c in BUBBLE_CAUSES]
    per_bubble = pieces.groupby("bubble")[ccols].sum() if len(pieces) else pd.DataFrame(columns=ccols)
    table = bubbles.join(per_bubble)
    for c in ccols:
        table[c] = table[c].fillna(0).astype(np.int64)
    if stages.shape[1]:
        sb = stages.groupby(pieces["bubble"]).sum()
        top = sb.idxmax(axis=1).where(sb.max(axis=1) > 0, "")
        table["top_stage"] = top.reindex(table.index).fillna("")
    else:
        table["top_stage"] = ""
    total = int(table["dur_ns"].sum())
    by_stage = stages.sum(axis=0).sort_values(ascending=False) if stages.shape[1] else pd.Series(dtype=np.int64)
    by_cause = {c: int(pieces[k].sum()) for c, k in zip(BUBBLE_CAUSES, kcols)} if len(pieces) else {}
    return BubbleResult(
        count=len(table), total_ns=total, window_ns=int(by_device["window_ns"].sum()),
        busy_ns=int(by_device["busy_ns"].sum()),
        by_class={c: int(table[f"{c}_ns"].sum()) for c in BUBBLE_CLASSES},
        by_stage={str(k): int(v) for k, v in by_stage.items() if v > 0},
        by_user_range=user_ranges,
        histogram=histogram(table["dur_ns"].to_numpy()), threshold_ns=threshold_ns,
        nvtx_coverage=(float(table["covered_ns"].sum()) / total) if total and has_ranges else None,
        table=table, by_device=by_device, by_stream=by_stream,
        by_cause={c: v for c, v in by_cause.items() if v > 0},
        sub_threshold_ns=int(by_device["small_gap_ns"].sum()) if len(by_device) else 0,
        sub_threshold_count=int(by_device["small_gap_count"].sum()) if len(by_device) else 0)


def capture_info(m: TimelineMeta, keys: list[tuple[int, int]], span: tuple[int, int], coverage: Any) -> CaptureInfo:
    """What was captured: ``m`` (with the diagnosis's warnings), the (rank, device) ``keys`` with
    activity, sorted, and the span of all rows (the window where the metadata names none)."""
    names = {d.id: d.name for d in m.devices}
    devices = tuple({"id": d, "name": names.get(d, ""), "rank": r} for r, d in keys)
    lo, hi = span
    return CaptureInfo(format=m.format.value if hasattr(m.format, "value") else str(m.format),
                       tool_version=m.tool_version, sources=tuple(m.sources), devices=devices,
                       ranks=tuple(m.ranks), window_ns=int((m.window_end_ns - m.window_start_ns) or (hi - lo)),
                       traced=tuple(sorted(t.value for t in m.traced)),
                       warnings=tuple({"code": w.code.value, "message": w.message} for w in m.warnings),
                       world_size=int(m.world_size), coverage=coverage)


def params_json(params: DiagnoseParams) -> dict:
    """The parameters as the JSON contract gives them."""
    p = asdict(params)
    p["step_range"] = list(params.step_range) if params.step_range else None
    return p
