"""How a diagnosis over the budget is cut: window rows and walks (``analyzers/traces.walks``) keep both
processes' modelled peak within the budget, two walks only where each keeps ``MIN_SPLIT_ROWS``."""
from __future__ import annotations

import pytest

from srtscope.analyzers.pipeline.stream import Held
from srtscope.analyzers.traces import (
    BASE_BYTES,
    MATCH_ROW_BYTES,
    MAX_ROWS,
    MEASURED_ROW_BYTES,
    MIN_ROWS,
    MIN_SPLIT_ROWS,
    PART_STEP_BYTES,
    PER_GB_BYTES,
    ROW_BYTES,
    TRIMMED_BASE_BYTES,
    TRIMMED_PER_GB_BYTES,
    TWO_WALK_ROW_BYTES,
    WALKS_ENV,
    WINDOW_BYTES,
    modelled_peak,
    reduction_peak,
    resized,
    walks,
    window_rows,
)

GiB = 1 << 30


def _peak(export_gb: float, rows: int, processes: int) -> float:
    """Both processes' modelled peak: each its held part (trimmed at the fork for two) and window."""
    if processes == 1:
        return BASE_BYTES + PER_GB_BYTES * export_gb + rows * ROW_BYTES
    return 2 * (TRIMMED_BASE_BYTES + TRIMMED_PER_GB_BYTES * export_gb + rows * TWO_WALK_ROW_BYTES)


@pytest.mark.parametrize("case, budget, export_gb, want_walks", [
    ("3 GB under 2 GiB: two walks, each window past the split floor", 2 * GiB, 3, 2),
    ("5 GB under 2 GiB: still two", 2 * GiB, 5, 2),
    ("10 GB under 2 GiB: both processes' held part leaves too little: one walk", 2 * GiB, 10, 1),
    ("3 GB under 1 GiB: one walk", GiB, 3, 1),
    ("3 GB under 8 GiB: two walks of the largest windows", 8 * GiB, 3, 2),
])
def test_walks_keep_the_modelled_peak_within_the_budget(monkeypatch, case, budget, export_gb, want_walks):
    monkeypatch.delenv(WALKS_ENV, raising=False)
    monkeypatch.setattr("srtscope.analyzers.traces.available", lambda: True)
    rows, n = walks(budget, int(export_gb * 1e9))
    assert n == want_walks, case
    assert MIN_ROWS <= rows <= MAX_ROWS, case
    if rows > MIN_ROWS:           # the floor of rows may pass a budget too small for any window
        assert _peak(export_gb, rows, n) <= budget, case
    if n == 2:
        assert rows >= MIN_SPLIT_ROWS, case
    # one walk is never given fewer rows than each of two would hold
    monkeypatch.setenv(WALKS_ENV, "1")
    assert walks(budget, int(export_gb * 1e9))[0] >= rows, case


@pytest.mark.parametrize("env, fork, want", [("1", True, 1), ("2", True, 2), ("2", False, 1), ("", False, 1)])
def test_walks_follow_the_switch_and_a_fork(monkeypatch, env, fork, want):
    monkeypatch.setenv(WALKS_ENV, env)
    monkeypatch.setattr("srtscope.analyzers.traces.available", lambda: fork)
    assert walks(2 * GiB, int(10e9))[1] == want


@pytest.mark.parametrize("case, budget, export_gb, over", [
    ("10 GB under 2 GiB: within", 2 * GiB, 10, False),
    ("3 GB under 2 GiB, two walks: within", 2 * GiB, 3, False),
    ("10 GB under 1 GiB: the held part alone nearly fills it; the fewest rows pass it", GiB, 10, True),
    ("100 MB under 200 MiB: below the interpreter and libraries", 200 << 20, 0.1, True),
])
def test_the_modelled_peak_says_when_a_budget_cannot_be_kept(monkeypatch, case, budget, export_gb, over):
    """``diagnose_traces`` in windows notes a budget its smallest windows still pass (``modelled_peak``)."""
    monkeypatch.delenv(WALKS_ENV, raising=False)
    monkeypatch.setattr("srtscope.analyzers.traces.available", lambda: True)
    rows, n = walks(budget, int(export_gb * 1e9))
    assert (modelled_peak(int(export_gb * 1e9), rows, n) > budget) == over, case
    assert modelled_peak(int(export_gb * 1e9), rows, n) == pytest.approx(_peak(export_gb, rows, n), abs=n), case


