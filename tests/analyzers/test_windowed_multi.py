"""The windowed diagnosis of traces with several ranks and devices in one file is the whole one.

Tiny timelines, one per scenario the multi-device windows must get right, and the sample traces of
two ranks read together: diagnosed whole, windowed in memory and streamed in chunks, with windows of
2 and 300 device rows and chunks of 25 and 256 rows; the JSON documents must be equal. The figures
the scenarios exist for are checked to be there (a straggler named, a primary device that is not the
first, ...), and each window's device rows stay bounded while a device idles.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.pipeline import stream as stream
from srtscope.analyzers.pipeline.devices import DeviceScan
from srtscope.analyzers.pipeline.reduce import diagnose_windowed
from srtscope.analyzers.pipeline.stream import TimelineChunks, diagnose_streamed
from srtscope.analyzers.pipeline.window import plan, rank_edges
from srtscope.analyzers.readers import load_timeline
from tests.analyzers._tl import api, kernel, rng, timeline

REPO = Path(__file__).resolve().parents[2]
PARAMS = DiagnoseParams()
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
WINDOWS = ((2, 25), (300, 256))          # (device rows a window, rows a chunk)


class _Trace:
    """Rows of a tiny trace; each kernel launched by a call on its rank's thread just before it."""

    def __init__(self) -> None:
        self.dev: list[dict] = []
        self.api: list[dict] = []
        self.rg: list[dict] = []
        self.corr = 0

    def k(self, s: float, e: float, *, rank: int = 0, device: int = 0, name: str = "gemm", stream: int = 7) -> None:
        self.corr += 1
        pid = 100 + rank
        self.api.append(api(s - 4, s - 2, corr=self.corr, pid=pid, rank=rank))
        self.dev.append(kernel(s, e, name, corr=self.corr, device=device, rank=rank, pid=pid, stream=stream))

    def step(self, s: float, e: float, n: int, *, rank: int = 0) -> None:
        self.rg.append(rng(s, e, "loop.step", step=n, mode="decode", pid=100 + rank, rank=rank))

    def timeline(self, ranks: tuple[int, ...]) -> Timeline:
        self.dev.sort(key=lambda r: r["start_ns"])
        self.api.sort(key=lambda r: r["start_ns"])
        return timeline(self.dev, self.api, self.rg, ranks=ranks)


def tp2_one_device_idle(idle_heavy: bool = False) -> Timeline:
    """One rank, two devices (TP): device 1 runs in the first and last step only, idle in between
    (its one gap spans every window). ``idle_heavy``: its two kernels are long and device 0 runs one
    short kernel a step, so device 1 is the rank's primary (busiest) device, though it idles."""
    t = _Trace()
    for n in range(12):
        t0 = 100 * n
        t.step(t0, t0 + 100, n)
        t.k(t0 + 10, t0 + (20 if idle_heavy else 40))
        if not idle_heavy:
            t.k(t0 + 50, t0 + 80)
        if n in (0, 11):
            t.k(t0 + 12, t0 + (95 if idle_heavy else 30), device=1)
    return t.timeline((0,))


def two_ranks_collective_across_cut() -> Timeline:
    """Two ranks, a device each; every step ends with an all-reduce that outlives the step (the next
    step starts, and a window may be cut, while it runs). Rank 1 arrives late: the straggler."""
    t = _Trace()
    for n in range(10):
        t0 = 100 * n
        for r in (0, 1):
            t.step(t0, t0 + 100, n, rank=r)
            t.k(t0 + 10, t0 + 60 + 20 * r, rank=r, device=r)
            t.k(t0 + 82 + 14 * r, t0 + 106, rank=r, device=r, name=NCCL, stream=9)
    return t.timeline((0, 1))


