"""The steps near a stretch of time: each lookup holds every step that matters, checked against all
steps on random tables (overlapping steps, shared starts, zero-length steps, two ranks)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.analyses.bubbles import bubble_pieces as _pieces
from srtscope.analyzers.analyses.step_index import StepIndex


def _steps(rng: np.random.Generator, n: int, overlap: bool) -> pd.DataFrame:
    start = np.sort(rng.integers(0, 400, n))
    if rng.random() < 0.5:
        start[1:3] = start[0]                                      # shared starts
    length = rng.integers(0, 60 if overlap else 8, n)           # 0: a zero-length step
    return pd.DataFrame({"rank": rng.integers(0, 2, n), "start_ns": start, "end_ns": start + length,
                         "step": np.arange(n)})


@pytest.mark.parametrize("overlap", [False, True])
def test_lookups_hold_every_step_that_matters(overlap: bool) -> None:
    rng = np.random.default_rng(5 + overlap)
    for _ in range(300):
        st = _steps(rng, int(rng.integers(1, 30)), overlap)
        idx = StepIndex(st)
        s, e, r = (st[c].to_numpy() for c in ("start_ns", "end_ns", "rank"))
        lo = int(rng.integers(-10, 420))
        hi = lo + int(rng.integers(0, 80))
        for rank in (0, 1, 7):
            mine = r == rank
            want = np.flatnonzero(mine & (s >= lo) & (s < hi))
            assert idx.starting(rank, lo, hi).tolist() == want.tolist()
            near = set(idx.near(rank, lo, hi).tolist())
            assert set(np.flatnonzero(mine & (s <= hi) & (e > lo)).tolist()) <= near
            held = idx.holding(rank, lo, hi)
            assert (np.diff(held) > 0).all()
            assert set(np.flatnonzero(mine & (s < hi) & (e > lo)).tolist()) <= set(held.tolist())


@pytest.mark.parametrize("overlap", [False, True])
def test_pieces_over_the_held_steps_equal_pieces_over_all(overlap: bool) -> None:
    """What a window gives ``_pieces``: the held steps only, with their labels; the same pieces."""
    rng = np.random.default_rng(11 + overlap)
    for _ in range(300):
        st = _steps(rng, int(rng.integers(1, 30)), overlap)
        nb = int(rng.integers(1, 6))
        bs = rng.integers(0, 420, nb)
        bub = pd.DataFrame({"rank": rng.integers(0, 2, nb), "device": 0, "pid": 1, "tid": 2,
                            "start_ns": bs, "end_ns": bs + rng.integers(1, 50, nb), "queued_ns": -1})
        idx = StepIndex(st)
        held = [idx.holding(int(k), int(g["start_ns"].min()), int(g["end_ns"].max()))
                for k, g in bub.groupby("rank")]
        got = _pieces(bub, st.iloc[np.sort(np.concatenate(held))])
        pd.testing.assert_frame_equal(got, _pieces(bub, st))
