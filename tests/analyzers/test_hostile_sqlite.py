"""Hostile SQLite exports (issue 14, items 2 and 3): a ``-wal`` log or a hot ``-journal`` beside the
file is refused with one line that says how to settle it, never read stale; structural corruption
(page swaps, flipped bits) is refused, never read as other data. The corpus is made here, in tmp_path."""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import srtscope.analyzers.readers.nsys_sqlite as nsys_sqlite
from sample_traces.nsys_schema import NsysWriter
from srtscope.analyzers.model.timeline import Timeline, WarningCode
from srtscope.analyzers.readers import TraceError, load_timeline
from tests.analyzers._cli import srtscope

N_KERNELS = 300
PAGE = 4096


def _export(path: Path) -> Path:
    """A small export: kernels, their launches and NVTX steps (a few dozen pages)."""
    w = NsysWriter(path)
    w.add_gpu()
    t = 1_000_000 + np.arange(N_KERNELS, dtype=np.int64) * 20_000
    names = [f"kernel_{i % 17}" for i in range(N_KERNELS)]
    w.add_kernels(t + 5_000, t + 15_000, names, correlation=np.arange(N_KERNELS))
    w.add_runtime(t, t + 3_000, ["cudaLaunchKernel"] * N_KERNELS, correlation=np.arange(N_KERNELS))
    w.add_nvtx(t[::10], t[::10] + 200_000, ["loop.step"] * (N_KERNELS // 10), domain="srtscope")
    return w.close()


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _canon(tl: Timeline) -> list:
    out = []
    for df in (tl.device, tl.api, tl.ranges):
        d = df.drop(columns=[c for c in ("attrs",) if c in df.columns]).astype(str)
        out.append(d.sort_values(list(d.columns)).reset_index(drop=True))
    return out


def _same(a: Timeline, b: Timeline) -> bool:
    return all(x.equals(y) for x, y in zip(_canon(a), _canon(b)))


@pytest.fixture
def export(tmp_path) -> Path:
    (tmp_path / "src").mkdir()
    return _export(tmp_path / "src" / "trace.sqlite")


def _crashed_copy(src: Path, dst: Path, mode: str) -> None:
    """``dst`` (+ its side file) as a crash would leave them: 36 kernels added and committed to a
    WAL (``mode="wal"``), or every kernel moved in a transaction still open, half written to the
    database file, with its hot journal (``"journal"``)."""
    con = sqlite3.connect(src, isolation_level=None)
    if mode == "wal":
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA wal_autocheckpoint=0")
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 36")
    else:
        con.execute("PRAGMA cache_size=1")   # spill: the database file is written mid-transaction
        con.execute("BEGIN")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 1")
    side = Path(f"{src}-{mode}")
    assert side.is_file() and side.stat().st_size > 32, side
    shutil.copy(src, dst)
    shutil.copy(side, f"{dst}-{mode}")
    con.close()


@pytest.mark.parametrize("mode", ["wal", "journal"])
def test_side_file_refused_then_settled(tmp_path, export, mode):
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    db = crashed / "trace.sqlite"
    _crashed_copy(export, db, mode)
    before = _digest(crashed)
    r = srtscope("diagnose", "--json", db)
    line = r.error_line(str(db), f"trace.sqlite-{mode}", "sqlite3")
    assert ("write-ahead log" if mode == "wal" else "hot rollback journal") in line
    assert _digest(crashed) == before          # nothing written, nothing created beside it
    with pytest.raises(TraceError, match=f"-{mode} lies beside it"):
        load_timeline([db])
    # the advice settles it: sqlite3 checkpoints the log, or rolls the torn write back
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    tl = load_timeline([db])
    assert len(tl.device) == N_KERNELS + (36 if mode == "wal" else 0)
    assert _same(load_timeline([export]), tl) if mode == "journal" else True   # rolled back


def test_harmless_side_files_are_no_reason_to_refuse(tmp_path, export):
    Path(f"{export}-wal").write_bytes(b"")                 # an empty log: nothing uncheckpointed
    Path(f"{export}-journal").write_bytes(bytes(512))      # a zeroed header: not hot
    assert len(load_timeline([export]).device) == N_KERNELS


def _swapped(data: bytes, i: int, j: int) -> bytes:
    b = bytearray(data)
    a, c = bytes(b[(i - 1) * PAGE:i * PAGE]), bytes(b[(j - 1) * PAGE:j * PAGE])
    b[(i - 1) * PAGE:i * PAGE], b[(j - 1) * PAGE:j * PAGE] = c, a
    return bytes(b)


def _flipped(data: bytes, off: int, bit: int) -> bytes:
    b = bytearray(data)
    b[off] ^= 1 << bit
    return bytes(b)


def _quick_check_ok(path: Path) -> bool:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return [r[0] for r in con.execute("PRAGMA quick_check")] == ["ok"]
    except sqlite3.DatabaseError:
        return False
    finally:
        con.close()


def _outcome(path: Path) -> Timeline | TraceError:
    try:
        return load_timeline([path], allow_no_kernels=True)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
        return exc


@pytest.mark.parametrize("big", [False, True], ids=["full_check", "big_file_mode"])
def test_page_swaps_never_read_as_other_data(tmp_path, export, monkeypatch, big):
    """Every page swap is refused, or reads exactly the original rows (two leaves of one table)."""
    if big:   # files over QUICK_CHECK_ALWAYS_BYTES: checked in full only when the read looks wrong
        monkeypatch.setattr(nsys_sqlite, "QUICK_CHECK_ALWAYS_BYTES", 0)
    data = export.read_bytes()
    pages = len(data) // PAGE
    orig = load_timeline([export])
    rnd = random.Random(14)
    pairs = sorted({tuple(sorted(rnd.sample(range(2, pages + 1), 2))) for _ in range(40)})
    refused = 0
    for i, j in pairs:
        p = tmp_path / f"swap_{i}_{j}.sqlite"
        p.write_bytes(_swapped(data, i, j))
        got = _outcome(p)
        if isinstance(got, TraceError):
            refused += 1
        else:
            assert _same(got, orig), f"pages {i} and {j} swapped were read as other data"
    assert refused >= len(pairs) // 2


def test_bit_flips_flagged_by_quick_check_are_refused(tmp_path, export):
    data = export.read_bytes()
    rnd = random.Random(3)
    flagged = 0
    for k in range(60):
        off, bit = rnd.randrange(100, len(data)), rnd.randrange(8)
        p = tmp_path / f"flip_{k}.sqlite"
        p.write_bytes(_flipped(data, off, bit))
        got = _outcome(p)                         # never another exception
        if not _quick_check_ok(p):
            flagged += 1
            assert isinstance(got, TraceError), f"byte {off} bit {bit}: corrupt, read as valid"
    assert flagged   # the sample holds structural damage


def test_corrupt_file_exits_2_with_one_line(tmp_path, export):
    data = export.read_bytes()
    for i, j in ((2, 10), (3, 12), (9, 20)):
        p = tmp_path / "bad.sqlite"
        p.write_bytes(_swapped(data, i, j))
        if isinstance(_outcome(p), TraceError) and not _quick_check_ok(p):
            break
    else:
        pytest.fail("no swap gave a corrupt file")
    r = srtscope("diagnose", "--json", p)
    r.error_line(str(p), "corrupt SQLite database", "quick_check")


def test_names_missing_from_string_ids(tmp_path, export):
    """Structurally sound, but kernel names point nowhere: a warning when a few, refused when most."""
    some = tmp_path / "some.sqlite"
    shutil.copy(export, some)
    con = sqlite3.connect(some)
    con.execute("DELETE FROM StringIds WHERE value = 'kernel_3'")
    con.commit()
    con.close()
    r = srtscope("diagnose", "--json", some)
    assert r.code == 0, r.stderr
    warnings = json.loads(r.stdout)["capture"]["warnings"]
    assert any(w["code"] == WarningCode.CORRUPT.value and "StringIds" in w["message"] for w in warnings)
    most = tmp_path / "most.sqlite"
    shutil.copy(export, most)
    con = sqlite3.connect(most)
    con.execute("DELETE FROM StringIds WHERE value LIKE 'kernel_%' OR value = 'cudaLaunchKernel'")
    con.commit()
    con.close()
    srtscope("diagnose", "--json", most).error_line(str(most), "not in StringIds")


@pytest.mark.parametrize("table,sql,needle", [
    # a text where a kernel's start belongs
    ("CUPTI_ACTIVITY_KIND_KERNEL", "UPDATE {t} SET start = 'soon' WHERE rowid = 250", "CUPTI_ACTIVITY_KIND_KERNEL"),
    # a real number where an integer belongs
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "UPDATE {t} SET end = 1.5 WHERE rowid = 7", "CUPTI_ACTIVITY_KIND_RUNTIME"),
    # a NULL start (the table rebuilt without its NOT NULL constraints): every row must have one
    ("CUPTI_ACTIVITY_KIND_KERNEL", "CREATE TABLE k AS SELECT * FROM {t}; DROP TABLE {t}; "
     "ALTER TABLE k RENAME TO {t}; UPDATE {t} SET start = NULL WHERE rowid = 3", "CUPTI_ACTIVITY_KIND_KERNEL"),
    # a blob as an NVTX range's end
    ("NVTX_EVENTS", "UPDATE {t} SET end = x'00ff' WHERE rowid = 2", "NVTX_EVENTS"),
])
def test_values_of_the_wrong_type_exit_2_naming_the_table(tmp_path, export, table, sql, needle):
    """Structurally sound, but a value is not the integer its column holds: refused with one line that
    names the table, never converted or skipped."""
    bad = tmp_path / "typed.sqlite"
    shutil.copy(export, bad)
    con = sqlite3.connect(bad)
    con.executescript(sql.format(t=table))
    con.commit()
    con.close()
    r = srtscope("diagnose", "--json", "--no-cache", bad)
    r.error_line(str(bad), needle)
