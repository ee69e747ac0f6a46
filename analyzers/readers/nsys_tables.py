"""An Nsight Systems export's tables: the read-only connection, which tables and columns the file
has, their integer columns fetched (``columnar.fetch_ints``: through ADBC or the file's pages) and
counted, the metadata key-value tables. The base of ``nsys_sqlite._Reader``.

NOTE: ``globalTid`` packs ``hw << 48 | pid << 24 | tid``; GPU tables carry ``globalPid`` only.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from srtscope.analyzers.readers.columnar import connect_arrow, fetch_ints
from srtscope.analyzers.readers.nsys_window import Track, Window
from srtscope.analyzers.readers.sqlite_pages import PagedFile, open_pages

_MASK24 = 0xFFFFFF


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only, immutable connection: SQLite neither locks nor writes anything next to the file."""
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    con.execute("PRAGMA query_only=1")
    return con


def _pid_of(i: int) -> Track:
    """The process id of a ``globalPid``/``globalTid`` column (``i``-th expression), per row."""
    return lambda c: (c[i] >> 24) & _MASK24


class NsysTables:
    """The tables of an export on ``con`` (``window``: a windowed read's)."""

    def __init__(self, path: Path, con: sqlite3.Connection, window: Window | None = None) -> None:
        self.path, self.con = path, con
        self.window = window        # a windowed read: the big tables' rows in it only
        self.tables = {r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type='table'")}
        self._strings: dict[int, str] | None = None
        self.missing_strings = 0    # rows whose StringIds id is not in StringIds
        self.named_rows = 0         # rows whose name was looked up in StringIds
        self.suspect: list[str] = []  # what looked inconsistent while reading (quick_check then)
        self._arrow: Any = None        # ADBC connection for the big scans, opened on first use
        self._pages: PagedFile | None | bool = False   # the big tables' pages (False: not opened yet)
        self._long_ids: set[int] | None = None
        # no table of the file can hold more rows than this (a row takes more than 8 bytes)
        self.max_rows = max(1, path.stat().st_size // 8)

    @property
    def arrow(self) -> Any:
        if self._arrow is None:
            self._arrow = connect_arrow(self.path)
        return self._arrow

    @property
    def pages(self) -> PagedFile | None:
        """The file opened for page reads (``sqlite_pages``); None where it cannot be."""
        if self._pages is False:
            self._pages = open_pages(self.path, self.con)
        return self._pages if isinstance(self._pages, PagedFile) else None

    def close(self) -> None:
        if isinstance(self._pages, PagedFile):
            self._pages.close()
        self._pages = None
        if self._arrow is not None:
            self._arrow.close()
            self._arrow = None

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.con.execute(f"PRAGMA table_info({table})")}

    def fetch(self, table: str, exprs: list[str], where: str = "",
              track: dict[str, Track] | None = None) -> list[np.ndarray]:
        """``fetch_ints``, noting a table whose row count is not its rowid span: nsys writes rowids
        1..n, so rows were lost or moved (a swapped page) -- or the export was edited. In a windowed
        read, the rows in the window only (start and end: the first two ``exprs``), ``track``'s
        values counted over the whole table (``Window.seen``)."""
        span: list[int] = []
        w = self.window
        keep = w.keep(table, track or {}) if w is not None else None
        out = fetch_ints(self.arrow, table, exprs, where, span=span, max_rows=self.max_rows, keep=keep,
                         expect_rows=w.expect_rows if w is not None else None, pages=self.pages)
        if span and span[2] - span[1] + 1 != span[0]:
            self.suspect.append(f"{span[0]} rows in {table} over rowids {span[1]}..{span[2]}")
        return out

    def count(self, table: str, where: str = "") -> int:
        return int(self.con.execute(f"SELECT COUNT(*) FROM {table} {where}").fetchone()[0])

    def holds(self, table: str, part: dict | None) -> bool:
        """Whether ``table``'s part goes into the Timeline: it has rows (in a windowed read: the
        whole table has, so that an empty window keeps the whole read's columns and categories)."""
        if part is None:
            return False
        seen = self.window.seen.get(table) if self.window is not None else None
        return bool(seen.rows if seen is not None else len(part["start_ns"]))

    def meta_kv(self) -> dict[str, str]:
        for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.has(t):
                return {str(k): str(v) for k, v in self.con.execute(f"SELECT name, value FROM {t}")}
        return {}

    def capture_kv(self) -> dict[str, str]:
        if not self.has("META_DATA_CAPTURE"):
            return {}
        return {str(k): str(v) for k, v in self.con.execute(
            "SELECT name, value FROM META_DATA_CAPTURE WHERE name NOT LIKE '%ENVIRONMENT%'")}
