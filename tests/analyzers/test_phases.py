"""Prefill and decode apart (``analyses/phases.py``): a budget and a verdict per phase, from steps
whose ``mode`` the engine marked. Each case is a tiny step table and its budget rows."""
from __future__ import annotations

import pandas as pd
import pytest

from srtscope.analyzers.analyses.budget import BUDGET_COLUMNS
from srtscope.analyzers.analyses.phases import phase_of, phase_split
from srtscope.analyzers.model.vocab import BUBBLE_CLASSES

MS = 1_000_000


def _tables(rows: list[tuple[str, int, int, dict[str, int]]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mode, wall ms, compute ms, {bubble class: ms}) per step -> (steps, budget)."""
    steps = pd.DataFrame({"step": range(len(rows)), "rank": 0, "mode": [r[0] for r in rows]})
    budget = pd.DataFrame([{c: 0 for c in BUDGET_COLUMNS} for _ in rows])
    budget["step"] = range(len(rows))
    for i, (_mode, wall, compute, bubbles) in enumerate(rows):
        budget.loc[i, "wall_ns"] = wall * MS
        budget.loc[i, "compute_ns"] = compute * MS
        for c, v in bubbles.items():
            budget.loc[i, f"{c}_ns"] = v * MS
        budget.loc[i, "other_ns"] = (wall - compute - sum(bubbles.values())) * MS
    return steps, budget


@pytest.mark.parametrize("mode, phase", [
    ("extend", "prefill"), ("mixed", "prefill"), ("decode", "decode"), ("idle", None), ("", None)])
def test_phase_of(mode, phase):
    assert phase_of(mode) == phase


def test_prefill_prep_bound_while_decode_is_scheduler_bound():
    # scenario: prefills wait on batch preparation (long prompts to lay out), decodes on the scheduler
    steps, budget = _tables([
        ("extend", 40, 30, {"prep": 8, "scheduler": 1}),
        ("mixed", 50, 38, {"prep": 10, "scheduler": 1}),
        ("decode", 10, 4, {"scheduler": 5, "prep": 1}),
        ("decode", 10, 4, {"scheduler": 5, "prep": 1}),
        ("decode", 10, 4, {"scheduler": 5, "prep": 1}),
        ("idle", 3, 0, {}),                                  # neither phase
    ])
    pre, dec = phase_split(steps, budget, healthy_pct=10.0)
    assert (pre.phase, pre.steps, pre.bottleneck) == ("prefill", 2, "prep")
    assert pre.mean_wall_ns == 45 * MS and pre.mean_compute_ns == 34 * MS
    assert pre.mean_bubbles_ns == {"prep": 9 * MS, "scheduler": 1 * MS}
    assert pre.lost_pct == pytest.approx(100 * 20 / 90) and pre.top_share == pytest.approx(0.9)
    assert (dec.phase, dec.steps, dec.bottleneck) == ("decode", 3, "scheduler")
    assert dec.mean_bubbles_ns == {"scheduler": 5 * MS, "prep": 1 * MS}
    assert dec.lost_pct == pytest.approx(60.0)
    # the parts of each mean step add up to it
    for ph in (pre, dec):
        parts = ph.mean_compute_ns + ph.mean_comm_ns + ph.mean_other_ns + sum(ph.mean_bubbles_ns.values())
        assert parts == ph.mean_wall_ns
    doc = pre.to_json()
    assert set(doc["mean_bubbles_ns"]) <= set(BUBBLE_CLASSES) and doc["bottleneck"] == "prep"


def test_a_phase_under_the_healthy_share_is_healthy():
    steps, budget = _tables([("extend", 100, 95, {"prep": 5}), ("decode", 10, 5, {"scheduler": 5})])
    pre, dec = phase_split(steps, budget, healthy_pct=10.0)
    assert pre.bottleneck == "healthy" and dec.bottleneck == "scheduler"


@pytest.mark.parametrize("modes", [
    ["decode", "decode"],            # no prefill step: nothing to split
    ["extend", "extend"],            # no decode step
    ["", ""],                        # the engine marks no mode
    [],
])
def test_no_split_without_both_phases(modes):
    steps, budget = _tables([(m, 10, 5, {"scheduler": 5}) for m in modes])
    assert phase_split(steps, budget, 10.0) == ()


def test_render_shows_each_phase():
    from rich.console import Console

    from srtscope.cli.render import phases_table

    steps, budget = _tables([("extend", 40, 30, {"prep": 8}), ("decode", 10, 4, {"scheduler": 5})])
    doc = {"phases": [p.to_json() for p in phase_split(steps, budget, 10.0)]}
    console = Console(width=120, record=True)
    console.print(phases_table(doc))
    text = console.export_text()
    assert "prefill" in text and "decode" in text and "prep 8.00 ms" in text and "scheduler 5.00 ms" in text
    assert phases_table({"phases": []}) is None and phases_table({}) is None
