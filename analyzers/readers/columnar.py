"""Columnar helpers for the SQLite reader: integer columns out of SQLite into Arrow (ADBC) without
a Python object per row, categoricals, in-place sorting, vectorised push/pop nesting depth."""
from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from srtscope.analyzers.readers.sqlite_pages import PagedFile, Unpaged, enabled

BATCH_ROWS = 1 << 16  # rows per Arrow record batch of a scan
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


def connect_arrow(path: Path) -> Any:
    """Read-only, immutable ADBC connection to an SQLite file (nothing locked or written beside it).

    NOTE: ADBC steps SQLite and fills Arrow buffers in C with the GIL released: no Python object
    per row or value, and two connections read two tables on two cores."""
    import adbc_driver_sqlite.dbapi as adbc_sqlite

    return adbc_sqlite.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", autocommit=True)


def arrow_query(con: Any, sql: str, what: str) -> Iterator[Any]:
    """Record batches of ``sql`` (``BATCH_ROWS`` rows each) on an ADBC connection.

    Errors of the driver (a value of another type than the column's first rows, a damaged page, an
    unreadable file) come out as ``sqlite3.DatabaseError`` naming ``what``.
    NOTE: ADBC infers a column's type from the first batch; a later value of another type is an
    error, never a silent conversion."""
    from adbc_driver_manager import Error as AdbcError

    try:
        cur = con.cursor()
        try:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cur.execute(sql)
            reader = cur.fetch_record_batch()
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                yield batch
        finally:
            cur.close()
    except (AdbcError, OSError) as exc:
        msg = str(exc).replace("[SQLite] ", "").splitlines()[0] if str(exc) else type(exc).__name__
        raise sqlite3.DatabaseError(f"malformed values in {what}: {msg}") from exc


def _ints(batch: Any, i: int, table: str) -> np.ndarray:
    """Column ``i`` of a batch as int64 (a view of the batch's buffer); anything else is malformed."""
    col = batch.column(i)
    if col.null_count or str(col.type) != "int64":
        what = "NULL" if col.null_count else str(col.type)
        raise sqlite3.DatabaseError(f"malformed values in {table}: {what} where integers belong")
    return col.to_numpy(zero_copy_only=True)


def rowid_bounds(con: Any, table: str) -> tuple[int | None, int | None]:
    """(lowest, highest) rowid of ``table`` through an ADBC or sqlite3 connection; None for an
    empty table.

    NOTE: two subqueries, each answered from the b-tree's edge; ``SELECT MIN(rowid), MAX(rowid)``
    in one query scans the whole table instead (1.2 s on 8.7 M kernel rows, against 3 ms)."""
    sql = f"SELECT (SELECT MIN(rowid) FROM {table}), (SELECT MAX(rowid) FROM {table})"
    if isinstance(con, sqlite3.Connection):
        lo, hi = con.execute(sql).fetchone()
    else:
        batch = next(arrow_query(con, sql, table), None)
        lo, hi = (batch.column(0)[0].as_py(), batch.column(1)[0].as_py()) \
            if batch is not None and batch.num_rows else (None, None)
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


class _Columns:
    """int64 columns filled batch by batch into arrays allocated once (no concatenation copy at the
    end); grown by doubling only when more rows come than were announced."""

    def __init__(self, k: int, rows: int) -> None:
        self.cols = [np.empty(rows, np.int64) for _ in range(k)]
        self.n = 0

    def add(self, vals: list[np.ndarray]) -> None:
        m = len(vals[0]) if vals else 0
        if self.cols and self.n + m > len(self.cols[0]):
            cap = max(2 * len(self.cols[0]), self.n + m)
            for i, c in enumerate(self.cols):
                grown = np.empty(cap, np.int64)
                grown[:self.n] = c[:self.n]
                self.cols[i] = grown
        for c, v in zip(self.cols, vals):
            c[self.n:self.n + m] = v
        self.n += m

    def take(self, i: int) -> np.ndarray:
        """Column ``i`` trimmed to the rows filled (a copy when most of it would be slack)."""
        c, self.cols[i] = self.cols[i], np.zeros(0, np.int64)
        return c if len(c) == self.n else (c[:self.n].copy() if 4 * self.n < 3 * len(c) else c[:self.n])


#: ``keep(columns)`` of ``fetch_ints``: the batch's columns, one per expression, literals included;
#: returns the rows to keep (bool mask), or None for all of them.
Keep = Callable[[list[np.ndarray]], "np.ndarray | None"]