def interleaved_ranks() -> Timeline:
    """Two ranks whose steps interleave (rank 1's start halfway into rank 0's), back to back but for a
    pause after every fourth: a cut at one rank's step start falls inside the other rank's step, whose
    own edge moves to that step's end."""
    t = _Trace()
    t0 = 0
    for n in range(12):
        for r in (0, 1):
            s = t0 + 50 * r
            t.step(s, s + 100, n, rank=r)
            t.k(s + 5, s + 45, rank=r, device=r)
            t.k(s + 60, s + 95, rank=r, device=r)
        t0 += 100 if n % 4 != 3 else 300
    return t.timeline((0, 1))


def rank_without_steps() -> Timeline:
    """Rank 0 steps; rank 1 (its own device) has no step ranges and runs a kernel now and then, so its
    bubbles are not cut at steps and cross many windows."""
    t = _Trace()
    for n in range(10):
        t0 = 100 * n
        t.step(t0, t0 + 100, n)
        t.k(t0 + 10, t0 + 70)
        if n % 3 == 0:
            t.k(t0 + 20, t0 + 50, rank=1, device=3)
    return t.timeline((0, 1))


SCENARIOS = {
    "tp2_one_device_idle": tp2_one_device_idle,
    "tp2_idle_device_is_primary": lambda: tp2_one_device_idle(idle_heavy=True),
    "two_ranks_collective_across_cut": two_ranks_collective_across_cut,
    "interleaved_ranks": interleaved_ranks,
    "rank_without_steps": rank_without_steps,
}


def _all_equal(tl: Timeline) -> dict:
    whole = diagnose(tl, PARAMS).to_json()
    for rows, chunk in WINDOWS:
        assert diagnose_windowed(tl, PARAMS, rows).to_json() == whole, f"windowed, {rows} rows a window"
        got = diagnose_streamed(TimelineChunks(tl, chunk), PARAMS, rows).to_json()
        assert got == whole, f"streamed, {rows} rows a window, chunks of {chunk}"
    rows, chunk = WINDOWS[0]
    got = diagnose_streamed(TimelineChunks(tl, chunk), PARAMS, rows, workers=2).to_json()
    assert got == whole, f"streamed, {rows} rows a window, the later windows in a forked copy"
    return whole


@pytest.mark.parametrize("name", SCENARIOS)
def test_multi_device_windows_equal_whole(name: str) -> None:
    tl = SCENARIOS[name]()
    keys = set(zip(tl.device["rank"], tl.device["device"]))
    assert len(keys) == 2
    whole = _all_equal(tl)
    assert whole["steps"]["count"] >= 10 and whole["bubbles"]["count"] > 0


def test_primary_device_is_the_busiest_not_the_first() -> None:
    whole = diagnose(tp2_one_device_idle(idle_heavy=True), PARAMS).to_json()
    assert {r["device"] for r in whole["budget"]["per_step"]} == {1}
    whole = diagnose(tp2_one_device_idle(), PARAMS).to_json()
    assert {r["device"] for r in whole["budget"]["per_step"]} == {0}


def test_collective_across_cut_names_the_straggler() -> None:
    tl = two_ranks_collective_across_cut()
    c = _all_equal(tl)["comm"]
    assert c["straggler_rank"] == 1 and c["straggler_device_busy"] is not None
    assert c["kernels"] == 20 and c["skew_ns"] == 10 * 14_000
    # the cuts fall while collectives run: a 2-row window holds one step
    _, steps = find_steps(tl, PARAMS.step_rule)
    cuts = [hi for _, hi in plan(steps, np.arange(len(steps)) * 10, 2)[:-1]]
    coll = tl.device[tl.device["name"] == NCCL]
    assert any(((coll["start_ns"] < c) & (coll["end_ns"] > c)).any() for c in cuts)


def test_no_rank_is_cut_inside_its_steps() -> None:
    _, steps = find_steps(interleaved_ranks(), PARAMS.step_rule)
    windows = plan(steps, np.arange(len(steps)) * 10, 1)
    assert len(windows) == len(steps)                         # a cut at every step start, of either rank
    edges = rank_edges(steps, windows)
    for rank, spans in edges.items():
        mine = steps[steps["rank"] == rank]
        s, e = mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy()
        cuts = [hi for _, hi in spans[:-1]]
        assert all(not ((s < c) & (e > c)).any() for c in cuts), rank
        assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:]))    # the rank's time, all of it
        assert sum(hi > lo for lo, hi in spans) >= len(mine)     # about a window a step for each rank


