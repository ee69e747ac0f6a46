"""Prefill and decode apart (the JSON's ``phases``), as rows every renderer shows the same way."""
from __future__ import annotations

from typing import Any

from srtscope.analyzers.model.units import fmt_ns

TITLE = "prefill vs decode: the mean step of each phase"
HEAD = ("phase", "steps", "step", "compute", "lost", "verdict", "largest losses per step")


def phase_rows(d: dict[str, Any], top: int = 2) -> list[tuple[str, ...]]:
    """One row per phase: name, steps, mean step, mean compute, % of the step lost, the phase's
    verdict class and its ``top`` largest bubble classes per step (all text, plain: callers escape)."""
    rows: list[tuple[str, ...]] = []
    for ph in d.get("phases") or []:
        b = ph.get("mean_bubbles_ns") or {}
        worst = ", ".join(f"{c} {fmt_ns(v)}" for c, v in sorted(b.items(), key=lambda kv: -int(kv[1]))[:top])
        rows.append((str(ph.get("phase")), str(int(ph.get("steps") or 0)), fmt_ns(ph.get("mean_wall_ns")),
                     fmt_ns(ph.get("mean_compute_ns")), f"{float(ph.get('lost_pct') or 0):.0f}%",
                     str(ph.get("bottleneck")), worst))
    return rows
