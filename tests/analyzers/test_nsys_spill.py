"""``read_nsys_spilled``: the nsys export read once into time buckets on disk, given back in time
order. Its pieces put together are ``read_nsys``'s tables exactly (columns, dtypes, categories, row
order with ties, index) and its metadata equal, on every nsys scenario, the shared real exports and
a generated export cut into many small buckets; pieces stay within ``chunk_rows``; the files it
wrote leave with ``close`` or an error, nothing else in the folder does."""
from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sample_traces import generate as scenarios
from srtscope.analyzers.model.timeline import ID_COLUMNS, WIDE_IDS_ENV, TimelineError, WarningCode, empty_table
from srtscope.analyzers.readers import columnar
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.nsys_sqlite import read_nsys
from srtscope.analyzers.spill.nsys_spill import read_nsys_spilled
from srtscope.analyzers.spill.time_spool import MAX_SEGMENTS, TimeSpool
from tests.conftest import REAL_TRACES

SAMPLES = Path(scenarios.__file__).resolve().parent
SCENARIOS = sorted(p.name for p in SAMPLES.glob("*.sqlite"))
REAL = sorted(p.name for p in (REAL_TRACES / "nsys").glob("*.sqlite")) if REAL_TRACES.is_dir() else []


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A generated export (~200 k kernels, ~200 k API calls, NVTX): many buckets at small chunks."""
    sys.path.insert(0, str(SAMPLES.parent))
    from benchmarks.gen_nsys import generate

    path = tmp_path_factory.mktemp("gen") / "gen20.sqlite"
    generate(path, 20)
    return path


def _whole(frames: list[pd.DataFrame], table: str) -> pd.DataFrame:
    return pd.concat(frames) if frames else empty_table(table)


def _check_pieces(frames: list[pd.DataFrame], chunk_rows: int) -> None:
    """Each piece within ``chunk_rows`` (unless one start holds more), sorted, and a start never
    shared by two pieces."""
    for df in frames:
        s = df["start_ns"].to_numpy()
        assert len(df) <= chunk_rows or s[0] == s[-1], (len(df), chunk_rows)
        assert (np.diff(s) >= 0).all()
    for a, b in zip(frames, frames[1:]):
        assert a["start_ns"].iloc[-1] < b["start_ns"].iloc[0]


def assert_same_as_read_nsys(path: Path, folder: Path, chunk_rows: int, scan_rows: int = 1 << 18,
                             rank: int = 0) -> tuple[int, int]:
    """The spilled read of ``path`` equals ``read_nsys``'s; (device pieces, API pieces)."""
    tl = read_nsys(path, rank)
    with read_nsys_spilled(path, rank, folder=folder, chunk_rows=chunk_rows, scan_rows=scan_rows) as sp:
        assert sp.meta == tl.meta
        pd.testing.assert_frame_equal(sp.ranges, tl.ranges)
        pd.testing.assert_frame_equal(sp.counters, tl.counters)
        assert (sp.device_rows, sp.api_rows) == (len(tl.device), len(tl.api))
        out = []
        for table, frames in (("device", list(sp.iter_device())), ("api", list(sp.iter_api()))):
            pd.testing.assert_frame_equal(_whole(frames, table), getattr(tl, table), check_exact=True)
            _check_pieces(frames, chunk_rows)
            out.append(len(frames))
    assert not list(folder.iterdir())            # every file it wrote is gone
    return out[0], out[1]


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenarios_equal_read_nsys(name, tmp_path):
    assert_same_as_read_nsys(SAMPLES / name, tmp_path / "spill", chunk_rows=29, scan_rows=50, rank=2)


@pytest.mark.skipif(not REAL, reason=f"real traces not found at {REAL_TRACES}")
@pytest.mark.parametrize("name", REAL)
def test_real_exports_equal_read_nsys(name, tmp_path):
    assert_same_as_read_nsys(REAL_TRACES / "nsys" / name, tmp_path / "spill", chunk_rows=500, scan_rows=700)


@pytest.mark.parametrize("wide", ["0", "1"])
def test_generated_export_in_many_buckets_equals_read_nsys(generated, tmp_path, monkeypatch, wide):
    """~200 k rows a table through 4000-row buckets (splits as they fill) and 30 k-rowid scans
    (rows of one bucket arrive from several scans and tables); int32 ids and the int64 layout."""
    monkeypatch.setenv(WIDE_IDS_ENV, wide)
    n_dev, n_api = assert_same_as_read_nsys(generated, tmp_path / "spill", chunk_rows=4000, scan_rows=30_000)
    assert n_dev >= 50 and n_api >= 50


