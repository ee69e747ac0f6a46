"""SQLite integrity for read-only exports: side files that would make a read stale or torn
(``check_side_files``) and structural corruption (``check_integrity``, ``PRAGMA quick_check``).

Nothing here writes: the checks read the side files' headers and query the read-only connection.
"""
from __future__ import annotations

import shlex
import sqlite3
from pathlib import Path

from srtscope.analyzers.readers.errors import TraceError

_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
_WAL_HEADER = 32


def check_side_files(path: Path) -> None:
    """Refuse a database whose last transactions sit in a ``-wal`` log or whose file may be torn (a
    hot ``-journal``): the immutable connection would read it stale or half-written, silently."""
    how = (f"settle it by opening the database once with sqlite3 (sqlite3 {shlex.quote(str(path))} "
           "'PRAGMA wal_checkpoint(TRUNCATE)'), which checkpoints or rolls back, then read it again")
    for base in dict.fromkeys((str(path), str(path.resolve()))):
        wal, journal = Path(base + "-wal"), Path(base + "-journal")
        try:
            if wal.is_file() and wal.stat().st_size > _WAL_HEADER:
                raise TraceError(path, f"a write-ahead log {wal} lies beside it: transactions in it are not "
                                       f"in the database file, which would read stale; {how}")
            if journal.is_file() and journal.stat().st_size > 0:
                with open(journal, "rb") as fh:
                    hot = fh.read(len(_JOURNAL_MAGIC)) == _JOURNAL_MAGIC
                if hot:
                    raise TraceError(path, f"a hot rollback journal {journal} lies beside it: a write was "
                                           f"interrupted and the database file may be torn; {how}")
        except OSError:
            continue  # unreadable side file: SQLite could not use it either


def _problems(con: sqlite3.Connection, table: str | None = None) -> list[str]:
    """``PRAGMA quick_check`` (of one table, else of the whole file): its complaints, [] when ok."""
    arg = f"({table})" if table else ""
    try:
        rows = [str(r[0]) for r in con.execute(f"PRAGMA quick_check{arg}")]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    rows = [" ".join(r.replace("*** in database main ***", "").split()) for r in rows]
    return [r for r in rows if r and r != "ok"]


def check_integrity(path: Path, con: sqlite3.Connection, why: str = "",
                    tables: tuple[str, ...] = ()) -> None:
    """``TraceError`` when ``PRAGMA quick_check`` finds the file structurally corrupt (page swaps,
    flipped bits in b-tree pages: rows then read as other rows, silently). ``tables``: check only
    these (small) tables; ``why``: what looked inconsistent, said in the message."""
    problems: list[str] = []
    for t in tables or (None,):
        problems += _problems(con, t)
    if problems:
        seen = f" (what was read looked inconsistent: {why[:200]})" if why else ""
        n = f"{len(problems)}+" if len(problems) >= 100 else str(len(problems))   # it stops at 100
        raise TraceError(path, f"corrupt SQLite database: PRAGMA quick_check reports {n} problem(s), "
                               f"first: {problems[0][:200]}{seen}; re-export it from the .nsys-rep "
                               "report (nsys export --type sqlite)")