MiB = 1 << 20


@pytest.mark.parametrize("case, budget, export_gb, planned, held, steps, collectives, want_walks, smaller, over", [
    ("held as the model expects: the windows planned", 2 * GiB, 3, (1_000_000, 2), 300 * MiB, 10_000, 0,
     2, False, False),
    ("a two-rank export's collectives held whole: each window smaller", 2 * GiB, 3, (1_000_000, 2), 550 * MiB,
     10_000, 2_000_000, 2, True, False),
    ("held leaves two walks too little: one walk, its windows sized for one", 2 * GiB, 3, (1_000_000, 2),
     800 * MiB, 10_000, 0, 1, False, False),
    ("planned as one walk: never two", 2 * GiB, 1, (2_000_000, 1), 100 * MiB, 10_000, 0, 1, False, False),
    ("held past the budget: the fewest rows, said", 700 * MiB, 2, (417_000, 1), 434 * MiB, 86_000, 2_850_000,
     1, True, True),
    ("a million steps: the parts they keep leave one walk, and their reduction passes the budget, said",
     2 * GiB, 3, (1_000_000, 2), 365 * MiB, 1_000_000, 0, 1, True, True),
])
def test_windows_are_sized_again_from_what_the_first_pass_left(
        monkeypatch, case, budget, export_gb, planned, held, steps, collectives, want_walks, smaller, over):
    """``resized``: after the first pass the model's held part is the measured one with the steps'
    share of the windows' parts where that is more; the windows never grow past the plan, and a
    budget the smallest windows or the reduction pass is noted once."""
    monkeypatch.delenv(WALKS_ENV, raising=False)
    monkeypatch.setattr("srtscope.analyzers.traces.available", lambda: True)
    size, noted, first = int(export_gb * 1e9), [], Held(held, steps, collectives)
    rows, n = resized(budget, size, noted.append)(first, *planned)
    assert n == want_walks, case
    assert (rows < planned[0]) == smaller or n != planned[1], case
    assert rows <= max(planned[0], window_rows(budget, size, 1, first)), case
    assert rows >= MIN_ROWS, case
    peak = modelled_peak(size, rows, n, first)
    assert peak >= reduction_peak(first) >= held + 2 * PART_STEP_BYTES * steps + MATCH_ROW_BYTES * collectives, case
    assert peak >= n * (held + PART_STEP_BYTES * steps / n + WINDOW_BYTES + rows * MEASURED_ROW_BYTES), case
    if rows > MIN_ROWS and reduction_peak(first) <= budget:
        assert peak <= budget, case
    assert bool(noted) == over, case
    if over:
        assert noted == [peak], case


@pytest.mark.parametrize("case, held, want_mib", [
    # a small Kineto trace of one step (no device row before its last step) and 17,681 ranges, as the
    # vLLM ROCm trace among the real ones: its windows hold those ranges at most, not their share of
    # 100,000 rows each (the note had said 253,296 MiB)
    ("one step, many ranges: every range, once", Held(145 * MiB, 1, 0, 17_681, 0), 145 + 200 + 29 + 3),
    # a trace of 2,000 device rows: a window of the fewest rows still holds only those and their ranges
    ("fewer device rows than the smallest window: those rows", Held(145 * MiB, 10, 0, 20_000, 2_000),
     145 + 200 + 1 + 3),
])
def test_the_modelled_peak_counts_no_more_rows_than_the_trace_has(case, held, want_mib):
    """``modelled_peak`` after the first pass: a window's rows and ranges bounded by the trace's."""
    peak = modelled_peak(2_000_000, MIN_ROWS, 1, held)
    assert peak >> 20 == pytest.approx(want_mib, abs=1), case
