"""Plumbing of ``benchmarks/scale_memory.py`` on a tiny generated export: every run measured (wall,
CPU, system time, peak RSS), the floor runs, the three looks give the same JSON. No timing asserted."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
import common as C  # noqa: E402


def test_floor_command_reads_the_columns_into_dev_null(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.gen_nsys import generate

    path = tmp_path / "t.sqlite"
    generate(path, 0.5)
    r = C.run_wait4(C.floor_command(path))
    assert r.rc == 0, r.stderr
    assert r.cpu_s >= r.sys_s >= 0 and r.maxrss_mb > 0


def test_scale_memory_rows(tmp_path, monkeypatch, capsys):
    """Over a budget the export's whole read would exceed, the bounded looks (diagnosed window by
    window) give the whole read's JSON."""
    monkeypatch.setattr(C, "CACHE", tmp_path)
    from benchmarks import scale_memory

    rows = scale_memory.measure(1, runs=1, whole_up_to=10, budget="100MiB")
    assert rows is not None and [r[1] for r in rows] == [
        "floor: sqlite3 shell", "first look, 100MiB (--no-cache)", "first look filling the cache, 100MiB",
        "second look (cache)", "whole-trace read (--memory-budget none)"]
    for r in rows:
        assert r[2].endswith(" s") and r[5].endswith(" MiB"), r       # wall and peak RSS measured
    assert all("JSON identical;" in r[-1] for r in rows[1:]), rows  # whole run compared too
    assert (tmp_path / "nsys_1mb.v2.sqlite").exists()                     # kept for the next run
    assert not (tmp_path / "scale-memory-cache-1").exists()            # its private cache removed


def test_scale_memory_skips_a_size_the_disk_cannot_hold(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(C, "CACHE", tmp_path)
    from benchmarks import scale_memory

    assert scale_memory.measure(10 ** 9, runs=1, whole_up_to=0) is None               # a petabyte
    assert "skipped, not enough free disk" in capsys.readouterr().out
