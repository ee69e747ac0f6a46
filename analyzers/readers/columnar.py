"""Columnar helpers for the SQLite reader: integer columns out of SQLite without a Python object
per row, categoricals, in-place sorting, vectorised push/pop nesting depth."""
from __future__ import annotations

import sqlite3
import warnings

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

CHUNK = 1 << 20  # rows per aggregate query


def fetch_ints(con: sqlite3.Connection, table: str, exprs: list[str],
                where: str = "") -> list[np.ndarray]:
    """Integer columns ``exprs`` of ``table`` rows matching ``where`` -> one int64 array each.

    NOTE: rows are aggregated in SQLite (``group_concat`` over chunks of rows in rowid order)
    and parsed by numpy: several times faster than a Python tuple per row, and SQLite runs
    without the GIL. The expressions must not be NULL (group_concat skips NULLs: COALESCE them);
    a non-integer value makes the parse short, which is reported as a malformed table. All
    columns of one chunk come from the same aggregate pass, so their rows line up. Chunks are
    ``rowid > last LIMIT n``, so sparse or huge rowids in a damaged file cannot make it spin.
    """
    inner = ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
    sel = ", ".join(f"group_concat(c{i})" for i in range(len(exprs)))
    cond = f" AND ({where})" if where else ""
    q = (f"SELECT {sel}, MAX(rid), COUNT(*) FROM (SELECT rowid AS rid, {inner} FROM {table} "
         f"WHERE rowid > ?{cond} ORDER BY rowid LIMIT {CHUNK})")
    parts: list[list[np.ndarray]] = [[] for _ in exprs]
    last = -(1 << 63)
    while True:
        row = con.execute(q, (last,)).fetchone()
        if row is None or not row[-1]:
            break
        n, last = int(row[-1]), int(row[-2])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cols = [np.fromstring(v, dtype=np.int64, sep=",") if v else np.zeros(0, np.int64)
                    for v in row[:-2]]
        if any(len(c) != n for c in cols):
            raise sqlite3.DatabaseError(f"malformed values in {table}")
        for acc, c in zip(parts, cols):
            acc.append(c)
        if n < CHUNK:
            break
    out = []
    for i in range(len(parts)):        # column by column, dropping the chunks as we go
        out.append(np.concatenate(parts[i]) if parts[i] else np.zeros(0, np.int64))
        parts[i] = []
    return out


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
