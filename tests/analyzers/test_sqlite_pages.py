"""Integer columns read from SQLite's pages (``sqlite_pages``) give what SQLite gives, value for
value and error for error: each file below is made here, with sqlite3, for the case it names."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.readers import sqlite_pages as sp
from srtscope.analyzers.readers.columnar import connect_arrow, fetch_ints
from tests.conftest import REAL_TRACES as REAL

T = "t"
# every integer width SQLite stores (serial types 1-6, and 8/9 for 0 and 1)
WIDTHS = [0, 1, -1, 127, -128, 128, 32767, -32768, 1 << 23, -(1 << 23), (1 << 31) - 1, -(1 << 31),
          1 << 40, -(1 << 47), (1 << 63) - 1, -(1 << 63)]


def _db(path: Path, rows: list[tuple], schema: str = "a INTEGER, b INTEGER, c INTEGER",
        page_size: int = 512, after: str = "") -> Path:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={page_size}")
    con.execute(f"CREATE TABLE {T} ({schema})")
    n = schema.count(",") + 1
    con.executemany(f"INSERT INTO {T} VALUES ({', '.join('?' * n)})", rows)
    for sql in filter(None, after.split(";")):
        con.execute(sql)
    con.commit()
    con.close()
    return path


def _read(path: Path, exprs: list[str], where: str = "", rowids: tuple[int, int] | None = None,
          paged: bool = True) -> list[np.ndarray] | str:
    """fetch_ints through the pages (forced) or through SQLite only; an error as its message."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    arrow = connect_arrow(path)
    pages = sp.open_pages(path, con) if paged else None
    try:
        return fetch_ints(arrow, T, exprs, where, rowids=rowids, pages=pages)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        if pages is not None:
            pages.close()
        arrow.close()
        con.close()


