"""Integer key columns: their distinct keys and rows per key, against pandas' own grouping."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.model.columns import distinct_keys, group_rows

_RNG = np.random.default_rng(3)


@pytest.mark.parametrize("case, cols", [
    ("one key over every row: one process, one device", [np.full(50, 2), np.full(50, 7)]),
    ("two devices interleaved", [np.zeros(40, np.int64), np.tile([0, 1], 20)]),
    ("threads of two processes, negative ids", [_RNG.integers(-3, 3, 500), _RNG.integers(0, 4, 500),
                                                _RNG.integers(100, 104, 500)]),
    ("ids far apart: a key space too large to pack", [_RNG.choice([1, 10**12], 300),
                                                      _RNG.choice([0, 5 * 10**9], 300)]),
])
def test_distinct_keys_and_group_rows_match_pandas(case, cols):
    df = pd.DataFrame({f"c{i}": c for i, c in enumerate(cols)})
    names = list(df.columns)
    want = {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): v
            for k, v in df.groupby(names).indices.items()}
    assert distinct_keys(*cols) == sorted(want), case
    got = group_rows(df, names)
    assert list(got) == sorted(want), case
    for k, idx in got.items():
        assert np.asarray(idx).tolist() == np.asarray(want[tuple(int(x) for x in k)]).tolist(), case