@pytest.mark.parametrize("cut, rank0, rank1", [
    # rank 0: [0, 100) [100, 200); rank 1: [50, 150) [150, 250); us
    (100, 100, 150),          # rank 0 between its steps; inside rank 1's first: to its end
    (150, 200, 150),          # inside rank 0's second: to its end; rank 1 between its steps
    (300, 300, 300),          # after every step
])
def test_rank_edges_move_past_open_steps(cut: int, rank0: int, rank1: int) -> None:
    t = _Trace()
    for n, (r, s) in enumerate([(0, 0), (0, 100), (1, 50), (1, 150)]):
        t.step(s, s + 100, n, rank=r)
    _, steps = find_steps(t.timeline((0, 1)), PARAMS.step_rule)
    got = rank_edges(steps, [(-1, cut * 1000), (cut * 1000, 10**9)])
    assert got[0][0][1] == rank0 * 1000 and got[1][0][1] == rank1 * 1000
    assert got[0][1][0] == got[0][0][1] and got[1][1][0] == got[1][0][1]


def test_idle_device_does_not_widen_the_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device 1 idles across ten windows: each window reads, and carries to the next, the rows that
    end its gap and its own rows, not device 0's rows in between."""
    seen: list[int] = []
    kept: list[int] = []
    real_part, real_carry = stream.window_part, stream.carried

    def part(tlw, w, ctx, params):
        seen.append(len(tlw.device))
        return real_part(tlw, w, ctx, params)

    def carry(dev, hi, running):
        got = real_carry(dev, hi, running)
        kept.append(len(got))
        return got
    monkeypatch.setattr(stream, "window_part", part)
    monkeypatch.setattr(stream, "carried", carry)
    diagnose_streamed(TimelineChunks(tp2_one_device_idle(), 4), PARAMS, 2)
    # a window: about one step of device 0 with a neighbour each side, device 1's rows around its gap
    assert len(seen) == 12 and max(seen) <= 6, seen
    assert max(kept) <= 5, kept     # each device's last row, and the rows read ahead to the next step edge


def test_first_pass_keeps_one_row_per_idle_gap() -> None:
    """The first pass keeps, of the rows ending gaps, only those of a device idle past the next step
    edge: device 1's one gap (steps 1..10), not a row per step of either device."""
    tl = tp2_one_device_idle()
    _, steps = find_steps(tl, PARAMS.step_rule)
    scan = DeviceScan(np.unique(np.r_[steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()]))
    for i in range(0, len(tl.device), 4):
        scan.add(tl.device.iloc[i:i + 4])
    scan.finish()
    kept = {k: sum(len(rows) for _, _, rows in got) for k, got in scan._far.items()}
    assert kept == {(0, 1): 1}
    row = scan.far_rows(500_000)[(0, 1)]                    # a cut in the middle of the gap
    assert int(row["start_ns"].iloc[0]) == 1_112_000 and scan.read_to(500_000) == 600_000
    assert scan.far_rows(1_100_000) == {}                  # the next row comes before the next edge
    with pytest.raises(ValueError, match="not a step start or end"):
        scan.far_rows(123)


TWO_RANK_FILES = [("comm_straggler.rank0.sqlite", "comm_straggler.rank1.sqlite")]


@pytest.mark.parametrize("files", TWO_RANK_FILES, ids=lambda f: f[0].split(".")[0])
def test_sample_ranks_read_together(files: tuple[str, ...]) -> None:
    tl = load_timeline([REPO / "sample_traces" / f for f in files])
    assert len(set(tl.device["rank"])) == 2
    # the ranks' steps are back to back and skewed: no instant without an open step, yet cut per step
    _, steps = find_steps(tl, PARAMS.step_rule)
    assert len(plan(steps, np.arange(len(steps)) * 10, 2)) == len(steps)
    whole = _all_equal(tl)
    assert whole["comm"]["straggler_rank"] == 1 and whole["comm"]["participants"] == 2