def _batches(path: Path, exprs: list[str], where: str = "", lo: int = 1, hi: int = 1 << 62) -> int:
    """Rows the pages alone gave (``Unpaged`` raised where they cannot)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    pf = sp.PagedFile(path, con)
    try:
        return sum(seen for seen, _, _ in pf.batches(T, exprs, where, lo, hi))
    finally:
        pf.close()
        con.close()


@pytest.fixture(autouse=True)
def _forced(monkeypatch):
    monkeypatch.setenv(sp.ENV, "1")


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# (case, rows, schema, after, exprs, where, read from the pages alone)
CASES = [
    ("every integer width", [(v, -v if v > -(1 << 63) else 5, 7) for v in WIDTHS], None, "",
     ["a", "b", "c"], "", True),
    ("a NULL under COALESCE, a constant, a COALESCE of constants",
     [(1, None, 3), (None, 2, None)] * 50, None, "",
     ["COALESCE(a,-1)", "COALESCE(b, 0)", "COALESCE(c,9)", "-1", "COALESCE(0,0)"],
     "", True),
    ("where IN: rows outside it hold NULLs", [(i % 3, None if i % 3 == 2 else i, i) for i in range(500)],
     None, "", ["b", "c"], "a IN (0, 1)", True),
    ("a NULL where no COALESCE is: SQLite's error", [(1, 2, 3), (None, 2, 3)], None, "", ["a", "b"], "", False),
    ("a float: SQLite's error", [(1, 2, 3), (1.5, 2, 3)], None, "", ["a"], "", False),
    ("text: SQLite's error", [(1, 2, 3), ("x", 2, 3)], None, "", ["a"], "", False),
    ("a row on overflow pages", [(i, i, i) for i in range(50)] + [(7, 8, 9)], "a INTEGER, b INTEGER, c",
     "UPDATE t SET c = zeroblob(3000) WHERE rowid = 51", ["a", "b"], "", False),
    ("rows shorter than the table (a column added later)", [(i, i, i) for i in range(200)], None,
     "ALTER TABLE t ADD COLUMN d INTEGER DEFAULT 42", ["a", "COALESCE(d,0)"], "", False),
    ("rowids with gaps (rows deleted)", [(i, i * 2, i * 3) for i in range(3000)], None,
     "DELETE FROM t WHERE a % 7 = 3", ["a", "b", "c"], "", True),
    ("an integer primary key (the rowid's alias)", [(i, i, i) for i in range(100)],
     "a INTEGER PRIMARY KEY, b INTEGER, c INTEGER", "", ["a", "b"], "", False),
    ("a table without rowid", [(i, i, i) for i in range(100)],
     "a INTEGER PRIMARY KEY, b INTEGER, c INTEGER) WITHOUT ROWID --", "", ["b", "c"], "", False),
    ("an expression SQLite computes", [(i, i, i) for i in range(100)], None, "", ["a + b"], "", False),
]


@pytest.mark.parametrize("case,rows,schema,after,exprs,where,paged", CASES, ids=[c[0] for c in CASES])
def test_pages_give_what_sqlite_gives(tmp_path, case, rows, schema, after, exprs, where, paged):
    path = _db(tmp_path / "t.sqlite", rows, schema or "a INTEGER, b INTEGER, c INTEGER", after=after)
    assert _same(_read(path, exprs, where), _read(path, exprs, where, paged=False)), case
    if paged:
        assert _batches(path, exprs, where) == sqlite3.connect(path).execute(
            f"SELECT COUNT(*) FROM {T}").fetchone()[0], case
    else:
        with pytest.raises(sp.Unpaged):
            _batches(path, exprs, where)


def test_every_width_read_from_pages(tmp_path):
    path = _db(tmp_path / "t.sqlite", [(v, 0, 1) for v in WIDTHS])
    a, b, c = _read(path, ["a", "b", "c"])
    assert a.tolist() == WIDTHS and set(b.tolist()) == {0} and set(c.tolist()) == {1}


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 5000), (777, 778), (2500, 4999), (4990, 9000), (6000, 7000)])
def test_rowid_ranges_in_a_deep_tree(tmp_path, lo, hi):
    """512-byte pages: 5000 rows take a b-tree of three levels; a range starts and ends mid-leaf."""
    path = _db(tmp_path / "t.sqlite", [(i, i * i, -i) for i in range(5000)])
    got = _read(path, ["a", "b", "c"], rowids=(lo, hi))
    assert _same(got, _read(path, ["a", "b", "c"], rowids=(lo, hi), paged=False))
    assert got[0].tolist() == list(range(lo - 1, min(hi, 5000)))


def test_a_bad_row_late_in_the_table_is_read_through_sqlite_from_there(tmp_path, monkeypatch):
    """One page a batch: the batches before the float come from the pages, the rest from SQLite."""
    monkeypatch.setattr(sp, "BATCH_BYTES", 512)
    rows = [(i, i, i) for i in range(2000)]
    rows[1500] = (1500, 2.5, 1500)
    path = _db(tmp_path / "t.sqlite", rows)
    assert _same(_read(path, ["a", "c"]), _read(path, ["a", "c"], paged=False))
    assert _read(path, ["b"]) == _read(path, ["b"], paged=False)      # the same error
    con = sqlite3.connect(path)
    pf = sp.PagedFile(path, con)
    given = 0
    with pytest.raises(sp.Unpaged):
        for seen, _, _ in pf.batches(T, ["b"], "", 1, 2000):
            given += seen
    assert 1000 < given <= 1500


def test_a_damaged_leaf_page_is_answered_by_sqlite(tmp_path):
    path = _db(tmp_path / "t.sqlite", [(i, i, i) for i in range(3000)])
    con = sqlite3.connect(path)
    root = con.execute(f"SELECT rootpage FROM sqlite_master WHERE name='{T}'").fetchone()[0]
    con.close()
    with path.open("r+b") as f:           # the last page is a leaf of t: its type byte made odd
        f.seek(0, 2)
        last = f.tell() // 512
        assert last != root
        f.seek((last - 1) * 512)
        f.write(b"\x07")
    assert _same(_read(path, ["a", "b"]), _read(path, ["a", "b"], paged=False))


def test_the_switch(tmp_path, monkeypatch):
    path = _db(tmp_path / "t.sqlite", [(1, 2, 3)])
    con = sqlite3.connect(path)
    assert sp.open_pages(path, con) is not None
    monkeypatch.setenv(sp.ENV, "0")
    assert sp.open_pages(path, con) is None
    monkeypatch.delenv(sp.ENV)
    assert sp.open_pages(path, con) is None                       # a small file: SQLite reads it
    assert sp.enabled(sp.MIN_TABLE_BYTES) and not sp.enabled(sp.MIN_TABLE_BYTES - 1)
    (tmp_path / "x.sqlite").write_bytes(b"not sqlite" * 100)
    monkeypatch.setenv(sp.ENV, "1")
    assert sp.open_pages(tmp_path / "x.sqlite", con) is None


NSYS = sorted((REAL / "nsys").glob("*.sqlite")) if (REAL / "nsys").is_dir() else []


@pytest.mark.usefixtures("real_traces")
@pytest.mark.parametrize("path", NSYS, ids=[p.name for p in NSYS])
def test_real_exports_read_from_pages_as_through_sqlite(path, monkeypatch):
    """Every shared nsys export (2022.2 to 2026.2): the Timeline read from the pages is the one
    read through SQLite, and its big tables came from the pages (nothing fell back)."""
    fell: list[str] = []
    used: set[str] = set()
    orig = sp.PagedFile.batches

    def batches(self, table, *a):
        try:
            yield from orig(self, table, *a)
            used.add(table)
        except sp.Unpaged as exc:
            fell.append(f"{table}: {exc}")
            raise

    monkeypatch.setattr(sp.PagedFile, "batches", batches)
    paged = load_timeline([path])
    monkeypatch.setenv(sp.ENV, "0")
    whole = load_timeline([path])
    assert fell == [] and {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"} <= used
    for a, b in ((paged.device, whole.device), (paged.api, whole.api), (paged.ranges, whole.ranges)):
        pd.testing.assert_frame_equal(a, b)


def test_the_loops_refuse_buffers_that_do_not_hold_the_pages():
    """The C loops check their buffers before reading: too short a page buffer, too few rows of
    output, wanted columns out of order -- a ValueError, never a read past a buffer."""
    from srtscope.analyzers.readers import _sqlite_pages as c

    page = np.zeros(4096 + c.PAD, np.uint8)
    vals, nulls = np.zeros((1, 8), np.int64), np.zeros((1, 8), np.uint8)
    at, want = np.zeros(1, np.int64), np.zeros(1, np.int64)
    low, high = np.zeros(1, np.int64), np.full(1, 99, np.int64)
    assert c.leaves(page, at, low, high, 4096, 4096, want, 1, 9, -1, vals, nulls, 8)[2] == c.ODD_PAGE  # no leaf
    for bad in ((page[:4096], at, low, want, vals, 8), (page, at + 1, low, want, vals, 8),
                (page, at, low, want, vals, 9), (page, at, low, np.array([2, 1]), vals, 4),
                (page, at, low[:0], want, vals, 8)):
        b, a, lw, w, v, cap = bad
        with pytest.raises(ValueError):
            c.leaves(b, a, lw, high, 4096, 4096, w, 1, 9, -1, v, nulls, cap)
    kids = np.zeros(4, np.int64)
    assert c.interior(page, 0, 4096, 4096, kids, kids.copy()) == -1
    with pytest.raises(ValueError):
        c.interior(page[:100], 0, 4096, 4096, kids, kids.copy())


def test_without_the_c_loops_sqlite_reads_everything(tmp_path, monkeypatch):
    import sys

    path = _db(tmp_path / "t.sqlite", [(1, 2, 3)])
    monkeypatch.setitem(sys.modules, "srtscope.analyzers.readers._sqlite_pages", None)
    assert sp.open_pages(path, sqlite3.connect(path)) is None
    assert _same(_read(path, ["a"], paged=False), [np.array([1])])


@pytest.mark.parametrize("seed", range(4))
def test_flipped_bytes_give_sqlites_answer_or_its_error(tmp_path, seed):
    """Bytes of the table's pages (leaves, interior pages, keys, cell pointers) overwritten at random:
    the pages give SQLite's values or SQLite's error -- never other rows, never a crash."""
    rng = np.random.default_rng(seed)
    clean = _db(tmp_path / "clean.sqlite", [(i, i * 3, None if i % 4 else -i) for i in range(40_000)],
                page_size=1024)
    data = clean.read_bytes()
    exprs = ["a", "b", "COALESCE(c,-1)"]
    for trial in range(25):
        path = tmp_path / f"bad{trial}.sqlite"
        raw = bytearray(data)
        for at in rng.integers(2 * 1024, len(raw), 1 + trial % 4):     # past sqlite_master's page
            raw[int(at)] = int(rng.integers(0, 256))
        path.write_bytes(bytes(raw))
        for rowids in (None, (5_000, 30_000)):
            assert _same(_read(path, exprs, rowids=rowids), _read(path, exprs, rowids=rowids, paged=False)), \
                (trial, rowids)


def test_a_child_page_zero_or_too_little_usable_space_is_sqlites_to_judge(tmp_path):
    """An interior page's later child set to page 0; reserved bytes leaving under 480 usable: the
    pages give way to SQLite (its answer or its error), never an OSError or a ValueError."""
    path = _db(tmp_path / "t.sqlite", [(i, i, i) for i in range(1000)])   # a root over leaves
    con = sqlite3.connect(path)
    root = con.execute(f"SELECT rootpage FROM sqlite_master WHERE name='{T}'").fetchone()[0]
    con.close()
    raw = bytearray(path.read_bytes())
    base = (root - 1) * 512
    assert raw[base] == 0x05 and int.from_bytes(raw[base + 8:base + 12], "big") > 0
    raw[base + 8:base + 12] = bytes(4)                           # the right-most child: page 0
    (tmp_path / "zero.sqlite").write_bytes(bytes(raw))
    reserved = bytearray(path.read_bytes())
    reserved[20] = 64                                            # 512 - 64 = 448 usable bytes
    (tmp_path / "reserved.sqlite").write_bytes(bytes(reserved))
    for bad in ("zero.sqlite", "reserved.sqlite"):
        for rng in (None, (1, 1000)):     # a range: no seek of the table's last rowid before the pages
            assert _same(_read(tmp_path / bad, ["a", "b"], rowids=rng),
                         _read(tmp_path / bad, ["a", "b"], rowids=rng, paged=False)), (bad, rng)


def _many_tables(path: Path, rows: list[tuple], tables: int) -> Path:
    """``_db`` with ``tables`` more tables after ``t``: enough make sqlite_master's root, page 1, an
    interior page (its b-tree header 100 bytes in, after the file header)."""
    _db(path, rows)
    con = sqlite3.connect(path)
    for i in range(tables):
        con.execute(f"CREATE TABLE extra_{i:03d}_{'x' * 40} (a INTEGER, b INTEGER, c INTEGER)")
    con.commit()
    con.close()
    return path


def test_page_1_read_as_an_interior_page_past_the_file_header(tmp_path):
    """The loop reads page 1's b-tree header 100 bytes in: its children and the right-most one, as
    the page says -- not a ValueError for a page buffer of one page."""
    from srtscope.analyzers.readers import _sqlite_pages as c

    raw = _many_tables(tmp_path / "t.sqlite", [(1, 2, 3)], 60).read_bytes()
    assert raw[100] == c.INTERIOR
    page = np.zeros(512 + c.PAD, np.uint8)
    page[:512] = np.frombuffer(raw[:512], np.uint8)
    kids, keys = np.zeros(512, np.int64), np.zeros(512, np.int64)
    k = c.interior(page, 100, 512, 512, kids, keys)
    assert k == int.from_bytes(raw[103:105], "big") + 1 >= 2
    assert kids[k - 1] == int.from_bytes(raw[108:112], "big")
    assert all(2 <= p <= len(raw) // 512 for p in kids[:k])
    assert c.interior(page, 0, 512, 512, kids, keys) == -1        # page 1's first byte is the file's


@pytest.mark.parametrize("tables", [0, 60], ids=["page 1 a leaf", "page 1 an interior page"])
def test_a_child_pointing_at_page_1_is_sqlites_to_judge(tmp_path, tables):
    """A three-level table whose root's right-most child is damaged to page 1 (sqlite_master's root,
    a leaf or an interior page): the pages give way to SQLite (its answer or its error), never a
    ValueError."""
    path = _many_tables(tmp_path / "t.sqlite", [(i, i * i, -i) for i in range(5000)], tables)
    con = sqlite3.connect(path)
    root = con.execute(f"SELECT rootpage FROM sqlite_master WHERE name='{T}'").fetchone()[0]
    con.close()
    raw = bytearray(path.read_bytes())
    base = (root - 1) * 512
    child = int.from_bytes(raw[base + 8:base + 12], "big")
    assert raw[base] == 0x05 and raw[(child - 1) * 512] == 0x05          # three levels
    raw[base + 8:base + 12] = (1).to_bytes(4, "big")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(bytes(raw))
    for rng in (None, (1, 5000), (4990, 5000)):
        assert _same(_read(bad, ["a", "b"], rowids=rng), _read(bad, ["a", "b"], rowids=rng, paged=False)), rng
    with pytest.raises(sp.Unpaged):
        _batches(bad, ["a", "b"])


def test_buffers_the_loops_refuse_are_sqlites_to_read(tmp_path, monkeypatch):
    """A ValueError (or OSError) out of the C loops: the pages give way to SQLite, it does not escape."""
    path = _db(tmp_path / "t.sqlite", [(i, i, i) for i in range(5000)])
    real = sp.PagedFile.__init__

    class Refusing:
        PAD, LEAF, INTERIOR, OK = 32, 0x0D, 0x05, 0

        def __init__(self, which: str, exc: type[Exception]) -> None:
            self.which, self.exc = which, exc

        def leaves(self, *a):
            if self.which == "leaves":
                raise self.exc("refused")
            return c.leaves(*a)

        def interior(self, *a):
            if self.which == "interior":
                raise self.exc("refused")
            return c.interior(*a)

    from srtscope.analyzers.readers import _sqlite_pages as c

    for which in ("leaves", "interior"):
        for exc in (ValueError, OSError):
            def init(self, *a, _w=which, _e=exc):
                real(self, *a)
                self._c = Refusing(_w, _e)
            monkeypatch.setattr(sp.PagedFile, "__init__", init)
            for rng in (None, (100, 4000)):
                assert _same(_read(path, ["a", "b"], rowids=rng), _read(path, ["a", "b"], rowids=rng, paged=False))
            with pytest.raises(sp.Unpaged):
                _batches(path, ["a", "b"])
