"""``load_timeline(jobs=N)`` / ``diagnose --jobs N``: rank files read in a process pool give the same
Timeline and the same JSON as one after another."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas.testing as pdt
import pytest
from typer.testing import CliRunner

from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
RANKS = [SAMPLES / "comm_straggler.rank0.sqlite", SAMPLES / "comm_straggler.rank1.sqlite"]


def _same(a, b) -> None:
    for t in ("device", "api", "ranges", "counters"):
        pdt.assert_frame_equal(getattr(a, t), getattr(b, t))
    assert a.meta == b.meta


def test_parallel_read_is_the_same_timeline():
    _same(load_timeline(RANKS), load_timeline(RANKS, jobs=2))


def test_unnamed_files_get_the_same_ranks(tmp_path):
    """Ranks of files without ``rank<N>`` in their name follow the previous file's: the same in parallel."""
    files = []
    for i, src in enumerate(RANKS + [SAMPLES / "healthy.sqlite"]):
        p = tmp_path / f"part{'abc'[i]}.sqlite"
        shutil.copyfile(src, p)
        files.append(p)
    seq = load_timeline(files[:2])
    par = load_timeline(files[:2], jobs=2)
    _same(seq, par)
    assert par.meta.ranks == [0, 1]


def test_a_bad_file_fails_the_same_way(tmp_path):
    bad = tmp_path / "rank1.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    with pytest.raises(TraceError) as seq:
        load_timeline([RANKS[0], bad])
    with pytest.raises(TraceError) as par:
        load_timeline([RANKS[0], bad], jobs=2)
    assert str(seq.value) == str(par.value)


def test_progress_reaches_one():
    seen: list[float] = []
    load_timeline(RANKS, progress=lambda f, what: seen.append(f), jobs=2)
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)


def test_diagnose_json_identical_with_jobs(tmp_path):
    def run(*args: str) -> dict:
        r = CliRunner().invoke(app, ["diagnose", "--json", *args, *map(str, RANKS)])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    assert run("--no-cache") == run("--no-cache", "--jobs", "2") == run("--jobs", "3")


def test_jobs_must_be_positive():
    r = CliRunner().invoke(app, ["diagnose", "--json", "--jobs", "0", str(RANKS[0])])
    assert r.exit_code == 2


@pytest.mark.parametrize("cores,jobs,files,expected", [
    (2, 2, 8, 1),      # a 2-core machine: each read already uses both cores, one process reads
    (2, 8, 8, 1),
    (16, 4, 8, 4),     # room for the processes asked for
    (16, 32, 8, 8),    # never more than one per file
    (16, 32, 20, 8),   # at most one per two cores
    (1, 4, 8, 1),
])
def test_jobs_the_machine_can_run(monkeypatch, cores, jobs, files, expected):
    from srtscope.analyzers import traces

    monkeypatch.setattr(traces, "usable_cores", lambda: cores)
    assert traces.reading_processes(jobs, files) == expected


def test_trace_reading_asks_no_huge_pages_for_arrays():
    """``keep_freed_memory`` (a trace read): numpy's arrays no longer ask for transparent huge pages."""
    import numpy as np

    from srtscope.cli.loading import keep_freed_memory

    advise = getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)
    if advise is None:
        pytest.skip("this numpy has no huge-page switch")
    before = advise(True)
    try:
        keep_freed_memory()
        assert advise(True) is False
    finally:
        advise(before)
