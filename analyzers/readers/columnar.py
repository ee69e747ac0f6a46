"""Columnar helpers for the SQLite reader: integer columns out of SQLite without a Python object
per row, categoricals, in-place sorting, vectorised push/pop nesting depth."""
from __future__ import annotations

import re
import sqlite3
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

CHUNK = 1 << 19  # rows per aggregate query
_INT_LITERAL = re.compile(r"-?\d+")

#: Called with the number of rowids scanned after each chunk, from any reader thread (a progress
#: bar for big files); None when nobody listens. Set through ``report_scans``.
_ON_SCAN: list[Callable[[int], None] | None] = [None]


@contextmanager
def report_scans(callback: Callable[[int], None] | None) -> Iterator[None]:
    """Call ``callback(rowids)`` after each chunk that ``fetch_ints`` scans inside the block."""
    old, _ON_SCAN[0] = _ON_SCAN[0], callback
    try:
        yield
    finally:
        _ON_SCAN[0] = old


def _chunks(con: sqlite3.Connection, table: str, exprs: list[str], where: str,
            lo: int, hi: int, seen: list[int] | None = None) -> list[list[np.ndarray]]:
    """Per expression, the int64 chunks of the rows with ``lo <= rowid <= hi`` (rowid order);
    ``seen`` gets the number of rows in the range, matching ``where`` or not.

    NOTE: one plain rowid-range scan per chunk (no ordered, limited subquery to feed it: ~25%
    faster); after each chunk the next existing rowid is looked up, so sparse or huge rowids in a
    damaged file cannot make it spin.
    """
    # NOTE: the filter goes into the aggregates (FILTER clause), not the WHERE: the same speed, and
    # the rows of the range are counted too (a damaged file shows as rows missing from the span)
    cond = f" FILTER (WHERE {where})" if where else ""
    sel = ", ".join(f"group_concat({e}){cond}" for e in exprs)
    q = f"SELECT {sel}, COUNT(*){cond}, COUNT(*) FROM {table} WHERE rowid >= ? AND rowid <= ?"
    nxt = f"SELECT MIN(rowid) FROM {table} WHERE rowid > ?"
    parts: list[list[np.ndarray]] = [[] for _ in exprs]
    a = lo
    while a is not None and a <= hi:
        b = min(a + CHUNK - 1, hi)
        row = con.execute(q, (a, b)).fetchone()
        n = int(row[-2])
        if seen is not None:
            seen.append(int(row[-1]))
        if n:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cols = [np.fromstring(v, dtype=np.int64, sep=",") if v else np.zeros(0, np.int64)
                        for v in row[:-2]]
            if any(len(c) != n for c in cols):
                raise sqlite3.DatabaseError(f"malformed values in {table}")
            for acc, c in zip(parts, cols):
                acc.append(c)
        tick = _ON_SCAN[0]
        if tick is not None:
            tick(b - a + 1)
        if b >= hi:
            break
        a = con.execute(nxt, (b,)).fetchone()[0]
    return parts


def fetch_ints(con: sqlite3.Connection, table: str, exprs: list[str], where: str = "",
               second: Callable[[], sqlite3.Connection] | None = None,
               span: list[int] | None = None) -> list[np.ndarray]:
    """Integer columns ``exprs`` of ``table`` rows matching ``where`` -> one int64 array each.

    NOTE: rows are aggregated in SQLite (``group_concat`` over chunks of rows in rowid order)
    and parsed by numpy: several times faster than a Python tuple per row, and SQLite runs
    without the GIL. The expressions must not be NULL (group_concat skips NULLs: COALESCE them);
    a non-integer value makes the parse short, which is reported as a malformed table. All
    columns of one chunk come from the same aggregate pass, so their rows line up. Chunks are
    rowid ranges, in rowid order. Integer literals (``"-1"``) are not asked of SQLite: numpy fills
    them. ``second`` opens another connection: the upper half of a big table's rowids is then read
    on it in a thread, in parallel. ``span`` gets [rows in the table, lowest rowid, highest rowid]
    (nothing for an empty table).
    """
    const = {i: int(e) for i, e in enumerate(exprs) if _INT_LITERAL.fullmatch(e.strip())}
    if len(const) == len(exprs):
        const = {}
    asked = [e for i, e in enumerate(exprs) if i not in const]
    lo, hi = con.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {table}").fetchone()
    seen: list[int] = []
    if lo is None:
        parts: list[list[np.ndarray]] = [[] for _ in asked]
    elif second is None or hi - lo < 2 * CHUNK:
        parts = _chunks(con, table, asked, where, lo, hi, seen)
    else:
        mid = lo + (hi - lo) // 2
        with ThreadPoolExecutor(max_workers=1) as pool:
            upper = pool.submit(_chunks_on, second, table, asked, where, mid + 1, hi, seen)
            parts = _chunks(con, table, asked, where, lo, mid, seen)
            for acc, more in zip(parts, upper.result()):
                acc.extend(more)
    if span is not None and lo is not None:
        span[:] = [sum(seen), int(lo), int(hi)]
    n = sum(len(c) for c in parts[0]) if parts else 0
    out, k = [], 0
    for i in range(len(exprs)):        # column by column, dropping the chunks as we go
        if i in const:
            out.append(np.full(n, const[i], np.int64))
            continue
        out.append(np.concatenate(parts[k]) if parts[k] else np.zeros(0, np.int64))
        parts[k] = []
        k += 1
    return out


