"""The windowed first pass runs its device pass beside an API pass: the same steps and counts.

Each scenario is a tiny timeline diagnosed whole and streamed in chunks (windows of 2 and 300 device
rows, chunks of 3 and 256 rows); the JSON must be equal. The API-steps scenario ends with launch
calls past the device's last end (a capture stopped before their kernels ran): the launches of the
last step are counted beside the device pass on a step open to the end of time, then trimmed to its
true end, or counted again on the final steps when the held starts outgrow their bound.
"""
from __future__ import annotations

import pytest

from srtscope.analyzers import windowed_first
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.params import DiagnoseParams
from srtscope.analyzers.timeline import Timeline
from srtscope.analyzers.windowed_stream import TimelineChunks, diagnose_streamed
from tests.analyzers._tl import api, kernel, rng, timeline

PARAMS = DiagnoseParams()
SIZES = ((2, 3), (300, 256))             # (device rows a window, rows a chunk)


def sync_steps_trailing_launches() -> Timeline:
    """Steps from the API rows: each step launches three kernels and waits (cudaStreamSynchronize);
    after the last kernel, four launches whose kernels the capture never saw, the last of them of no
    length: the step after the last sync ends where it starts, so it is no launch of that step."""
    dev, calls, corr = [], [], 0
    for n in range(8):
        t0 = 200 * n
        for j in range(3):
            corr += 1
            calls.append(api(t0 + 10 * j, t0 + 10 * j + 4, corr=corr))
            dev.append(kernel(t0 + 30 + 30 * j, t0 + 55 + 30 * j, corr=corr))
        calls.append(api(t0 + 40, t0 + 125, "cudaStreamSynchronize"))
    end = 200 * 7 + 120
    calls += [api(end + 20 + 5 * j, end + 22 + 5 * j, corr=100 + j) for j in range(3)] + [
        api(end + 40, end + 40, corr=103)]
    return timeline(dev, sorted(calls, key=lambda r: r["start_ns"]))


def range_steps_graph_launches() -> Timeline:
    """Steps from ranges; every step replays a CUDA graph (one graph launch, kernels sharing its
    correlation and no node ids): the device pass needs the graph launches' keys first."""
    dev, calls, rg = [], [], []
    for n in range(6):
        t0 = 100 * n
        rg.append(rng(t0, t0 + 100, "loop.step", step=n, mode="decode"))
        calls.append(api(t0 + 2, t0 + 6, "cudaGraphLaunch", corr=n + 1))
        dev += [kernel(t0 + 10 + 20 * j, t0 + 25 + 20 * j, corr=n + 1) for j in range(3)]
    return timeline(dev, calls, rg)


def range_steps_launches() -> Timeline:
    """Steps from ranges, plain launches: the two passes run at once."""
    dev, calls, rg = [], [], []
    for n in range(6):
        t0 = 100 * n
        rg.append(rng(t0, t0 + 100, "loop.step", step=n, mode="decode"))
        for j in range(2):
            c = 10 * n + j
            calls.append(api(t0 + 3 + 30 * j, t0 + 5 + 30 * j, corr=c))
            dev.append(kernel(t0 + 10 + 30 * j, t0 + 30 + 30 * j, corr=c))
    return timeline(dev, calls, rg)


SCENARIOS = {"sync_steps_trailing_launches": sync_steps_trailing_launches,
             "range_steps_graph_launches": range_steps_graph_launches,
             "range_steps_launches": range_steps_launches}


@pytest.mark.parametrize("tail", ["held", "outgrown"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_streamed_first_pass_equals_whole(name: str, tail: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tl = SCENARIOS[name]()
    whole = diagnose(tl, PARAMS).to_json()
    if tail == "outgrown":
        monkeypatch.setattr(windowed_first._Tail, "MAX_TAIL", 0)
    for rows, chunk in SIZES:
        assert diagnose_streamed(TimelineChunks(tl, chunk), PARAMS, rows).to_json() == whole, (rows, chunk)


def test_scenarios_are_what_they_say() -> None:
    """The API-steps scenario's steps come from its sync points and its last call is no step's (the
    trim has work to do); the graph scenario's kernels count as graph kernels through the launch's
    key alone."""
    tl = sync_steps_trailing_launches()
    doc = diagnose(tl, PARAMS).to_json()
    assert doc["steps"]["source"] == "sync" and doc["steps"]["count"] >= 7
    src = TimelineChunks(tl, 3)
    first = windowed_first.first_pass(src, Timeline(tl.device.iloc[:0], tl.api.iloc[:0], tl.ranges,
                                                    tl.counters, tl.meta), None, PARAMS)
    launches = int(first.counts["launches"].sum())
    assert launches == 24 + 3              # the trailing call of no length is in no step
    g = range_steps_graph_launches()
    assert TimelineChunks(g, 3).graph_launches and not TimelineChunks(range_steps_launches(), 3).graph_launches
    gsrc = TimelineChunks(g, 3)
    from srtscope.analyzers.analyses.steps import step_windows
    small = Timeline(g.device.iloc[:0], g.api.iloc[:0], g.ranges, g.counters, g.meta)
    gfirst = windowed_first.first_pass(gsrc, small, step_windows(small, PARAMS.step_rule), PARAMS)
    assert int(gfirst.counts["graph_kernels"].sum()) == 18
