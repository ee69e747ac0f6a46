"""Steps from the API rows fed a chunk at a time (``api_steps.ApiSteps``) are ``step_windows``' steps.

Tiny timelines, one per edge case, give the expected steps by hand; each is cut into chunks of 1, 2,
3 and 256 rows (every call and every tie split across chunks) and diagnosed whole and streamed. Every
sample and real trace, its ranges left out so that its API rows give the steps, is checked the same
way with chunks of 25 and 256 rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.analyses.api_steps import ApiSteps
from srtscope.analyzers.analyses.host_threads import default_threads
from srtscope.analyzers.analyses.steps import StepRule, api_step_windows, step_windows
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.pipeline.stream import NotWindowable, TimelineChunks, diagnose_streamed
from srtscope.analyzers.readers import load_timeline
from tests.analyzers._tl import US, api, kernel, rng, timeline

REPO = Path(__file__).resolve().parents[2]
REAL = REPO.parent / "shared" / "traces" / "real" / "nsys"
TRACES = (sorted((REPO / "sample_traces").glob("*.sqlite")) + sorted((REPO / "sample_traces").glob("**/*.json.gz"))
          + (sorted(REAL.iterdir()) if REAL.is_dir() else []))
SYNC = "cudaStreamSynchronize"
COPY = "cudaMemcpy"                     # a synchronous copy blocks like a sync


def _launches(t0: float, n: int = 3, tid: int = 1, rank: int = 0) -> list[dict]:
    return [api(t0 + 10 * i, t0 + 10 * i + 4, tid=tid, rank=rank) for i in range(n)]


def _streamed(tl: Timeline, chunk: int, rule: StepRule | None = None) -> tuple[str, pd.DataFrame]:
    rule = rule or StepRule()
    steps = ApiSteps(rule.gap_ns)
    for a in TimelineChunks(tl, chunk).iter_api():
        steps.add(a)
    dev = tl.device
    ends = {int(r): int(e) for r, e in dev.groupby("rank")["end_ns"].max().items()} if len(dev) else {}
    return api_step_windows(steps.close(), default_threads(tl), ends)


def _bounds(w: pd.DataFrame) -> list[tuple[int, int, int, int, int]]:
    return [tuple(int(x) for x in row) for row in w[["rank", "pid", "tid", "start_ns", "end_ns"]].to_numpy()]


# (scenario, device rows, API rows, expected source, expected steps (start, end) in us)
CASES = [
    ("a sync per step: steps run from the first launch to each sync's end",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC)] + _launches(1000) + [api(1100, 1900, SYNC)] + _launches(2000)
     + [api(2100, 2900, SYNC)],
     "sync", [(0, 900), (900, 1900), (1900, 2900)]),
    ("overlapping blocking calls (a copy inside a sync) end one step, at the later end",
     [kernel(5, 50)],
     _launches(0) + [api(100, 700, SYNC), api(300, 900, COPY)] + _launches(1000)
     + [api(1100, 1500, COPY), api(1500, 1900, SYNC)] + _launches(2000),
     "sync", [(0, 900), (900, 1900), (1900, 2024)]),
    ("a sync before the first launch bounds nothing; one still open at the first launch does",
     [kernel(5, 50)],
     [api(0, 50, SYNC), api(80, 115, SYNC)] + _launches(100) + [api(300, 900, SYNC)] + _launches(1000)
     + [api(1100, 1900, SYNC)] + _launches(2000),
     "sync", [(100, 115), (115, 900), (900, 1900), (1900, 2024)]),
    ("a step with no launch (two syncs in a row) is dropped",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC), api(950, 1000, SYNC)] + _launches(1100) + [api(1200, 1900, SYNC)]
     + _launches(2000),
     "sync", [(0, 900), (1000, 1900), (1900, 2024)]),
    ("the last step runs to the device's last end",
     [kernel(5, 50), kernel(2010, 2600)],
     _launches(0) + [api(100, 900, SYNC)] + _launches(1000) + [api(1100, 1900, SYNC)] + _launches(2000),
     "sync", [(0, 900), (900, 1900), (1900, 2600)]),
    ("a call at a sync's end extends it (a tie that chunks may split): the launch there is inside",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC), api(900, 904), api(900, 1500, SYNC), api(1600, 1604),
                     api(1700, 1800, SYNC), api(1900, 1904)],
     "sync", [(0, 1500), (1500, 1800), (1800, 1904)]),
    ("a launch right at a sync's end starts the next step (the chunk may end at that launch)",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC), api(900, 904), api(1100, 1900, SYNC), api(2000, 2004)],
     "sync", [(0, 900), (900, 1900), (1900, 2004)]),
    ("a zero-length launch at the very end starts no step of its own (sync)",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC)] + _launches(1000) + [api(1100, 1200, SYNC), api(1300, 1300)],
     "sync", [(0, 900), (900, 1200)]),
    ("zero-length syncs are no sync points: launch bursts",
     [kernel(5, 50)],
     _launches(0) + [api(100, 100, SYNC)] + _launches(1000) + [api(1100, 1100, SYNC)] + _launches(2000),
     "bursts", [(0, 1000), (1000, 2000), (2000, 2024)]),
    ("one sync point is not enough: launch bursts apart by more than the gap",
     [kernel(5, 50)],
     _launches(0) + [api(100, 900, SYNC)] + _launches(1000) + _launches(2000),
     "bursts", [(0, 1000), (1000, 2000), (2000, 2024)]),
    ("overlapping launch calls: a burst goes on while an earlier call has not ended",
     [kernel(5, 50)],
     [api(0, 900), api(100, 110), api(500, 510), api(1000, 1010), api(1500, 1510), api(1505, 1700),
      api(1850, 1860)],
     "bursts", [(0, 1500), (1500, 1860)]),
    ("a zero-length launch at the very end starts no step of its own (bursts)",
     [kernel(5, 50)],
     _launches(0) + _launches(1000) + [api(2000, 2000)],
     "bursts", [(0, 1000), (1000, 2000)]),
    ("several threads launch: the one with most launches gives the steps, its syncs only",
     [kernel(5, 50)],
     _launches(0, 4) + _launches(0, 2, tid=2) + [api(100, 900, SYNC), api(150, 400, SYNC, tid=2)]
     + _launches(1000, 4) + [api(1050, 1060, tid=2), api(1100, 1900, SYNC), api(1950, 1990, SYNC, tid=2)]
     + _launches(2000, 4),
     "sync", [(0, 900), (900, 1900), (1900, 2034)]),
    ("no launch at all: no steps", [kernel(5, 50)], [api(100, 900, SYNC), api(1000, 1900, SYNC)], "none", []),
    ("no API rows: no steps", [kernel(5, 50)], [], "none", []),
]


@pytest.mark.parametrize("why, device, apis, source, want", CASES, ids=[c[0][:40] for c in CASES])
def test_streamed_steps_are_the_whole_reads(why: str, device: list, apis: list, source: str,
                                            want: list[tuple[int, int]]) -> None:
    tl = timeline(device, apis)
    got_source, whole = step_windows(tl)
    assert (got_source, _bounds(whole)) == (source, [(0, 100, 1, s * US, e * US) for s, e in want])
    for chunk in (1, 2, 3, 256):
        streamed_source, streamed = _streamed(tl, chunk)
        assert (streamed_source, _bounds(streamed)) == (source, _bounds(whole)), f"chunks of {chunk}"


@pytest.mark.parametrize("why, device, apis, source, want", CASES, ids=[c[0][:40] for c in CASES])
def test_streamed_diagnosis_of_api_steps_is_the_whole(why: str, device: list, apis: list, source: str,
                                                      want: list) -> None:
    tl = timeline(device, apis)
    whole = diagnose(tl, DiagnoseParams()).to_json()
    for rows, chunk in ((1, 1), (2, 3), (500, 256)):
        got = diagnose_streamed(TimelineChunks(tl, chunk), DiagnoseParams(), rows).to_json()
        assert got == whole, f"{rows} rows a window, chunks of {chunk}"


def test_a_graph_kernel_starting_at_the_devices_last_end_is_outside_the_last_step() -> None:
    # scenario: the last step runs to the device's last end, where a zero-length graph kernel starts:
    # ``[start, end)`` leaves it out; the streamed first pass counts before that end is known
    tl = timeline([kernel(5, 50, graph_id=1), kernel(2010, 2600, graph_id=1), kernel(2600, 2600, graph_id=1)],
                  _launches(0) + [api(100, 900, SYNC)] + _launches(1000) + [api(1100, 1900, SYNC)] + _launches(2000))
    whole = diagnose(tl, DiagnoseParams())
    t = whole.steps.table
    assert t["graph_kernels"].tolist() == [1, 0, 1] and t["end_ns"].tolist()[-1] == 2600 * US
    for chunk in (1, 2, 256):
        assert diagnose_streamed(TimelineChunks(tl, chunk), DiagnoseParams(), 1).to_json() == whole.to_json()


def test_two_ranks_steps_per_rank() -> None:
    # scenario: two ranks in one timeline: each rank's steps from its own thread and device end
    apis = (_launches(0) + [api(100, 900, SYNC)] + _launches(1000) + [api(1100, 1900, SYNC)] + _launches(2000)
            + _launches(5, rank=1) + _launches(1005, rank=1) + _launches(2005, rank=1))
    tl = timeline([kernel(5, 50), kernel(2100, 2200, rank=1)], apis, ranks=(0, 1))
    source, whole = step_windows(tl)
    assert source == "bursts"                    # one rank's steps are bursts: the trace says so
    assert _bounds(whole) == [(0, 100, 1, 0, 900 * US), (0, 100, 1, 900 * US, 1900 * US),
                              (0, 100, 1, 1900 * US, 2024 * US), (1, 100, 1, 5 * US, 1005 * US),
                              (1, 100, 1, 1005 * US, 2005 * US), (1, 100, 1, 2005 * US, 2200 * US)]
    for chunk in (1, 3, 256):
        assert _streamed(tl, chunk)[0] == source and _bounds(_streamed(tl, chunk)[1]) == _bounds(whole)
    whole = diagnose(tl, DiagnoseParams()).to_json()
    for chunk, rows in ((3, 2), (256, 300)):
        assert diagnose_streamed(TimelineChunks(tl, chunk), DiagnoseParams(), rows).to_json() == whole


def test_steps_that_need_the_device_rows_are_not_windowed() -> None:
    # scenario: SGLang's step openers and no forward range: the device rows say which openers begin
    # a step, and the first pass has not read them yet
    tl = timeline([kernel(50, 90)], _launches(45), [rng(0, 40, "scheduler.get_next_batch_to_run"),
                                                   rng(120, 150, "scheduler.get_next_batch_to_run")])
    assert step_windows(tl)[0] == "sglang"
    with pytest.raises(NotWindowable, match="'sglang' need the device rows"):
        diagnose_streamed(TimelineChunks(tl, 3), DiagnoseParams(), 2)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_streamed_steps_of_every_trace(path: Path) -> None:
    """The trace's API rows give the steps (its ranges left out): the same, fed in chunks."""
    full = load_timeline([path])
    tl = Timeline(full.device, full.api, full.ranges.iloc[:0], full.counters, full.meta)
    for rule in (StepRule(), StepRule(gap_ns=5_000)):
        source, whole = step_windows(tl, rule)
        assert source in ("sync", "bursts", "none")
        assert (source == "none") == (not len(whole))
        assert np.all(whole["end_ns"].to_numpy() > whole["start_ns"].to_numpy())
        for chunk in (25, 256):
            got_source, got = _streamed(tl, chunk, rule)
            assert (got_source, _bounds(got)) == (source, _bounds(whole)), f"chunks of {chunk}, {rule}"