def _chunks_on(connect: Callable[[], sqlite3.Connection], table: str, exprs: list[str], where: str,
               lo: int, hi: int, seen: list[int] | None = None) -> list[list[np.ndarray]]:
    con = connect()
    try:
        return _chunks(con, table, exprs, where, lo, hi, seen)
    finally:
        con.close()


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) by hashing: faster than a sort for millions of rows, few distinct."""
    codes, uniq = pd.factorize(values, sort=False)
    return codes, np.asarray(uniq)


def cat_from_codes(codes: np.ndarray, labels: list[str]) -> pd.Categorical:
    """Categorical from codes into possibly repeated labels (merged)."""
    cats, remap = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
    return pd.Categorical.from_codes(remap.reshape(-1)[codes] if len(codes) else codes,
                                     categories=cats.tolist())


def nesting_depth(start: np.ndarray, end: np.ndarray, thread: np.ndarray,
                   nested: np.ndarray) -> np.ndarray:
    """Push/pop depth per thread (0 = outermost), vectorised; -1 where ``nested`` is False.

    depth(i) = ranges on i's thread opened before i (ties: longer first) and not closed by then."""
    depth = np.full(len(start), -1, dtype=np.int64)
    idx = np.flatnonzero(nested)
    if not len(idx):
        return depth
    s, e = start[idx], end[idx]
    _, g = np.unique(thread[idx], return_inverse=True)
    g = g.reshape(-1).astype(np.int64)
    t0 = int(min(s.min(), e.min()))
    span = int(max(s.max(), e.max())) - t0 + 1
    if span * (int(g.max()) + 1) >= 1 << 62:
        # keys per thread would overflow int64: times -> their ranks among all times (the same order
        # and ties; same-start ranges still sort longer first, as their ends keep their order)
        _, r = np.unique(np.r_[s, e], return_inverse=True)
        r = r.reshape(-1).astype(np.int64)
        s, e, t0, span = r[:len(s)], r[len(s):], 0, 2 * len(s) + 1
    ks, ke = g * span + (s - t0), g * span + (e - t0)
    order = np.lexsort((-(e - s), ks))            # by (thread, start), longer first on ties
    pos = np.empty(len(idx), np.int64)
    pos[order] = np.arange(len(idx))
    first = np.searchsorted(ks[order], g * span, side="left")
    opened = pos - first                           # ranges of the thread opened before i
    ke_sorted = np.sort(ke)
    closed = (np.searchsorted(ke_sorted, ks, side="right")
              - np.searchsorted(ke_sorted, g * span, side="left"))
    depth[idx] = np.maximum(opened - closed, 0)
    return depth


def sort_columns(cols: dict | None) -> dict | None:
    """Sort the columns by start time in place (one column at a time: low peak memory)."""
    if cols is None or not len(cols["start_ns"]):
        return cols
    s = cols["start_ns"]
    if len(s) > 1 and (s[1:] < s[:-1]).any():
        order = np.argsort(s, kind="stable")
        for k in list(cols):
            cols[k] = cols[k][order]
    return cols


def concat_sorted(parts: list[dict]) -> dict | None:
    """Concatenate device tables column by column (categoricals unioned), sorted by start."""
    if not parts:
        return None
    if len(parts) == 1:
        return sort_columns(parts[0])
    out: dict = {}
    for k in list(parts[0]):
        vals = [p.pop(k) for p in parts]
        if isinstance(vals[0], pd.Categorical):
            out[k] = union_categoricals(vals)
        else:
            out[k] = np.concatenate(vals)
        del vals
    return sort_columns(out)
