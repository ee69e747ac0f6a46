"""Fast views of the Timeline's string columns (categoricals on the big tables) as integer codes.

``str_codes`` is ``pd.Categorical(col.astype(str))`` without materialising one Python string per
row: on a categorical column only its few categories are turned into strings and re-sorted.
``isin`` compares codes, not strings, on categoricals; ``sum_by`` sums integers per code exactly;
``distinct_keys`` / ``group_rows``: the few distinct keys of integer key columns, and their rows.
"""
from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd


def str_codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes per row, sorted distinct strings) — as ``pd.Categorical(col.astype(str))``. The codes
    are the narrowest integers that hold them (int8 to int64): cast before arithmetic on them."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        cat = pd.Categorical(col.astype(str))
        return np.asarray(cat.codes, dtype=np.int64), np.asarray(cat.categories, dtype=object)
    raw = np.asarray(col.cat.codes)                                # int8/16/32, -1 for NaN
    labels = [str(c) for c in col.cat.categories] + ["nan"]      # astype(str) turns NaN into 'nan'
    n = len(labels) - 1
    if raw.dtype.itemsize <= 2:
        # NOTE: counted on the codes seen unsigned (-1 -> the top value): no int64 copy of every row
        counts = np.bincount(raw.view(f"u{raw.dtype.itemsize}"), minlength=1 << (8 * raw.dtype.itemsize))
        used = np.r_[counts[:n], counts[-1]] > 0                    # observed values only
        codes = raw                                                 # lut[-1]: the 'nan' label
    else:
        codes = np.where(raw < 0, n, raw)                          # int32 (pandas' widest codes): 4 bytes a row
        used = np.bincount(codes, minlength=len(labels)) > 0
    cats, remap = np.unique(np.asarray(labels, dtype=object)[used], return_inverse=True)
    lut = np.full(len(labels), -1, dtype=np.int64 if len(labels) > np.iinfo(np.int32).max else np.int32)
    lut[used] = np.asarray(remap, dtype=np.int64).reshape(-1)
    return lut[codes], np.asarray(cats, dtype=object)


#: rows a chunk of ``time_by_name``: its temporaries stay a few MiB whatever the table's size
CHUNK_ROWS = 1 << 20


def time_by_name(col: pd.Series, masks: list[np.ndarray], start: np.ndarray | None = None,
                 end: np.ndarray | None = None) -> list[dict[str, list[int]]]:
    """Per mask, per distinct string of the rows of ``col`` where it holds (as ``str_codes`` names
    them): [rows, exact summed ``end - start``, ns: the first mask's only, 0 for the others and
    without them]. Names with no row are left out.
    NOTE: a chunk of rows at a time, each row's name coded once for all the masks, a categorical on
    its own small codes: no int64 copy of a whole column (a 3 GB export's 25 M kernels: 200 MB each)."""
    outs: list[dict[str, list[int]]] = [{} for _ in masks]
    sel = np.logical_or.reduce(masks) if len(masks) > 1 else masks[0]
    cat = isinstance(col.dtype, pd.CategoricalDtype)
    raw_all = np.asarray(col.cat.codes) if cat else None
    labels_all = [str(c) for c in col.cat.categories] + ["nan"] if cat else []
    for i in range(0, len(col), CHUNK_ROWS):
        j = i + CHUNK_ROWS
        s = sel[i:j]
        if not s.any():
            continue
        if raw_all is not None:
            raw = raw_all[i:j][s]                                       # int8/16/32, -1 for NaN
            keys, labels = np.where(raw < 0, len(labels_all) - 1, raw), labels_all
        else:
            keys, names = str_codes(col.iloc[i:j][s])
            labels = [str(x) for x in names]
        dur = end[i:j][s] - start[i:j][s] if start is not None and end is not None else None   # all masks' rows
        for n, (out, mask) in enumerate(zip(outs, masks)):
            m = mask[i:j][s]
            k = keys[m]
            cnt = np.bincount(k, minlength=len(labels))
            tot = sum_by(k, dur[m], len(labels)) if dur is not None and n == 0 else np.zeros(len(labels), np.int64)
            for x in np.flatnonzero(cnt):
                acc = out.setdefault(labels[x], [0, 0])               # two categories, one string: added
                acc[0] += int(cnt[x])
                acc[1] += int(tot[x])
    return outs


def str_map(col: pd.Series, fn, dtype) -> np.ndarray:
    """``fn(str(value))`` per row, evaluated once per distinct value (NaN as 'nan', like ``str_codes``).

    NOTE: on a categorical, a lookup by its own codes: no per-row string and no re-coding.
    """
    if isinstance(col.dtype, pd.CategoricalDtype):
        lut = np.array([fn(str(c)) for c in col.cat.categories] + [fn("nan")], dtype=dtype)
        return lut[np.asarray(col.cat.codes)]                       # code -1 (NaN): the last entry
    codes, names = str_codes(col)
    return np.array([fn(str(x)) for x in names], dtype=dtype)[codes] if len(names) else np.zeros(0, dtype)


