"""Integer columns of a big SQLite table read from the file's b-tree pages, not through SQLite.

SQLite answers a scan by stepping its virtual machine once per row and value: on an nsys kernel
table that is ~600 ns a row, the whole of a big export's reading cost. ``PagedFile`` walks the
table's b-tree itself (read-only ``pread``, never a memory map: what is read is not held) and
decodes each leaf page's rows in a compiled loop (``_sqlite_pages.c``, GIL released: ~100 ns a
row). What comes out is what ``SELECT ... ORDER BY rowid`` gives, value for value.

Only what the loop covers is read this way; anything else raises ``Unpaged`` and the caller reads
through SQLite from the first row not yet delivered, so SQLite's own answer (or error) stands:
expressions other than a column, ``COALESCE(column, integer)`` or an integer, a ``where`` other
than ``column IN (integers)``, a rowid-alias, generated or WITHOUT ROWID table, a row on overflow
pages or shorter than its table, a float, text or blob where an integer is asked, a NULL kept where
no COALESCE is, rowids out of order, a page that is not what the tree says.

``SRTSCOPE_SQLITE_PAGES``: ``1`` reads every table this way that can be, ``0`` none; unset, the
tables of at least ``MIN_TABLE_BYTES``. Where the C loops were not built (``setup.py``: an install
without a C compiler), SQLite reads every table.
"""
from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV = "SRTSCOPE_SQLITE_PAGES"
#: a table's leaf pages (and a file) below this read through SQLite unless ``ENV`` is 1 (bytes):
#: where SQLite takes a few milliseconds, walking the b-tree gains nothing
MIN_TABLE_BYTES = 8 << 20
#: leaf pages read and decoded per batch (bytes)
BATCH_BYTES = 4 << 20
_MAGIC = b"SQLite format 3\x00"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_COLUMN = re.compile(rf"({_NAME})")
_INT = re.compile(r"-?\d+")
_COALESCE = re.compile(rf"COALESCE\(\s*({_NAME}|-?\d+)\s*,\s*(-?\d+)\s*\)")
_IN = re.compile(rf"({_NAME})\s+IN\s*\(\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\)")
_I64 = np.iinfo(np.int64)


class Unpaged(Exception):
    """This read (from here on) is not answered from the pages: read it through SQLite."""


@dataclass(frozen=True)
class _Tree:
    """A rowid table's leaf pages in rowid order, each with the highest rowid it may hold."""
    names: tuple[str, ...]          # the record's columns, in order
    leaves: np.ndarray              # page numbers (int64)
    upper: np.ndarray               # inclusive upper bound of each leaf's rowids (int64)


@dataclass(frozen=True)
class _Plan:
    want: np.ndarray                # record indices decoded, ascending (int64)
    asked: tuple[tuple[int, int | None], ...]   # per expression: (row of ``want`` or -1 for a
    #                                             constant, COALESCE's default or the constant)
    where: tuple[int, np.ndarray] | None        # (row of ``want``, the values kept)


def enabled(nbytes: int) -> bool:
    """Whether a table of ``nbytes`` of leaf pages is read from its pages (``ENV``)."""
    flag = os.environ.get(ENV, "")
    if flag == "0":
        return False
    return flag == "1" or nbytes >= MIN_TABLE_BYTES


def _plan(names: tuple[str, ...], exprs: list[str], where: str) -> _Plan:
    index = {n: i for i, n in enumerate(names)}
    cols: list[tuple[int, int | None]] = []
    for e in exprs:
        e = e.strip()
        m = _COALESCE.fullmatch(e)
        name, default = (m.group(1), int(m.group(2))) if m else (e, None)
        if _INT.fullmatch(name):                  # -1, COALESCE(0,0): a constant
            cols.append((-1, int(name)))
            continue
        if not _COLUMN.fullmatch(name) or name not in index:
            raise Unpaged(f"expression {e!r}")
        cols.append((index[name], default))
    cond = None
    if where:
        m = _IN.fullmatch(where.strip())
        if m is None or m.group(1) not in index:
            raise Unpaged(f"where {where!r}")
        cond = (index[m.group(1)], np.array([int(v) for v in m.group(2).split(",")], np.int64))
    want = np.unique(np.array([c for c, _ in cols if c >= 0] + ([cond[0]] if cond else []), np.int64))
    if not len(want):
        raise Unpaged("no column asked")
    at = {int(c): i for i, c in enumerate(want.tolist())}
    return _Plan(want, tuple((at[c] if c >= 0 else -1, d) for c, d in cols),
                 None if cond is None else (at[cond[0]], cond[1]))


