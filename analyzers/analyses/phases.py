"""Prefill and decode apart: a step budget and a verdict per phase, where the engine marks them.

A step's phase comes from its ``mode`` attribute (``probes.stages.StepMode``): ``extend`` and
``mixed`` steps are prefill, ``decode`` steps decode; steps without a mode (or ``idle``) belong to
neither. Their bottlenecks differ (a prefill is long and compute-heavy, a decode short and exposed
to every host overhead), so the mean step of each phase is split as the overall budget is — compute,
exposed communication, bubbles by class, other — and the phase's verdict names the bubble class
that lost it the most time, ``healthy`` when its bubbles are under ``healthy_pct`` of its wall
time, or ``no dominant`` when, with the steps' accounting given, the verdict's own rule finds no
cause dominating the phase's steps (``dominance.no_dominant``: a clean engine's decode steps lose a
little to each of its stages, as the whole run's verdict says). Produced only when both phases have
steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.dominance import no_dominant
from srtscope.analyzers.analyses.losses import StepLosses
from srtscope.analyzers.model.vocab import BUBBLE_CLASSES
from srtscope.probes.stages import EXTEND_LIKE_MODES, StepMode

PREFILL, DECODE = "prefill", "decode"
HEALTHY, NO_DOMINANT = "healthy", "no dominant"


def phase_of(mode: str) -> str | None:
    """``prefill``, ``decode`` or None for a step's ``mode`` attribute."""
    if mode in EXTEND_LIKE_MODES:
        return PREFILL
    return DECODE if mode == StepMode.DECODE.value else None


@dataclass(frozen=True)
class PhaseBudget:
    """One phase's steps: their count, mean wall / compute / exposed comm / other per step (ns),
    mean bubble time per step by class (ns), and its verdict: ``bottleneck`` is the bubble class
    that lost the most (``healthy`` when lost time is under the healthy share); ``lost_pct`` the
    bubbles' share of the phase's wall time, ``top_share`` the bottleneck's share of the bubbles."""

    phase: str
    steps: int
    mean_wall_ns: int
    mean_compute_ns: int
    mean_comm_ns: int
    mean_other_ns: int
    mean_bubbles_ns: dict[str, int] = field(default_factory=dict)
    bottleneck: str = HEALTHY
    lost_pct: float = 0.0
    top_share: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "steps": int(self.steps), "mean_wall_ns": int(self.mean_wall_ns),
                "mean_compute_ns": int(self.mean_compute_ns), "mean_comm_ns": int(self.mean_comm_ns),
                "mean_other_ns": int(self.mean_other_ns),
                "mean_bubbles_ns": {c: int(v) for c, v in self.mean_bubbles_ns.items()},
                "bottleneck": self.bottleneck, "lost_pct": round(float(self.lost_pct), 2),
                "top_share": round(float(self.top_share), 4)}


def phase_split(steps: pd.DataFrame, budget: pd.DataFrame, healthy_pct: float,
                losses: StepLosses | None = None) -> tuple[PhaseBudget, ...]:
    """Per phase (prefill first), from the step table (``mode`` column) and the budget table built
    from it (same rows, same order), and the steps' accounting (``losses``, same rows: a phase of no
    dominant cause); () unless both phases have steps."""
    if len(steps) == 0 or len(steps) != len(budget) or "mode" not in steps.columns:
        return ()
    phases = np.array([phase_of(str(m)) for m in steps["mode"].to_numpy()], dtype=object)
    out = []
    for phase in (PREFILL, DECODE):
        rows = budget[phases == phase]
        n = len(rows)
        if n == 0:
            return ()
        wall = int(rows["wall_ns"].sum())
        bubbles = {c: int(rows[f"{c}_ns"].sum()) for c in BUBBLE_CLASSES}
        lost = sum(bubbles.values())
        top = max(bubbles, key=lambda c: bubbles[c])
        lost_pct = 100.0 * lost / wall if wall > 0 else 0.0
        verdict = HEALTHY if lost_pct < healthy_pct or lost == 0 else top
        if verdict != HEALTHY and losses is not None and losses.n == len(steps):
            mine = losses.subset(phases == phase)
            if no_dominant(mine, sum(int(mine.device_lost(c).sum()) for c in mine.lost)) is not None:
                verdict = NO_DOMINANT
        out.append(PhaseBudget(
            phase=phase, steps=n, mean_wall_ns=wall // n, mean_compute_ns=int(rows["compute_ns"].sum()) // n,
            mean_comm_ns=int(rows["exposed_comm_ns"].sum()) // n, mean_other_ns=int(rows["other_ns"].sum()) // n,
            mean_bubbles_ns={c: v // n for c, v in bubbles.items() if v > 0}, bottleneck=verdict,
            lost_pct=lost_pct, top_share=(bubbles[top] / lost) if lost else 0.0))
    return tuple(out)