def isin(col: pd.Series, values) -> np.ndarray:
    """Boolean mask of the rows whose value is one of ``values`` (str or str-Enum values)."""
    values = [getattr(v, "value", v) for v in values]
    if isinstance(col.dtype, pd.CategoricalDtype):
        hit = np.asarray([c in values for c in col.cat.categories] + [False], dtype=bool)
        return hit[np.asarray(col.cat.codes)]
    if isinstance(col.dtype, pd.StringDtype):      # str values only: pandas (Arrow) compares, no object array
        return np.asarray(col.isin(values), dtype=bool)
    return np.isin(col.to_numpy(), np.asarray(values, dtype=object))


def sum_by(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sum of non-negative ``values`` per code in ``0..n-1``.

    NOTE: ``bincount``'s float sums are exact while every partial sum stays below 2**53 (checked
    from max * count); beyond that ``np.add.at`` in integers.
    """
    v = np.asarray(values, dtype=np.int64)
    if not len(v):
        return np.zeros(n, np.int64)
    if v.min() >= 0 and int(v.max()) * len(v) < 2 ** 53:
        return np.bincount(codes, weights=v, minlength=n).astype(np.int64)
    out = np.zeros(n, np.int64)
    np.add.at(out, codes, v)
    return out


def _packed(arrs: list[np.ndarray]) -> tuple[np.ndarray, list[int], list[int], int] | None:
    """(one int64 code per row, each column's lowest value, each column's span, code space) of
    integer key columns, or None where the code space is large (over 4 M)."""
    lo = [int(a.min()) for a in arrs]
    span = [int(a.max()) - m + 1 for a, m in zip(arrs, lo)]
    size = int(np.prod(span, dtype=object))
    if size > 1 << 22:
        return None
    key = np.zeros(len(arrs[0]), np.int64)
    for a, m, sp in zip(arrs, lo, span):
        key *= sp
        key += a - m
    return key, lo, span, size


def _unpack(k: int, lo: list[int], span: list[int]) -> tuple[int, ...]:
    vals = []
    for m, sp in zip(reversed(lo), reversed(span)):
        k, r = divmod(k, sp)
        vals.append(r + m)
    return tuple(reversed(vals))


def distinct_keys(*cols: np.ndarray) -> list[tuple[int, ...]]:
    """The distinct rows of integer key columns (equal lengths, at least one row), sorted: the few
    (rank, device) or (rank, pid, tid) keys of millions of rows, counted, not sorted row by row."""
    arrs = [np.asarray(c, dtype=np.int64) for c in cols]
    if all((a == a[0]).all() for a in arrs):
        return [tuple(int(a[0]) for a in arrs)]
    packed = _packed(arrs)
    if packed is None:
        return sorted({tuple(int(x) for x in row) for row in np.unique(np.stack(arrs, axis=1), axis=0)})
    key, lo, span, size = packed
    return [_unpack(k, lo, span) for k in np.flatnonzero(np.bincount(key, minlength=size)).tolist()]


def group_rows(df: pd.DataFrame, cols: list[str]) -> dict[tuple, np.ndarray]:
    """``df.groupby(cols).indices`` for integer key columns: rows (ascending) per key, keys sorted.

    NOTE: keys packed into one small code and ordered by a radix sort (int16, linear) — pandas
    hashes millions of rows for the few (rank, device, stream) keys of a device table; falls back
    to pandas when the packed key space is large.
    """
    if len(df) == 0:
        return {}
    packed = _packed([np.asarray(df[c].to_numpy(), dtype=np.int64) for c in cols])
    if packed is None:
        return cast("dict[tuple, np.ndarray]", df.groupby(cols).indices)   # keys: tuples of ints
    key, lo, span, size = packed
    counts = np.bincount(key, minlength=size)
    used = np.flatnonzero(counts)
    if len(used) > np.iinfo(np.int16).max:
        return cast("dict[tuple, np.ndarray]", df.groupby(cols).indices)   # keys: tuples of ints
    lut = np.zeros(size, np.int16)
    lut[used] = np.arange(len(used), dtype=np.int16)
    order = np.argsort(lut[key], kind="stable")
    ends = np.cumsum(counts[used])
    return {_unpack(k, lo, span): order[ends[j] - counts[used[j]]:ends[j]] for j, k in enumerate(used.tolist())}


def rows_where(df: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """``df[keep].reset_index(drop=True)``; a slice (no copy of any column) where the kept rows are
    one run, as a time cut of start-sorted rows mostly is."""
    n = int(np.count_nonzero(keep))
    if n == len(df):
        return df.reset_index(drop=True) if n and not _plain(df.index) else df
    i0 = int(np.argmax(keep)) if n else 0
    if keep[i0:i0 + n].all():
        return df.iloc[i0:i0 + n].reset_index(drop=True)
    return df[keep].reset_index(drop=True)


def _plain(index: pd.Index) -> bool:
    return isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