@pytest.mark.parametrize("when", ["before", "after"])
def test_api_steps_on_several_devices(when: str) -> None:
    """The 2xH100 exports: two GPUs, steps from sync points (API rows): windowed, the whole read's."""
    path = REPO.parent / "shared" / "traces" / "real" / "nsys" / \
        f"fastvideo_train_2xH100_nccl_{when}_nsys2026.2_300ms-window.sqlite"
    if not path.is_file():
        pytest.skip("the shared real traces are not here")
    tl = load_timeline([path])
    assert len(set(zip(tl.device["rank"], tl.device["device"]))) == 2
    assert find_steps(tl, PARAMS.step_rule)[0] == "sync"
    _all_equal(tl)


@pytest.fixture(scope="module")
def tp_node(tmp_path_factory) -> Path:
    """``benchmarks/gen_nsys.py --gpus 2``: two ranks, a GPU each, in one export, running batches of 5
    steps, rank 1 3 us behind rank 0, collectives among the kernels; 10 k kernels, 202 device rows
    per step and rank. Each step ends with a stream sync: the steps follow each other."""
    out = tmp_path_factory.mktemp("gen") / "tp2.sqlite"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_nsys.py"), "--size-mb", "1", "--gpus", "2",
                    "--batch-steps", "5", str(out)], check=True, capture_output=True, cwd=REPO)
    return out


def test_tp_node_export_spilled(tp_node: Path, tmp_path: Path) -> None:
    """End to end: the two-rank export spilled to disk in time order, diagnosed in windows of 500 rows."""
    from srtscope.analyzers.spill.nsys_spill import read_nsys_spilled

    tl = load_timeline([tp_node])
    assert sorted(set(zip(tl.device["rank"], tl.device["device"]))) == [(0, 0), (1, 1)]
    whole = diagnose(tl, PARAMS).to_json()
    with read_nsys_spilled(tp_node, folder=tmp_path / "spill", chunk_rows=1_000) as src:
        got = diagnose_streamed(src, PARAMS, 500).to_json()
    assert got == whole
    assert whole["steps"]["count"] == 50 and whole["comm"]["participants"] == 2 and whole["comm"]["kernels"] > 0
    _, steps = find_steps(tl, PARAMS.step_rule)
    starts = np.sort(steps["start_ns"].to_numpy())
    # a window ends at the first step start past 500 rows: two steps of both ranks (808 rows) each
    assert len(plan(steps, np.searchsorted(tl.device["start_ns"].to_numpy(), starts), 500)) == 13


@pytest.mark.parametrize("case, rows, of", [
    ("two ranks, one process each: a correlation id is its rank's", [(0, 7, 1), (1, 9, 1), (1, 9, 2), (0, 7, 2)],
     [(1, 9, 1), (0, 7, 2)]),
    ("one rank, two processes: the same id in the other process is not a match",
     [(0, 7, 5), (0, 8, 5), (0, 8, 6)], [(0, 8, 5)]),
    ("a process of the rows that ``of`` never holds, and ids of -1", [(2, 3, -1), (0, 7, -1), (0, 7, 4)],
     [(0, 7, -1)]),
    ("nothing to match against", [(0, 7, 1), (1, 9, 1)], []),
])
def test_started_calls_are_matched_by_rank_process_and_correlation(case, rows, of):
    """``_settled``'s lookup: a carried call is done when a device row of the same (rank, pid,
    correlation) started — the same as matching the three together (a MultiIndex)."""
    def frame(keys):
        return pd.DataFrame(np.asarray(keys, np.int64).reshape(-1, 3), columns=["rank", "pid", "correlation"])
    a, b = frame(rows), frame(of)
    want = pd.MultiIndex.from_frame(a).isin(pd.MultiIndex.from_frame(b)) if len(b) else np.zeros(len(a), bool)
    assert stream._in_keys(a, b).tolist() == list(want), case