def open_pages(path: Path, con: sqlite3.Connection) -> PagedFile | None:
    """``path`` opened for page reads; None where no table of it will be (``ENV``, a file smaller
    than one big table, the C loops not built here, not an SQLite file)."""
    try:
        if not enabled(path.stat().st_size):
            return None
        return PagedFile(path, con)
    except (Unpaged, ImportError, OSError):   # ImportError: the C loops were not built here
        return None


class PagedFile:
    """One SQLite file opened read-only for page reads; each table's b-tree walked once.
    ``con``: an sqlite3 connection to the same file (the schema is asked of it)."""

    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path, self.con = path, con
        self._trees: dict[str, _Tree | Unpaged] = {}
        self.fd = os.open(path, os.O_RDONLY)
        try:
            head = os.pread(self.fd, 100, 0)
            if len(head) < 100 or head[:16] != _MAGIC:
                raise Unpaged("not an SQLite file")
            size = int.from_bytes(head[16:18], "big")
            self.psz = 65536 if size == 1 else size
            if self.psz < 512 or self.psz & (self.psz - 1):
                raise Unpaged(f"page size {self.psz}")
            self.usable = self.psz - head[20]
            if self.usable < 480:                      # SQLite's own least usable size
                raise Unpaged(f"usable page size {self.usable}")
            self.pages = os.fstat(self.fd).st_size // self.psz
        except BaseException:
            os.close(self.fd)
            raise
        import srtscope.analyzers.readers._sqlite_pages as _sqlite_pages  # the C loops (setup.py)
        self._c = _sqlite_pages

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def table_bytes(self, table: str) -> int:
        """Bytes of ``table``'s leaf pages (0 where it is not read from its pages)."""
        t = self._tree(table)
        return 0 if isinstance(t, Unpaged) else len(t.leaves) * self.psz

    def batches(self, table: str, exprs: list[str], where: str, lo: int,
                hi: int) -> Iterator[tuple[int, list[np.ndarray], int]]:
        """(rows seen, ``exprs``' values of the rows kept by ``where``, last rowid) per batch of
        ``table``'s rows with rowids in [lo, hi], ascending; ``Unpaged`` where the rest must be
        read through SQLite (nothing of that batch was given)."""
        t = self._tree(table)
        if isinstance(t, Unpaged):
            raise t
        plan = _plan(t.names, exprs, where)
        # NOTE: one leaf more on each side, each leaf's rows checked against its bounds in the tree:
        # a damaged key that moves a leaf out of [lo, hi] is found, not a row silently left out
        a = max(int(np.searchsorted(t.upper, lo, "left")) - 1, 0)
        b = min(int(np.searchsorted(t.upper, hi, "left")) + 2, len(t.leaves))
        lower = np.r_[_I64.min, t.upper[:-1]]
        per = max(1, BATCH_BYTES // self.psz)
        buf = np.zeros(per * self.psz + self._c.PAD, np.uint8)
        prev = int(_I64.min)
        for s in range(a, b, per):
            e = min(s + per, b)
            pages = t.leaves[s:e]
            self._read_pages(pages, buf)
            n, last, vals = self._decode(buf, len(pages), (lower[s:e], t.upper[s:e]), plan, lo, hi, prev)
            prev = last
            if n:
                yield n, self._values(plan, vals, n), last

    def _decode(self, buf: np.ndarray, npages: int, bounds: tuple[np.ndarray, np.ndarray], plan: _Plan,
                lo: int, hi: int, prev: int) -> tuple[int, int, tuple[np.ndarray, np.ndarray]]:
        at = np.arange(npages, dtype=np.int64) * self.psz
        cells = (buf[at + 3].astype(np.int64) << 8) | buf[at + 4]
        cap = int(np.minimum(cells, (self.usable - 8) // 6).sum())   # the most a page holds
        vals = np.empty((len(plan.want), cap), np.int64)
        nulls = np.empty((len(plan.want), cap), np.uint8)
        try:
            n, last, status = self._c.leaves(buf, at, np.ascontiguousarray(bounds[0]),
                                             np.ascontiguousarray(bounds[1]), self.psz, self.usable,
                                             plan.want, lo, hi, prev, vals, nulls, cap)
        except (ValueError, OSError) as exc:          # buffers the loop refuses: SQLite's to read
            raise Unpaged(str(exc)) from exc
        if status != self._c.OK:
            raise Unpaged(f"status {status}")
        return n, last, (vals[:, :n], nulls[:, :n])

    @staticmethod
    def _values(plan: _Plan, got: tuple[np.ndarray, np.ndarray], n: int) -> list[np.ndarray]:
        vals, nulls = got
        kept = None
        if plan.where is not None:
            w, allowed = plan.where
            kept = nulls[w] == 0
            if len(allowed) <= 4:                  # eventClass IN (0, 1): compares, not a sort
                hit = vals[w] == allowed[0]
                for a in allowed[1:]:
                    hit |= vals[w] == a
                kept &= hit
            else:
                kept &= np.isin(vals[w], allowed)
        out = []
        rows = n if kept is None else int(kept.sum())
        for row, default in plan.asked:
            if row < 0:
                out.append(np.full(rows, default, np.int64))
                continue
            v, nl = vals[row], nulls[row].view(bool)
            if kept is not None:
                v, nl = v[kept], nl[kept]
            if nl.any():
                if default is None:
                    raise Unpaged("NULL")       # SQLite's read says it is malformed
                v = np.where(nl, default, v)
            out.append(v)
        return out

    def _read_pages(self, pages: np.ndarray, buf: np.ndarray) -> None:
        """Pages ``pages`` (numbers from 1) side by side into ``buf``, a run of consecutive pages
        in one read."""
        if pages.min() < 1 or pages.max() > self.pages:
            raise Unpaged("page number outside the file")
        mv = buf.data.cast("B")
        cut = np.flatnonzero(np.diff(pages) != 1) + 1
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(pages)]):
            want = (b - a) * self.psz
            try:
                got = os.preadv(self.fd, [mv[a * self.psz:b * self.psz]], int(pages[a] - 1) * self.psz)
            except OSError as exc:                     # SQLite's read says what it is
                raise Unpaged(str(exc)) from exc
            if got != want:
                raise Unpaged("short read")
        buf[len(pages) * self.psz:] = 0

    def _tree(self, table: str) -> _Tree | Unpaged:
        if table not in self._trees:
            try:
                self._trees[table] = self._walk(table)
            except Unpaged as exc:
                self._trees[table] = exc
        return self._trees[table]

    def _walk(self, table: str) -> _Tree:
        """The table's leaves, level by level from its root (every leaf of a b-tree is as deep)."""
        row = self.con.execute("SELECT rootpage, sql FROM sqlite_master WHERE type='table' AND name=?",
                               (table,)).fetchone()
        if row is None or not isinstance(row[0], int) or "WITHOUT ROWID" in str(row[1]).upper():
            raise Unpaged("not a rowid table")
        info = self.con.execute(f"PRAGMA table_xinfo({table})").fetchall()
        # (cid, name, type, notnull, default, pk, hidden): a rowid alias or a generated column is
        # not stored in the record as listed
        if any(r[6] for r in info) or (sum(1 for r in info if r[5]) == 1
                                       and any(r[5] and str(r[2]).upper() == "INTEGER" for r in info)):
            raise Unpaged("rowid alias or generated column")
        names = tuple(str(r[1]) for r in info)
        level, upper = np.array([row[0]], np.int64), np.array([_I64.max], np.int64)
        seen = 0
        page = np.zeros(self.psz + self._c.PAD, np.uint8)
        kids = np.empty(self.usable // 2 + 1, np.int64)
        keys = np.empty(self.usable // 2 + 1, np.int64)
        while True:
            self._read_pages(level[:1], page)
            off = 100 if level[0] == 1 else 0
            if page[off] == self._c.LEAF:
                return _Tree(names, level, upper)
            seen += len(level)
            if seen > self.pages:
                raise Unpaged("a b-tree larger than the file")
            nxt, nup = [], []
            for p, up in zip(level.tolist(), upper.tolist()):
                self._read_pages(np.array([p], np.int64), page)
                try:
                    k = self._c.interior(page, 100 if p == 1 else 0, self.psz, self.usable, kids, keys)
                except (ValueError, OSError) as exc:  # buffers the loop refuses: SQLite's to read
                    raise Unpaged(str(exc)) from exc
                if k < 1:
                    raise Unpaged(f"page {p} is not an interior page")
                nxt.append(kids[:k].copy())
                nup.append(np.append(keys[:k - 1], up))
            level, upper = np.concatenate(nxt), np.concatenate(nup)
            if len(level) > self.pages or np.any(np.diff(upper) < 0):
                raise Unpaged("keys out of order")
