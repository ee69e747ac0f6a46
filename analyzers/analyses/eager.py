"""Eager fallback: decode steps that ran eagerly while CUDA graphs were used elsewhere.

Reason per eager step: the ``run.eager`` range's ``reason`` attribute when present; else inferred —
``extend`` (an extend or mixed step, ``probes.stages.EXTEND_LIKE_MODES``), ``bs_over_max`` (batch
above the largest graph-replayed batch), ``disabled`` (no step used graphs), ``unknown``. Cost: wall
time and launches per eager decode step against graph-replayed steps of the nearest batch size.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model.results import EagerResult
from srtscope.analyzers.model.vocab import Cause, StepExec
from srtscope.probes.stages import EXTEND_LIKE_MODES, EagerReason

_GRAPH, _EAGER = StepExec.GRAPH.value, StepExec.EAGER.value

_EXTEND_MODES = tuple(sorted(EXTEND_LIKE_MODES))


def eager_reasons(steps: pd.DataFrame) -> pd.Series:
    """The reason of every eager step (index like ``steps``; '' for non-eager steps)."""
    if len(steps) == 0:
        return pd.Series([], dtype=object)
    eager = steps["exec"].to_numpy() == _EAGER
    graph = steps["exec"].to_numpy() == _GRAPH
    size = np.maximum(steps["bs"].to_numpy(), steps["padded_bs"].to_numpy())
    max_bs = int(size[graph].max()) if graph.any() and (size[graph] >= 0).any() else -1
    mode = steps["mode"].astype(str).to_numpy()
    given = steps["reason"].astype(str).to_numpy()
    bs = steps["bs"].to_numpy()
    inferred = np.where(np.isin(mode, _EXTEND_MODES), EagerReason.EXTEND.value,
                        np.where((max_bs >= 0) & (bs > max_bs), EagerReason.BS_OVER_MAX.value,
                                 np.where(not graph.any(), EagerReason.DISABLED.value, EagerReason.UNKNOWN.value)))
    out = np.where(given != "", given, inferred)
    return pd.Series(np.where(eager, out, ""), index=steps.index, dtype=object)


def fallback_mask(steps: pd.DataFrame) -> np.ndarray:
    """Steps that are an eager fallback: eager decode-like steps while some step replayed a graph."""
    if len(steps) == 0:
        return np.zeros(0, bool)
    ex = steps["exec"].to_numpy()
    decode_like = ~np.isin(steps["mode"].astype(str).to_numpy(), _EXTEND_MODES)
    return (ex == _EAGER) & decode_like & bool((ex == _GRAPH).any())


def eager_fallback(steps: pd.DataFrame) -> EagerResult:
    if len(steps) == 0:
        return EagerResult(0, 0, {}, None, None, None, None, None, 0, ())
    reasons = eager_reasons(steps)
    ex = steps["exec"].to_numpy()
    mode = steps["mode"].astype(str).to_numpy()
    graph = ex == _GRAPH
    decode_like = ~np.isin(mode, _EXTEND_MODES)
    fallback = (ex == _EAGER) & decode_like & graph.any()
    size = np.maximum(steps["bs"].to_numpy(), steps["padded_bs"].to_numpy())
    max_bs = int(size[graph].max()) if graph.any() and (size[graph] >= 0).any() else None
    wall = steps["wall_ns"].to_numpy()
    launches = steps["launches"].to_numpy().astype(float)
    g_wall = int(wall[graph].mean()) if graph.any() else None
    e_wall = int(wall[fallback].mean()) if fallback.any() else None
    extra = 0
    if fallback.any() and graph.any():
        gbs = steps["bs"].to_numpy()[graph]
        by_bs = pd.Series(wall[graph]).groupby(gbs).mean()
        ref = np.full(int(fallback.sum()), float(wall[graph].mean()))
        ebs = steps["bs"].to_numpy()[fallback]
        keys, vals = by_bs.index.to_numpy(), by_bs.to_numpy()
        ok = keys >= 0
        keys, vals = keys[ok], vals[ok]
        if len(keys):
            pos = np.clip(np.searchsorted(keys, ebs), 0, len(keys) - 1)
            left = np.clip(pos - 1, 0, len(keys) - 1)
            nearest = np.where(np.abs(keys[left] - ebs) < np.abs(keys[pos] - ebs), left, pos)
            ref = np.where(ebs >= 0, vals[nearest], ref)
        extra = int(np.maximum(wall[fallback] - ref, 0).sum())
    counts = reasons[fallback].value_counts() if fallback.any() else pd.Series(dtype=int)
    return EagerResult(
        graph_steps=int(graph.sum()), eager_decode_steps=int(fallback.sum()),
        reasons={str(k): int(v) for k, v in counts.items()}, max_captured_bs=max_bs,
        eager_mean_wall_ns=e_wall, graph_mean_wall_ns=g_wall,
        eager_mean_launches=float(launches[fallback].mean()) if fallback.any() else None,
        graph_mean_launches=float(launches[graph].mean()) if graph.any() else None,
        extra_ns=extra, example_steps=tuple(int(x) for x in steps["step"].to_numpy()[fallback][:5]),
        batch_sizes=tuple(int(b) for b in np.unique(steps["bs"].to_numpy()[fallback]) if b >= 0))
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
