"""Range totals: per range name, with instance numbers written ``N`` (``ProfilerStep#12`` ->
``ProfilerStep#N``, ``layer_3`` -> ``layer_N``), how often it was open and for how long in all —
the host annotations only (NVTX, record_function, stage ranges; not operators nor Python frames).
``compare`` sets them side by side per step."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from srtscope.analyzers.model.columns import str_codes, sum_by
from srtscope.analyzers.model.timeline import Timeline

TOP_RANGES = 20
_INSTANCE = re.compile(r"(?<![A-Za-z0-9])\d+(?![A-Za-z0-9])")
COLUMNS = ("name", "count", "total_ns", "mean_ns")


def normalise_instance(name: str) -> str:
    """``name`` with its standalone numbers (instance, step, layer numbers) written ``N``."""
    return _INSTANCE.sub("N", name)


def top_ranges(tl: Timeline, n: int = TOP_RANGES) -> pd.DataFrame:
    """The ``n`` normalised host range names with the most summed time (nested ranges each count
    their own span). Columns ``COLUMNS``, most time first."""
    rg = tl.host_ranges
    if not len(rg) or n <= 0:
        return pd.DataFrame({c: pd.Series([], dtype=object if c == "name" else np.int64) for c in COLUMNS})
    # NOTE: normalised once per distinct name, not per range (hundreds of thousands per GB)
    raw, raw_names = str_codes(rg["name"])
    norm = [normalise_instance(str(x)) for x in raw_names]
    uniq = np.array(sorted(set(norm)), dtype=object)
    lut = np.searchsorted(uniq, np.array(norm, dtype=object)) if len(norm) else np.zeros(0, np.int64)
    codes = lut[raw]
    dur = rg["end_ns"].to_numpy(np.int64) - rg["start_ns"].to_numpy(np.int64)
    count = np.bincount(codes, minlength=len(uniq))
    total = sum_by(codes, dur, len(uniq))
    order = np.lexsort((uniq.astype(str), -total))[:n]
    order = order[count[order] > 0]
    return pd.DataFrame({"name": uniq[order].astype(object), "count": count[order].astype(np.int64),
                         "total_ns": total[order].astype(np.int64),
                         "mean_ns": (total[order] // np.maximum(count[order], 1)).astype(np.int64)})
