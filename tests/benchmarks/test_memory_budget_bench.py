"""Plumbing of ``benchmarks/memory_budget.py`` on a small generated export: the whole run beside the
estimate, and a run over a budget that is within it and says which window it diagnosed."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def test_memory_budget_rows(tmp_path, capsys):
    from benchmarks import memory_budget
    from benchmarks.gen_nsys import generate
    from srtscope.analyzers.model.timeline import SourceFormat
    from srtscope.analyzers.readers.memory_estimate import estimate

    path = tmp_path / "t.sqlite"
    generate(path, 20)
    est = estimate(path, SourceFormat.NSYS_SQLITE)
    rows = memory_budget.measure(path, str(est.peak_bytes - (1 << 20)), fill=False)
    assert [r[1] for r in rows] == ["whole (--no-cache)", f"--memory-budget {est.peak_bytes - (1 << 20)}"]
    # NOTE: no ratio and no "within the budget" asserted: a child of this (large) test process starts
    # with its pages, so its peak RSS is this process's here (the benchmark's own process is small)
    assert float(rows[0][6]) > 0 and rows[0][5] == f"{est.peak_bytes / 2**20:.0f} MiB"
    assert "the budget; whole, in windows: JSON identical" in rows[1][7]