def _tied_export(src: Path, dst: Path, grain_ns: int) -> Path:
    """``src`` with every device and API start rounded down to ``grain_ns``: large groups of rows
    sharing one start, across the kernel and memcpy tables (ties resolved by table, then rowid)."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as con:
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME"):
            con.execute(f"UPDATE {t} SET start = start - start % {grain_ns}")
    return dst


@pytest.mark.parametrize("grain_ns, chunk_rows", [(1_000_000, 7), (50_000_000, 3), (10**12, 5)])
def test_ties_across_chunk_edges_keep_read_nsys_order(tmp_path, grain_ns, chunk_rows):
    path = _tied_export(SAMPLES / "copy_bound.sqlite", tmp_path / "tied.sqlite", grain_ns)
    assert_same_as_read_nsys(path, tmp_path / "spill", chunk_rows=chunk_rows, scan_rows=11)


def test_iterators_read_again_and_close_removes_only_its_files(generated, tmp_path):
    folder = tmp_path / "spill"
    folder.mkdir()
    (folder / "mine.txt").write_text("the caller's")
    sp = read_nsys_spilled(generated, folder=folder, chunk_rows=20_000)
    first = [len(df) for df in sp.iter_device()]
    again = [len(df) for df in sp.iter_device()]
    assert first == again and sum(first) == sp.device_rows
    assert sorted(p.suffix for p in folder.iterdir()) == [".spool", ".spool", ".txt"]    # a file a table
    sp.close()
    assert [p.name for p in folder.iterdir()] == ["mine.txt"]
    with pytest.raises(ValueError, match="closed"):
        sp.iter_api()


def test_two_reads_share_a_folder_without_touching_each_other(tmp_path):
    folder = tmp_path / "spill"
    one = read_nsys_spilled(SAMPLES / "healthy.sqlite", folder=folder, chunk_rows=50)
    two = read_nsys_spilled(SAMPLES / "kernel_bound.sqlite", folder=folder, chunk_rows=50)
    mine = set(folder.iterdir())
    two.close()
    assert set(folder.iterdir()) < mine
    pd.testing.assert_frame_equal(pd.concat(list(one.iter_device())), read_nsys(SAMPLES / "healthy.sqlite").device)
    one.close()
    assert not list(folder.iterdir())


def test_idle_thread_takes_kernel_chunks_in_order(generated, tmp_path, monkeypatch):
    """The API thread, done first, reads chunks of the kernel table too: rows still added in rowid
    order (ties keep the table's order), the read equal to ``read_nsys``'s."""
    import threading
    import time

    from srtscope.analyzers.spill import nsys_spill

    readers: list[str] = []
    name, kernels = nsys_spill.DEVICE_TABLES[0]

    def slow_here(r):
        readers.append(threading.current_thread().name)
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.02)                 # the device side slower than the API side
        return kernels(r)
    monkeypatch.setattr(nsys_spill, "DEVICE_TABLES", ((name, slow_here), *nsys_spill.DEVICE_TABLES[1:]))
    assert_same_as_read_nsys(generated, tmp_path / "spill", chunk_rows=4000, scan_rows=3000)
    here = readers.count(threading.main_thread().name)
    assert 0 < here < len(readers), (here, len(readers))      # both threads read kernel chunks


def test_error_mid_scan_removes_the_files_written(generated, tmp_path, monkeypatch):
    folder = tmp_path / "spill"
    calls = []
    real_add = TimeSpool.add

    def failing_add(self, cols):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("disk full")
        return real_add(self, cols)

    monkeypatch.setattr(TimeSpool, "add", failing_add)
    with pytest.raises(RuntimeError, match="disk full"):
        read_nsys_spilled(generated, folder=folder, chunk_rows=5000, scan_rows=20_000)
    assert len(calls) <= 7 and not list(folder.iterdir())   # the other thread stopped too (~25 chunks)


class _Faulty:
    """``os`` as ``spill_writes`` / ``time_spool`` see it: writes past ``limit`` bytes raise ENOSPC;
    with ``close_errno``, closing a spill file's descriptor raises that error (after closing it)."""

    def __init__(self, limit: int, close_errno: int = 0) -> None:
        self.limit, self.close_errno, self.written = limit, close_errno, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def pwritev(self, fd, bufs, offset):
        n = sum(memoryview(b).nbytes for b in bufs)
        if self.written + n > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.written += n
        return os.pwritev(fd, bufs, offset)

    def close(self, fd):
        os.close(fd)
        if self.close_errno:
            raise OSError(self.close_errno, os.strerror(self.close_errno))


@pytest.mark.parametrize("limit", [0, 200_000, 2_000_000], ids=["first write", "early", "mid"])
def test_a_full_disk_is_the_os_error_and_removes_only_the_spill(generated, tmp_path, monkeypatch, limit):
    """ENOSPC comes out as itself (a BufferError of the cleanup took its place), the spill's files
    are removed and the user's file beside them is not."""
    from srtscope.analyzers.spill import spill_writes, time_spool

    folder = tmp_path / "spill"
    folder.mkdir()
    (folder / "mine.txt").write_text("the user's")
    fake = _Faulty(limit, close_errno=errno.EIO)        # the cleanup fails too: ENOSPC still told
    monkeypatch.setattr(spill_writes, "os", fake)
    monkeypatch.setattr(time_spool, "os", fake)
    with pytest.raises(OSError) as raised:
        read_nsys_spilled(generated, folder=folder, chunk_rows=5000, scan_rows=20_000)
    assert raised.value.errno == errno.ENOSPC, repr(raised.value)
    assert [p.name for p in folder.iterdir()] == ["mine.txt"]


def test_a_spill_file_that_fails_to_close_is_removed_all_the_same(tmp_path, monkeypatch):
    from srtscope.analyzers.spill import spill_writes, time_spool

    folder = tmp_path / "spill"
    sp = read_nsys_spilled(SAMPLES / "healthy.sqlite", folder=folder, chunk_rows=50)
    fake = _Faulty(1 << 62, close_errno=errno.ENOSPC)     # as a network file system reports a lost write
    monkeypatch.setattr(spill_writes, "os", fake)
    monkeypatch.setattr(time_spool, "os", fake)
    with pytest.raises(OSError, match="No space left"):
        sp.close()
    assert not list(folder.iterdir())


def test_bad_rows_and_bad_files_fail_as_read_nsys_does(tmp_path):
    bad = tmp_path / "bad.sqlite"
    shutil.copy(SAMPLES / "healthy.sqlite", bad)
    with sqlite3.connect(bad) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 5 WHERE rowid <= 3")
    with pytest.raises(TimelineError) as whole:
        read_nsys(bad)
    with pytest.raises(TimelineError) as spilled:
        read_nsys_spilled(bad, folder=tmp_path / "spill", chunk_rows=10, scan_rows=20)
    assert str(spilled.value) == str(whole.value) == "device table has 3 row(s) with end_ns < start_ns"
    assert not list((tmp_path / "spill").iterdir())
    text = tmp_path / "not.sqlite"
    sqlite3.connect(text).execute("CREATE TABLE t(x)").connection.close()
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        read_nsys_spilled(text, folder=tmp_path / "spill2")
    assert not (tmp_path / "spill2").exists()
    with pytest.raises(ValueError, match="chunk_rows"):
        read_nsys_spilled(SAMPLES / "healthy.sqlite", folder=tmp_path / "spill3", chunk_rows=0)


def test_progress_counts_the_rows_read_nsys_counts(generated, tmp_path):
    counts = []
    for read in (lambda: read_nsys(generated),
                 lambda: read_nsys_spilled(generated, folder=tmp_path / "s", scan_rows=40_000).close()):
        ticks: list[int] = []
        with columnar.report_scans(ticks.append):
            read()
        counts.append(sum(ticks))
    assert counts[0] == counts[1] > 400_000


def _spool_rows(starts: list[list[int]], bucket_rows: int, tmp_path: Path, hint=None) -> tuple[list, TimeSpool]:
    spool = TimeSpool(tmp_path, "t", bucket_rows, expect_rows=sum(map(len, starts)), hint_ns=hint)
    n = 0
    for part in starts:
        s = np.asarray(part, np.int64)
        spool.add({"start_ns": s, "end_ns": s + 1, "row": np.arange(n, n + len(s))})
        n += len(s)
    got = list(spool.chunks())
    assert max(len(b.segments) for b in spool.buckets) <= MAX_SEGMENTS
    spool.remove()
    assert not list(tmp_path.iterdir())
    return got, spool


_RNG = np.random.default_rng(7)


@pytest.mark.parametrize("case, starts, hint, bucket_rows", [
    ("arrival in time order", [list(range(0, 500, 1)), list(range(500, 1000))], None, 16),
    ("arrival in reverse", [list(range(1000, 500, -1)), list(range(500, 0, -1))], None, 16),
    ("random with many ties", [_RNG.integers(0, 40, 300).tolist() for _ in range(4)], None, 16),
    ("one start for every row", [[5] * 100, [5] * 77], None, 16),
    ("first chunk narrow, the rest far later", [[10, 11, 12], list(range(10**9, 10**9 + 600))], None, 16),
    ("wrong hint", [_RNG.integers(-10**6, 10**6, 700).tolist()], (5, 6), 16),
    # a later table's few rows spread over every bucket, chunk after chunk: segments merged
    ("thin rows over all buckets", [list(range(0, 2000, 2))] + [_RNG.integers(0, 2000, 12).tolist()
                                                                for _ in range(80)], None, 400),
])
def test_time_spool_gives_a_stable_sort_in_bounded_pieces(tmp_path, case, starts, hint, bucket_rows):
    got, spool = _spool_rows(starts, bucket_rows, tmp_path, hint)
    flat = np.concatenate([np.asarray(p, np.int64) for p in starts])
    order = np.argsort(flat, kind="stable")
    assert np.concatenate([c["row"] for c in got]).tolist() == order.tolist(), case
    assert np.concatenate([c["start_ns"] for c in got]).tolist() == flat[order].tolist()
    for c in got:
        assert len(c["row"]) <= bucket_rows or c["start_ns"][0] == c["start_ns"][-1], case


@pytest.mark.parametrize("case, ids, width", [
    ("every chunk's ids fit int32: int32 on disk and back", [[1, 2, 3], [2**31 - 1, -(2**31)]], np.int32),
    ("one chunk's id past int32: that chunk int64, the column back as int64", [[1, 2], [2**31, 5]], np.int64),
    ("the wide chunk first, narrow ones after", [[-(2**31) - 1], [7, 8, 9]], np.int64),
])
def test_narrow_columns_keep_their_values_across_widths(tmp_path, case, ids, width):
    # bucket_rows 2 with rows over the whole time span: splits and merges stream segments of both widths
    spool = TimeSpool(tmp_path, "t", 2, expect_rows=2, narrow=frozenset({"id"}))
    n, want = 0, []
    for chunk in ids * 6:
        s = (np.arange(len(chunk)) * 1000 + n * 7).astype(np.int64)[::-1].copy()
        spool.add({"start_ns": s, "end_ns": s + 1, "id": np.asarray(chunk, np.int64),
                   "row": np.arange(n, n + len(chunk))})
        want += list(zip(s.tolist(), range(n, n + len(chunk)), chunk))
        n += len(chunk)
    got = list(spool.chunks())
    rows = np.concatenate([c["row"] for c in got])
    ids_back = np.concatenate([c["id"] for c in got])
    by_row = {r: i for _, r, i in want}
    assert [by_row[int(r)] for r in rows] == ids_back.tolist(), case
    assert [r for _, r, _ in sorted(want, key=lambda t: t[0])] == rows.tolist(), case
    assert ids_back.dtype == width, case
    assert spool.id_range["id"] == (min(min(c) for c in ids), max(max(c) for c in ids))
    spool.remove()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("table, sql, refused", [
    # a text where a kernel's start belongs (a chunk may begin with it: its column then reads as text)
    ("CUPTI_ACTIVITY_KIND_KERNEL", "UPDATE {t} SET start = 'soon' WHERE rowid IN (8, 250)", True),
    # a real number where an integer belongs
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "UPDATE {t} SET end = 1.5 WHERE rowid = 7", True),
    # a blob as an NVTX range's end (the NVTX table is read whole, as read_nsys reads it)
    ("NVTX_EVENTS", "UPDATE {t} SET end = x'00ff' WHERE rowid = 2", True),
    # kernel names missing from StringIds: most of them (refused), one of them (a warning in meta)
    ("StringIds", "DELETE FROM {t} WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)", True),
    ("StringIds", "DELETE FROM {t} WHERE id = (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL "
                  "WHERE rowid = 5)", False),
])
def test_damaged_exports_fail_or_warn_as_read_nsys_does(tmp_path, table, sql, refused):
    bad = tmp_path / "bad.sqlite"
    shutil.copy(SAMPLES / "kernel_bound.sqlite", bad)
    with sqlite3.connect(bad) as con:
        con.executescript(sql.format(t=table))
    try:
        tl = read_nsys(bad)
    except (sqlite3.DatabaseError, ValueError) as whole:
        with pytest.raises(type(whole)) as spilled:
            read_nsys_spilled(bad, folder=tmp_path / "spill", chunk_rows=9, scan_rows=7)
        assert str(spilled.value).split(":")[0] == str(whole).split(":")[0]
        assert table in str(spilled.value) or "StringIds" in str(spilled.value)
        assert not list((tmp_path / "spill").iterdir())
        assert refused
        return
    assert not refused
    assert tl.meta.has_warning(WarningCode.CORRUPT)
    assert_same_as_read_nsys(bad, tmp_path / "spill", chunk_rows=9, scan_rows=7)


