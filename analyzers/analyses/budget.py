"""Step budget: each step's wall time = device compute + exposed comm + bubbles by class + other.

Per step, on its rank's primary device (the busiest one): compute is the union of non-collective
activity inside the step, exposed comm the collective time outside it, bubbles the attributed bubble
pieces that fall in the step, and ``other`` the rest (gaps under the bubble threshold, time before
the device's first or after its last activity). The parts add up to the wall time exactly.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.comm import split_compute
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.results import BUBBLE_CLASSES, BudgetResult
from srtscope.analyzers.model.timeline import Timeline

BUDGET_COLUMNS = ("step", "rank", "device", "wall_ns", "compute_ns", "exposed_comm_ns",
                  *(f"{c}_ns" for c in BUBBLE_CLASSES), "other_ns")


def primary_devices(by_device: pd.DataFrame) -> dict[int, int]:
    """Per rank, the device with the most busy time."""
    if len(by_device) == 0:
        return {}
    top = by_device.sort_values("busy_ns").drop_duplicates("rank", keep="last")
    return {int(r): int(d) for r, d in zip(top["rank"], top["device"])}


def step_budget(tl: Timeline, steps: pd.DataFrame, pieces: pd.DataFrame, comm: np.ndarray,
                primary: dict[int, int], sets: DeviceSets | None = None) -> BudgetResult:
    """``pieces``: attributed bubble pieces with rank, device, step_row (row of ``steps`` or -1), <class>_ns.
    ``sets``: the trace's device sets for this ``comm`` mask (built when None)."""
    n = len(steps)
    out = {c: np.zeros(n, np.int64) for c in BUDGET_COLUMNS if c not in ("step", "rank")}
    out["device"] = np.full(n, -1, np.int64)
    sets = DeviceSets.of(tl, sets, comm)
    for rank, idx in (steps.groupby("rank").indices.items() if n else []):
        if rank not in primary:
            continue
        d = primary[rank]
        out["device"][idx] = d
        key = (int(rank), d)
        stand_in = bool(sets.in_group(key, sets.mask("comm") & sets.mask("forward")).any()) \
            if key in sets.keys else False
        k, c = split_compute(sets.union(key, "noncomm"), sets.union(key, "comm"), stand_in)
        s, e = steps["start_ns"].to_numpy()[idx], steps["end_ns"].to_numpy()[idx]
        out["compute_ns"][idx] = iv.overlap(k, s, e)
        out["exposed_comm_ns"][idx] = iv.overlap(c, s, e)
    if n and len(pieces):
        p = pieces[(pieces["step_row"] >= 0)]
        prim = p["rank"].map(primary).fillna(-2).to_numpy(np.int64)
        p = p[p["device"].to_numpy() == prim]
        for cl in BUBBLE_CLASSES:
            np.add.at(out[f"{cl}_ns"], p["step_row"].to_numpy(), p[f"{cl}_ns"].to_numpy())
    wall = steps["wall_ns"].to_numpy() if n else np.zeros(0, np.int64)
    out["wall_ns"] = wall
    used = out["compute_ns"] + out["exposed_comm_ns"] + sum(out[f"{c}_ns"] for c in BUBBLE_CLASSES)
    out["other_ns"] = wall - used
    table = pd.DataFrame({"step": steps["step"].to_numpy() if n else np.zeros(0, np.int64),
                          "rank": steps["rank"].to_numpy() if n else np.zeros(0, np.int64), **out})
    return budget_result(table[list(BUDGET_COLUMNS)])


def budget_result(table: pd.DataFrame) -> BudgetResult:
    """The budget of a step table (``BUDGET_COLUMNS``, one row per step): its totals."""
    def total(c: str) -> int:
        return int(table[c].sum())
    return BudgetResult(steps=len(table), wall_ns=total("wall_ns"), compute_ns=total("compute_ns"),
                        exposed_comm_ns=total("exposed_comm_ns"),
                        bubbles_ns={c: total(f"{c}_ns") for c in BUBBLE_CLASSES},
                        other_ns=total("other_ns"), table=table)
