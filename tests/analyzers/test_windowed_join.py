"""The reduction joins the windows' tables as ``pd.concat`` would, releasing each window's as it goes
(``reduce._joined``): the whole trace's bubble pieces are not held twice."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.pipeline.reduce import _joined


@dataclass
class _Part:
    pieces: pd.DataFrame


def _pieces(n: int, start: int, stage: bool = True) -> pd.DataFrame:
    cols: dict = {"bubble": np.arange(n, dtype=np.int64), "start_ns": start + 10 * np.arange(n, dtype=np.int64)}
    if stage:
        cols["top_stage"] = pd.array([f"sched.schedule{i % 2}" for i in range(n)], dtype="str")
    cols["end_ns"] = cols["start_ns"] + 5
    return pd.DataFrame(cols)


@pytest.mark.parametrize("case, tables", [
    ("windows alike: int64 columns in one block, the text column as it was",
     [_pieces(3, 0), _pieces(0, 30), _pieces(4, 40)]),
    ("one window", [_pieces(5, 0)]),
    ("a window whose columns differ: joined by pd.concat", [_pieces(2, 0), _pieces(2, 20, stage=False)]),
    ("no columns", [pd.DataFrame(), pd.DataFrame()]),
])
def test_joined_is_concat_and_releases_each_window(case: str, tables: list[pd.DataFrame]) -> None:
    want = pd.concat([t.copy() for t in tables], ignore_index=True)
    parts = [_Part(t) for t in tables]
    del tables
    got = _joined(parts, "pieces")             # type: ignore[arg-type]
    pd.testing.assert_frame_equal(got, want, check_index_type=True, obj=case)
    for p in parts:                              # each window's table released: empty, no view of it kept
        assert len(p.pieces) == 0, case
        assert all(b.values.base is None for b in p.pieces._mgr.blocks if isinstance(b.values, np.ndarray)), case
