"""The steps near a stretch of time, found by binary search: a chunk or a window of a large trace
touches a few of its hundreds of thousands of steps, and asking all of them each time grows with the
square of the trace.

``StepIndex(steps)``: per rank its steps in start order (stable: ties keep the table's order) with
the running latest end. The lookups give row positions of ``steps``, ascending, each a superset of
the steps that matter (those left out hold none of the asked time).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


class StepIndex:
    """Row positions of a step table's steps by rank and time (module doc)."""

    def __init__(self, steps: pd.DataFrame) -> None:
        self.ws = steps["start_ns"].to_numpy(np.int64)
        self.we = steps["end_ns"].to_numpy(np.int64)
        wr = steps["rank"].to_numpy(np.int64)
        self.ranks = [int(r) for r in np.unique(wr)]
        self._of: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for rank in self.ranks:
            idx = np.flatnonzero(wr == rank)
            idx = idx[np.argsort(self.ws[idx], kind="stable")]
            self._of[rank] = (idx, self.ws[idx], np.maximum.accumulate(self.we[idx]))

    def near(self, rank: int, lo: int, hi: int) -> np.ndarray:
        """Steps of ``rank`` that may reach ``[lo, hi]`` (start <= hi, end > lo), in start order."""
        got = self._of.get(int(rank))
        if got is None:
            return np.zeros(0, np.int64)
        idx, s, reach = got
        i0 = int(np.searchsorted(reach, lo, side="right"))
        i1 = int(np.searchsorted(s, hi, side="right"))
        return idx[i0:max(i0, i1)]

    def starting(self, rank: int, lo: int, hi: int) -> np.ndarray:
        """Steps of ``rank`` starting in ``[lo, hi)``, ascending."""
        got = self._of.get(int(rank))
        if got is None:
            return np.zeros(0, np.int64)
        idx, s, _ = got
        return np.sort(idx[int(np.searchsorted(s, lo, side="left")):int(np.searchsorted(s, hi, side="left"))])

    def holding(self, rank: int, lo: int, hi: int) -> np.ndarray:
        """Steps of ``rank`` that cut or hold time in ``[lo, hi)``, ascending: from the first whose
        running end passes ``lo`` to the last starting before ``hi``. NOTE: the steps before are
        whole before ``lo``, so a time in it that falls to none of these (``bubbles.bubble_pieces``
        asks the last step starting at or before it) falls to none of all."""
        got = self._of.get(int(rank))
        if got is None:
            return np.zeros(0, np.int64)
        idx, s, reach = got
        first = int(np.searchsorted(s, lo, side="left"))       # the first step starting in it
        i0 = min(first, int(np.searchsorted(reach, lo, side="right")))
        return np.sort(idx[i0:max(i0, int(np.searchsorted(s, hi, side="left")))])
