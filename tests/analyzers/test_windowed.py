"""The windowed diagnosis gives the whole-trace diagnosis, figure for figure.

Every trace the windowed path covers (one or several ranks and devices; ``test_windowed_multi.py``
holds the multi-device scenarios) is diagnosed whole and window by window
at two window sizes (2 device rows per window: a cut at nearly every step); the JSON documents
must be equal. The streamed path (start-sorted chunks, two passes) is checked the same way, over
chunk sizes that split every table mid-step, and end to end over a generated export spilled to disk.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from srtscope.analyzers.analyses.host_threads import BurstRule, BurstTracker, launch_bursts
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.pipeline.reduce import diagnose_windowed
from srtscope.analyzers.pipeline.stream import Held, NotWindowable, TimelineChunks, diagnose_streamed
from srtscope.analyzers.pipeline.window import applies, plan
from srtscope.analyzers.readers import load_timeline

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "sample_traces").glob("*.sqlite")) + sorted((REPO / "sample_traces").glob("**/*.json.gz"))
PARAMS = DiagnoseParams()


def _real(kind: str) -> list[Path]:
    folder = REPO.parent / "shared" / "traces" / "real" / kind
    return sorted(folder.iterdir()) if folder.is_dir() else []


TRACES = SAMPLES + _real("nsys") + _real("kineto")


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A 4 MB export of ``benchmarks/gen_nsys.py``: an engine's decode loop, 40 k kernels."""
    out = tmp_path_factory.mktemp("gen") / "gen.sqlite"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_nsys.py"), "--size-mb", "4", str(out)],
                   check=True, capture_output=True, cwd=REPO)
    return out


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_windowed_equals_whole(path: Path) -> None:
    tl = load_timeline([path])
    if not applies(tl, PARAMS):
        pytest.skip("no device rows: the whole-trace path")
    whole = diagnose(tl, PARAMS).to_json()
    for rows in (2, 300):
        assert diagnose_windowed(tl, PARAMS, rows).to_json() == whole, f"{rows} rows a window"


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_streamed_equals_whole(path: Path) -> None:
    tl = load_timeline([path])
    whole = diagnose(tl, PARAMS).to_json()
    for rows, chunk, workers in ((40, 25, 1), (500, 256, 1), (40, 25, 2)):
        try:
            got = diagnose_streamed(TimelineChunks(tl, chunk), PARAMS, rows, workers=workers).to_json()
        except NotWindowable as exc:
            # NOTE: steps from the ranges or the API rows, on any devices, are windowed; an engine's
            # step openers without forward ranges are not (their steps need the device rows)
            assert "need the device rows" in str(exc), str(exc)
            pytest.skip(f"not windowed: {exc}")
        assert got == whole, f"{rows} rows a window, chunks of {chunk}, {workers} worker(s)"


def test_streamed_generated_export_spilled(generated: Path, tmp_path: Path) -> None:
    """End to end: the export spilled to disk in time order, diagnosed in windows of 2,000 rows."""
    from srtscope.analyzers.spill.nsys_spill import read_nsys_spilled

    whole = diagnose(load_timeline([generated]), PARAMS).to_json()
    with read_nsys_spilled(generated, folder=tmp_path / "spill", chunk_rows=5_000) as src:
        got = diagnose_streamed(src, PARAMS, 2_000).to_json()
        # the later windows walked in a forked copy beside this process
        assert diagnose_streamed(src, PARAMS, 2_000, workers=2).to_json() == whole
    assert got == whole
    assert whole["steps"]["count"] > 100 and whole["bubbles"]["count"] > 0   # the figures are not empty


def test_windows_resized_after_the_first_pass_give_the_same_json(generated: Path) -> None:
    """``resize`` is asked once, after the first pass, with the bytes the process then holds; the
    windows it gives (fewer rows, or one walk for two) change no figure."""
    tl = load_timeline([generated])
    whole = diagnose(tl, PARAMS).to_json()
    asked: list[tuple[Held, int, int]] = []

    def resize(held: Held, rows: int, workers: int) -> tuple[int, int]:
        asked.append((held, rows, workers))
        return 300, 1
    got = diagnose_streamed(TimelineChunks(tl, 1_000), PARAMS, 50_000, workers=2, resize=resize).to_json()
    assert got == whole
    assert len(asked) == 1 and asked[0][1:] == (50_000, 2)
    held = asked[0][0]
    assert held.steps == whole["steps"]["count"] and held.collectives <= max(1, whole["comm"]["kernels"])
    assert held.resident_bytes > 50 << 20        # an interpreter with pandas holds more than 50 MiB


@pytest.mark.parametrize("why, params, match", [
    ("a step range is cut from the whole trace", DiagnoseParams(step_range=(1, 3)), "step range"),
])
def test_not_windowable_says_why(generated: Path, why: str, params: DiagnoseParams, match: str) -> None:
    with pytest.raises(NotWindowable, match=match):
        diagnose_streamed(TimelineChunks(load_timeline([generated]), 100), params, 100)


SPILLED = [REPO / "sample_traces" / "host_sync_bound.sqlite"] + [
    p for p in _real("nsys") if "2xH100" not in p.name]        # the 2xH100 exports: two devices


@pytest.mark.parametrize("path", SPILLED, ids=lambda p: p.name)
def test_streamed_api_steps_spilled(path: Path, tmp_path: Path) -> None:
    """Steps that only the API rows give (sync points, launch bursts): found while the spilled
    chunks are read, the same JSON as the whole read."""
    from srtscope.analyzers.spill.nsys_spill import read_nsys_spilled

    whole = diagnose(load_timeline([path]), PARAMS).to_json()
    assert whole["steps"]["source"] in ("sync", "bursts") and whole["steps"]["count"] >= 2
    with read_nsys_spilled(path, folder=tmp_path / "spill", chunk_rows=25) as src:
        assert diagnose_streamed(src, PARAMS, 40).to_json() == whole
        assert diagnose_streamed(src, PARAMS, 40, workers=2).to_json() == whole


@pytest.mark.parametrize("seed", range(40))
def test_burst_tracker_equals_launch_bursts(seed: int) -> None:
    """Bursts fed a chunk at a time (cut anywhere, empty chunks too) are ``launch_bursts``'s."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 80))
    s = np.sort(rng.integers(0, 3_000, n))
    e = s + rng.integers(0, 120, n)
    rule = BurstRule(gap_ns=int(rng.integers(0, 80)), min_launches=int(rng.integers(1, 6)))
    t = BurstTracker(rule)
    cuts = [0, *sorted(rng.integers(0, n + 1, int(rng.integers(0, 6)))), n]
    for a, b in zip(cuts[:-1], cuts[1:]):
        t.add(s[a:b], e[a:b])
    want, got = launch_bursts(s, e, rule), t.bursts()
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_plan_cuts_at_step_starts_with_no_step_open() -> None:
    # steps (start, end): the third overlaps the second, so no cut at its start
    steps = pd.DataFrame({"start_ns": [0, 100, 150, 300, 400], "end_ns": [100, 200, 250, 400, 500]})
    rows_before = np.array([0, 10, 15, 30, 40])
    got = plan(steps, rows_before, max_rows=10)
    cuts = [hi for _, hi in got[:-1]]
    assert cuts == [100, 300, 400]
    assert got[0][0] < -10**18 and got[-1][1] > 10**18            # the windows cover all time
    assert all(a[1] == b[0] for a, b in zip(got[:-1], got[1:]))
    with pytest.raises(ValueError, match="max_rows"):
        plan(steps, rows_before, 0)