@pytest.mark.parametrize("case, chunks", [
    # a kernel chunk: one device, stream and process, no graphs; durations fit int32
    ("constant columns and short durations", [{"dev": [3] * 6, "dur": [5, 1, 0, 7, 2, 9]}]),
    # the same column constant in one segment, varying in the next (one bucket holds both)
    ("constant in one chunk only", [{"dev": [3] * 4, "dur": [1] * 4}, {"dev": [1, 2, 3, 4], "dur": [2] * 4}]),
    # two chunks constant at different values: no single value for the bucket
    ("two constants", [{"dev": [7] * 3, "dur": [1] * 3}, {"dev": [-(2**40)] * 3, "dur": [1] * 3}]),
    # a duration past int32 (a 3 s kernel) keeps end_ns as it is, as does an end before the start
    ("duration past int32", [{"dev": [0, 1], "dur": [3 * 10**9, 4]}]),
    ("end before start", [{"dev": [0, 1], "dur": [-5, 4]}]),
])
def test_time_spool_stores_less_and_gives_back_the_same_rows(tmp_path, case, chunks):
    spool = TimeSpool(tmp_path, "t", 1 << 10, expect_rows=100)
    want: dict[str, list] = {"start_ns": [], "end_ns": [], "dev": [], "row": []}
    n = 0
    for c in chunks:
        k = len(c["dev"])
        s = np.arange(n, n + k, dtype=np.int64) * 10 + 10**12
        cols = {"start_ns": s, "end_ns": s + np.asarray(c["dur"], np.int64),
                "dev": np.asarray(c["dev"], np.int64), "row": np.arange(n, n + k)}
        spool.add(cols)
        for name, v in cols.items():
            want[name] += v.tolist()
        n += k
    got = list(spool.chunks())
    for name, v in want.items():
        back = np.concatenate([g[name] for g in got])
        assert back.tolist() == v, (case, name)
        assert back.dtype == np.int64, (case, name)
    spool.remove()


def test_a_kernel_chunk_is_stored_in_under_an_eighth_of_its_bytes(tmp_path):
    # one device, stream, process, kind; no graph ids or bytes: only start, duration, name and
    # correlation vary (as in a kernel table's chunk)
    n = 100_000
    s = np.arange(n, dtype=np.int64) * 1000 + 10**15
    cols = {"start_ns": s, "end_ns": s + 700, "name": pd.Categorical(np.arange(n) % 13),
            "correlation": np.arange(n, dtype=np.int64)}
    cols |= {c: np.full(n, v, np.int64) for c, v in
             (("device", 0), ("stream", 7), ("pid", 4242), ("graph_id", -1), ("graph_node", -1), ("bytes", -1))}
    spool = TimeSpool(tmp_path, "t", 1 << 20, expect_rows=n, narrow=ID_COLUMNS)
    spool.add(cols)
    raw = sum(np.asarray(v).nbytes if not isinstance(v, pd.Categorical) else 4 * n for v in cols.values())
    stored = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert stored < raw / 8, (stored, raw)
    back = next(spool.chunks())
    assert back["end_ns"].tolist() == (s + 700).tolist()
    assert (back["stream"] == 7).all() and (back["graph_id"] == -1).all()
    spool.remove()