def fetch_ints(con: Any, table: str, exprs: list[str], where: str = "",
               span: list[int] | None = None, max_rows: int = 1 << 24,
               keep: Keep | None = None, expect_rows: int | None = None,
               rowids: tuple[int, int] | None = None, pages: PagedFile | None = None) -> list[np.ndarray]:
    """Integer columns ``exprs`` of ``table`` rows matching ``where`` -> one int64 array each,
    in rowid order, read through the ADBC connection ``con`` (``connect_arrow``).

    A NULL or non-integer value is a malformed table (``sqlite3.DatabaseError``): COALESCE the
    expressions that may be NULL. Integer literals (``"-1"``) are not asked of SQLite: numpy fills
    them. ``where`` is evaluated as a column, so every row of the table is seen: ``span`` gets
    [rows in the table, lowest rowid, highest rowid] (nothing for an empty table) and progress
    (``report_scans``) advances by rows (as many as rowids in an undamaged table). The columns are
    allocated for the table's rowid span, at most ``max_rows`` (a damaged file's huge rowids cannot
    make it allocate more) or ``expect_rows`` when given (grown when more come).
    ``keep``: sees every batch's rows (after ``where``) and says which to keep: a time window's
    read sees the whole table, holds only its rows (``readers/nsys_window.py``). ``rowids``
    (lowest, highest; inclusive): only the rows in that range, a seek in the table's b-tree (a
    chunk of a table read in pieces); ``span`` then that range's. ``pages``: the file opened for
    page reads (``sqlite_pages``): a big table is read from its pages, as far as they can answer,
    the rest through SQLite.
    """
    const = {i: int(e) for i, e in enumerate(exprs) if _INT_LITERAL.fullmatch(e.strip())}
    if len(const) == len(exprs):
        const = {}
    asked = [e for i, e in enumerate(exprs) if i not in const]
    lo, hi = rowid_bounds(con, table) if rowids is None else (int(rowids[0]), int(rowids[1]))
    expect = 0 if lo is None or hi is None else max(0, min(hi - lo + 1, max_rows))
    if expect_rows is not None:
        expect = min(expect, max(0, expect_rows))
    cols = _Columns(len(asked), expect)
    rows = 0
    for seen, vals in _batches(con, table, asked, where, lo, hi, rowids is not None, pages):
        rows += seen
        tick = _ON_SCAN[0]
        if tick is not None:
            tick(seen)
        if keep is not None:
            vals = _kept(vals, exprs, const, keep)
        cols.add(vals)
    if span is not None and rows and lo is not None and hi is not None:
        span[:] = [rows, lo, hi]
    n = cols.n
    out, k = [], 0
    for i in range(len(exprs)):        # column by column
        if i in const:
            out.append(np.full(n, const[i], np.int64))
            continue
        out.append(cols.take(k))
        k += 1
    return out


def _batches(con: Any, table: str, asked: list[str], where: str, lo: int | None, hi: int | None,
             ranged: bool, pages: PagedFile | None) -> Iterator[tuple[int, list[np.ndarray]]]:
    """(rows seen, ``asked`` of the rows ``where`` keeps) per batch in rowid order: from ``pages``
    while they answer (``sqlite_pages.enabled`` for the table's size), then through SQLite from
    the first rowid not yet given."""
    resume = lo
    if pages is not None and lo is not None and hi is not None and enabled(pages.table_bytes(table)):
        try:
            for seen, vals, last in pages.batches(table, asked, where, lo, hi):
                resume = last + 1
                yield seen, vals
            return
        except Unpaged:
            pass
    cond = [f"COALESCE(({where}), 0) != 0"] if where else []
    first = 1 if where else 0
    # NOTE: rowid itself is not selected (~10% of a scan): the bounds come from the b-tree's edges
    # and every row is counted, so a table whose rows do not fill its rowid span still shows
    rng = f" WHERE rowid BETWEEN {resume} AND {hi}" if ranged or resume != lo else ""
    sql = f"SELECT {', '.join(cond + asked)} FROM {table}{rng} ORDER BY rowid"
    # NOTE: rowids are unique, so [resume, hi] holds at most that many rows: a damaged b-tree whose
    # child points back at an ancestor makes SQLite's cursor read subtrees again, without end in
    # memory; it stops here, at the rows the table can hold
    most = None if resume is None or hi is None else max(0, hi - resume + 1)
    rows = 0
    for batch in arrow_query(con, sql, table):
        if not batch.num_rows:
            continue
        seen = batch.num_rows
        rows += seen
        if most is not None and rows > most:
            raise sqlite3.DatabaseError(f"{table} gave more rows than its rowids {resume}..{hi} can hold "
                                        "(its b-tree visits pages twice)")
        if where:   # rows outside ``where`` may hold anything (e.g. an NVTX mark's NULL end)
            keep_col = _ints(batch, 0, table)
            if not keep_col.all():
                batch = batch.filter(keep_col.astype(bool))
        yield seen, [_ints(batch, first + k, table) for k in range(len(asked))]


def _kept(vals: list[np.ndarray], exprs: list[str], const: dict[int, int], keep: Keep) -> list[np.ndarray]:
    """The batch's asked columns ``vals``, cut to the rows ``keep`` chooses (it sees literals too)."""
    n = len(vals[0]) if vals else 0
    it = iter(vals)
    full = [np.full(n, const[i], np.int64) if i in const else next(it) for i in range(len(exprs))]
    mask = keep(full)
    if mask is None or mask.all():
        return vals
    return [v[mask] for v in vals]


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
