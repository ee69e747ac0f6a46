"""Plumbing of ``benchmarks/spill_read.py`` on a tiny generated export: both reads measured (wall,
CPU, peak RSS) in their own processes, their row counts and sums agreeing, the spill folder beside the
export removed; a whole read the memory would not hold is skipped and said. No timing asserted."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
import common as C  # noqa: E402


def test_spill_read_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(C, "CACHE", tmp_path)
    from benchmarks import spill_read

    rows = spill_read.measure(2, runs=1, chunk_rows=5000, keep_freed=False)
    assert [r[1] for r in rows] == ["read_nsys (whole)", "read_nsys_spilled + both iterators"]
    for r in rows:
        assert r[2].endswith(" s") and r[5].endswith(" MiB"), r       # wall and peak RSS measured
    assert rows[1][-1].startswith("sums agree"), rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nsys_2mb.v2.sqlite"]   # no spill folder left


def test_whole_read_skipped_where_memory_would_not_hold_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(C, "CACHE", tmp_path)
    from benchmarks import spill_read

    monkeypatch.setattr(spill_read, "_available_gib", lambda: 0.5)
    rows = spill_read.measure(2, runs=1, chunk_rows=None, keep_freed=False)
    assert rows[0][-1] == "skipped" and rows[1][-1].startswith("no whole read to compare"), rows
    assert "whole: skipped, needs ~2 GiB, 0 GiB available" in capsys.readouterr().out
