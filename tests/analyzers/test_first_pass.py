"""The windowed first pass runs its device pass beside an API pass: the same steps and counts.

Each scenario is a tiny timeline diagnosed whole and streamed in chunks (windows of 2 and 300 device
rows, chunks of 3 and 256 rows); the JSON must be equal. The API-steps scenario ends with launch
calls past the device's last end (a capture stopped before their kernels ran): the launches of the
last step are counted beside the device pass on a step open to the end of time, then trimmed to its
true end, or counted again on the final steps when the held starts outgrow their bound.
"""
from __future__ import annotations

import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.pipeline import first_pass as first_pass
from srtscope.analyzers.pipeline.stream import TimelineChunks, diagnose_streamed
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
        monkeypatch.setattr(first_pass._Tail, "MAX_TAIL", 0)
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
    first = first_pass.first_pass(src, Timeline(tl.device.iloc[:0], tl.api.iloc[:0], tl.ranges,
                                                    tl.counters, tl.meta), None, PARAMS)
    launches = int(first.counts["launches"].sum())
    assert launches == 24 + 3              # the trailing call of no length is in no step
    g = range_steps_graph_launches()
    assert TimelineChunks(g, 3).graph_launches and not TimelineChunks(range_steps_launches(), 3).graph_launches
    gsrc = TimelineChunks(g, 3)
    from srtscope.analyzers.analyses.steps import step_windows
    small = Timeline(g.device.iloc[:0], g.api.iloc[:0], g.ranges, g.counters, g.meta)
    gfirst = first_pass.first_pass(gsrc, small, step_windows(small, PARAMS.step_rule), PARAMS)
    assert int(gfirst.counts["graph_kernels"].sum()) == 18


class _Failing(TimelineChunks):
    """Chunks of ``tl``; the ``fail`` table raises at its ``at``-th chunk (counted over every pass
    of it); counts the chunks given."""

    def __init__(self, tl: Timeline, rows: int, fail: str, at: int) -> None:
        super().__init__(tl, rows)
        self.fail, self.at = fail, at
        self.given = {"device": 0, "api": 0}

    def _count(self, table: str, chunks):
        for c in chunks:
            if table == self.fail and self.given[table] == self.at:
                raise OSError(f"{table} chunk {self.at} unreadable")
            self.given[table] += 1
            yield c

    def iter_device(self):
        return self._count("device", super().iter_device())

    def iter_api(self):
        return self._count("api", super().iter_api())


@pytest.mark.parametrize("fail", ["device", "api"])
@pytest.mark.parametrize("name", ["range_steps_launches", "sync_steps_trailing_launches"])
def test_a_failing_pass_stops_the_other(name: str, fail: str) -> None:
    """The pass beside a failing one stops at its next chunk (no reading on for nothing), and the
    error is the failing pass's. ``range_steps_launches`` runs the device pass beside the API pass;
    ``sync_steps_trailing_launches`` beside the launches-per-step pass (its first API pass alone)."""
    import threading

    tl = SCENARIOS[name]()
    total = {"device": len(tl.device), "api": len(tl.api)}
    # the sync scenario's first API pass runs alone: fail in the API pass beside the device pass
    at = total["api"] + 2 if name.startswith("sync") and fail == "api" else 2
    src = _Failing(tl, 1, fail, at)
    other = "api" if fail == "device" else "device"
    gate = threading.Event()
    orig = src._count

    def slow(table, chunks):      # the other side reads slowly: the stop reaches it before its end
        for c in orig(table, chunks):
            if table == other:
                gate.wait(0.05)
            yield c
    src._count = slow  # type: ignore[method-assign]
    with pytest.raises(OSError, match=f"{fail} chunk {at} unreadable"):
        diagnose_streamed(src, PARAMS, 300)
    read = src.given[other] - (total["api"] if name.startswith("sync") and other == "api" else 0)
    assert read < total[other]
