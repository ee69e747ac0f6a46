"""A memory budget: the estimate before reading, a time window's read (the Timeline ``crop`` gives of
the whole read), the window planned to fit (whole steps, middle of the capture), ``--steps`` read
alone with the same diagnosis."""
from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.gen_nsys import generate
from srtscope.analyzers.diagnose import crop, diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import SourceFormat, Timeline
from srtscope.analyzers.pipeline.memory_plan import BudgetError, combined, plan_files, plan_read
from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.readers.memory_estimate import (
    BASE_BYTES,
    JSON_BASE_BYTES,
    JSON_BYTE_BYTES,
    RATIO_SAMPLE_BYTES,
    _inflate_ratio,
    estimate,
    json_text_bytes,
    nsys_peak,
    nsys_rows_within,
    unwrap_isize,
)
from srtscope.analyzers.readers.nsys_sqlite import read_nsys
from tests.analyzers._cli import srtscope
from tests.conftest import REAL_TRACES, REPO

SAMPLES = REPO / "sample_traces"
NSYS = SourceFormat.NSYS_SQLITE
# scenario traces whose windows cover: several kinds of device rows, OS runtime rows, two processes,
# real exports of nsys 2022.2 to 2026.2 (NVTX domains, memsets, few rows)
WINDOW_TRACES = [SAMPLES / n for n in ("healthy.sqlite", "copy_bound.sqlite", "osrt_io.sqlite",
                                       "eager_fallback.sqlite", "comm_straggler.rank0.sqlite")] + \
    sorted((REAL_TRACES / "nsys").glob("*.sqlite"))


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A generated export of 20 MB: 1000 ``loop.step`` steps, 200 k kernels, 203 k API rows."""
    out = tmp_path_factory.mktemp("gen") / "gen_20mb.sqlite"
    generate(out, 20)
    return out


def _same_frame(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """'' when equal, columns, dtypes and categories included; else what differs."""
    if list(a.columns) != list(b.columns):
        return f"columns {list(a.columns)} != {list(b.columns)}"
    for c in a.columns:
        x, y = a[c].reset_index(drop=True), b[c].reset_index(drop=True)
        if isinstance(x.dtype, pd.CategoricalDtype) and list(x.cat.categories) != list(y.cat.categories):
            return f"{c}: categories"
        if not x.equals(y):
            return f"{c}: values or dtype"
    return ""


def _doc(tl: Timeline, params: DiagnoseParams | None = None) -> str:
    return json.dumps(diagnose(tl, params or DiagnoseParams()).to_json(), sort_keys=True)


@pytest.mark.parametrize("path", WINDOW_TRACES, ids=lambda p: p.name)
@pytest.mark.parametrize("part", [(0.3, 0.6), (0.5, 0.52), (0.0, 1.01)])
def test_window_read_is_the_crop_of_the_whole_read(path: Path, part: tuple[float, float]) -> None:
    if not path.exists():
        pytest.skip(f"{path} not here")
    whole = read_nsys(path)
    a, b = whole.span_ns
    lo, hi = int(a + (b - a) * part[0]), int(a + (b - a) * part[1]) + 1
    want, got = crop(whole, lo, hi), read_nsys(path, window=(lo, hi))
    for table in ("device", "api", "ranges"):
        assert _same_frame(getattr(want, table), getattr(got, table)) == "", table
    assert json.dumps(asdict(got.meta), default=str) == json.dumps(asdict(want.meta), default=str)
    assert _doc(got) == _doc(want)


def test_window_read_holds_the_window_rows_only(export: Path) -> None:
    whole = read_nsys(export)
    a, b = whole.span_ns
    lo, hi = a + (b - a) // 3, a + (b - a) // 2
    got = read_nsys(export, window=(lo, hi))
    inside = ((whole.device["end_ns"] > lo) & (whole.device["start_ns"] < hi)).sum()
    assert 0 < len(got.device) == inside < len(whole.device) // 4
    for df in (got.device, got.api, got.ranges):
        assert df["start_ns"].min() >= lo and df["end_ns"].max() <= hi


def test_estimate_covers_the_measured_peak(export: Path) -> None:
    est = estimate(export, NSYS)
    assert est.rows["CUPTI_ACTIVITY_KIND_KERNEL"] == 200_000 and est.nvtx_rows == 5_001
    assert est.peak_bytes == nsys_peak(sum(est.rows.values()))
    run = srtscope("diagnose", export, "--json", "--no-cache", "--memory-budget", "none")
    assert run.code == 0, run.stderr
    peak = run.peak_rss_mb * 2**20
    # conservative; the slack is the base's at this size (a few % at GBs: benchmarks/README.md)
    assert peak <= est.peak_bytes <= 1.5 * peak, (peak / 2**20, est.peak_bytes / 2**20)


def test_estimate_of_json_traces_reads_the_gzip_trailer(tmp_path: Path) -> None:
    src = SAMPLES / "vllm_instrument_clean.json.gz"
    text = gzip.decompress(src.read_bytes())
    plain = tmp_path / "t.json"
    plain.write_bytes(text)
    for p in (src, plain):
        assert estimate(p, SourceFormat.KINETO).peak_bytes == int(JSON_BASE_BYTES + JSON_BYTE_BYTES * len(text))


@pytest.mark.parametrize("rows", [0, 1_000, 5_500_000, 60_000_000])
def test_rows_within_inverts_the_peak(rows: int) -> None:
    assert nsys_rows_within(nsys_peak(rows)) in (rows, rows - 1)
    assert nsys_peak(nsys_rows_within(nsys_peak(rows) - 1)) < nsys_peak(rows) or rows == 0


def test_over_budget_reads_whole_steps_in_the_middle(export: Path) -> None:
    est = estimate(export, NSYS)
    budget = est.peak_bytes - 2**20
    plan = plan_read(export, 0, est, budget, DiagnoseParams())
    assert plan is not None and not plan.pushed and plan.steps is not None
    assert plan.peak_bytes <= budget < est.peak_bytes
    whole = read_nsys(export)
    steps = whole.ranges[whole.ranges["name"] == "loop.step"]
    lo, hi = plan.window
    # the window's bounds are a step's start and a step's end
    assert lo in set(steps["start_ns"].tolist()) and hi in set(steps["end_ns"].tolist())
    a, b = whole.span_ns
    assert a + (b - a) // 10 < lo and hi < b     # not the warm-up at the start
    got = read_nsys(export, window=plan.window)
    assert len(got.device) < len(whole.device)
    assert got.device["start_ns"].min() >= lo and got.device["end_ns"].max() <= hi


def test_no_window_when_within_budget_or_without_limit(export: Path) -> None:
    est = estimate(export, NSYS)
    for budget in (None, est.peak_bytes):
        assert plan_read(export, 0, est, budget, DiagnoseParams()) is None


def test_budget_too_small_for_one_step_says_so(export: Path) -> None:
    est = estimate(export, NSYS)
    with pytest.raises(BudgetError, match=r"gen_20mb.sqlite: a diagnosis needs ~\d+ MiB, over --memory-budget "
                                          r"\d+ MiB; raise it \(--memory-budget 1GiB\)"):
        plan_read(export, 0, est, BASE_BYTES + 2**20, DiagnoseParams())


def test_kineto_over_budget_is_refused() -> None:
    p = SAMPLES / "vllm_instrument_clean.json.gz"
    est = estimate(p, SourceFormat.KINETO)
    with pytest.raises(BudgetError, match="only nsys exports can be read by time window"):
        plan_read(p, 0, est, est.peak_bytes - 1, DiagnoseParams())
    assert plan_read(p, 0, est, est.peak_bytes, DiagnoseParams(step_range=(0, 3)), push_steps=True) is None


STEP_CASES = [(SAMPLES / "healthy.sqlite", (3, 7)), (SAMPLES / "eager_fallback.sqlite", (2, 4)),
              (SAMPLES / "kernel_bound.sqlite", (0, 0)), (SAMPLES / "scheduler_bound.sqlite", (5, 10**6))]


@pytest.mark.parametrize("path,steps", STEP_CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_steps_read_alone_give_the_same_diagnosis(path: Path, steps: tuple[int, int]) -> None:
    params = DiagnoseParams(step_range=steps)
    est = estimate(path, NSYS)
    plan = plan_read(path, 0, est, None, params, push_steps=True)
    assert plan is not None and plan.pushed
    assert _doc(read_nsys(path, window=plan.window), params) == _doc(read_nsys(path), params)


def test_steps_read_alone_on_a_generated_export(export: Path) -> None:
    params = DiagnoseParams(step_range=(200, 205))
    est = estimate(export, NSYS)
    plan = plan_read(export, 0, est, None, params, push_steps=True)
    assert plan is not None and plan.pushed and plan.rows < 0.9 * est.windowed_rows
    assert _doc(read_nsys(export, window=plan.window), params) == _doc(read_nsys(export), params)


@pytest.mark.parametrize("path", [SAMPLES / "prep_bound.sqlite", SAMPLES / "host_sync_bound.sqlite"]
                         + sorted((REAL_TRACES / "nsys").glob("*.sqlite")), ids=lambda p: p.name)
def test_steps_without_numbers_of_their_own_are_read_whole(path: Path) -> None:
    # SGLang's steps and the API-derived ones (every real export here) are numbered by their order
    # in what was read: a window alone would number them from 0 again, so the whole file is read
    est = estimate(path, NSYS)
    params = DiagnoseParams(step_range=(1, 2))
    assert plan_read(path, 0, est, None, params, push_steps=True) is None
    with pytest.raises(BudgetError, match="cannot be read alone: they have no numbers of their own"):
        plan_read(path, 0, est, est.peak_bytes - 1, params, push_steps=True)


@pytest.mark.parametrize("name,fmt", [("healthy.sqlite", NSYS), ("vllm_instrument_clean.json.gz", SourceFormat.KINETO),
                                      ("profiler_steps.json.gz", SourceFormat.KINETO)])
def test_estimate_covers_the_peak_on_sample_traces(name: str, fmt: SourceFormat) -> None:
    est = estimate(SAMPLES / name, fmt)
    run = srtscope("diagnose", SAMPLES / name, "--json", "--no-cache", "--memory-budget", "none")
    assert run.code == 0, run.stderr
    # small traces: the interpreter and its libraries are the peak; the estimate's base covers them
    assert run.peak_rss_mb * 2**20 <= est.peak_bytes <= 2 * run.peak_rss_mb * 2**20


def test_steps_that_select_nothing_over_budget_say_so() -> None:
    path = SAMPLES / "healthy.sqlite"
    est = estimate(path, NSYS)
    with pytest.raises(BudgetError, match=r"healthy.sqlite: step range 100..200 selects no step \(the trace "
                                          r"has steps 0..39\)"):
        plan_read(path, 0, est, est.peak_bytes - 1, DiagnoseParams(step_range=(100, 200)), push_steps=True)


PAIR = [SAMPLES / "comm_straggler.rank0.sqlite", SAMPLES / "comm_straggler.rank1.sqlite"]


@pytest.mark.parametrize("steps", [(3, 7), (0, 0), (10, 29)])
def test_steps_of_several_rank_files_read_alone_give_the_same_diagnosis(steps: tuple[int, int]) -> None:
    params = DiagnoseParams(step_range=steps)
    plan = plan_files(PAIR, [estimate(p, NSYS) for p in PAIR], None, params, push_steps=True)
    assert plan is not None and plan.pushed
    whole = load_timeline(PAIR)
    alone = load_timeline(PAIR, window=(plan.window, plan.rows))
    assert len(alone.device) < len(whole.device)
    assert _doc(alone, params) == _doc(whole, params)


def test_several_files_over_budget_share_one_window(export: Path, tmp_path: Path) -> None:
    files = [tmp_path / "run.rank0.sqlite", tmp_path / "run.rank1.sqlite"]
    for f in files:
        shutil.copyfile(export, f)
    ests = [estimate(f, NSYS) for f in files]
    total = combined(ests)
    assert total.peak_bytes == 2 * ests[0].peak_bytes - BASE_BYTES
    plan = plan_files(files, ests, total.peak_bytes - 2**20, DiagnoseParams())
    assert plan is not None and not plan.pushed and plan.steps is not None
    tl = load_timeline(files, window=(plan.window, plan.rows))
    assert tl.meta.ranks == [0, 1] and sorted(set(tl.device["rank"].tolist())) == [0, 1]
    assert tl.device["start_ns"].min() >= plan.window[0] and tl.device["end_ns"].max() <= plan.window[1]


@pytest.mark.parametrize("isize, size, ratio, want", [
    # a small file: the trailer as it is (no ratio is sampled)
    (1_000_000, 100_000, None, 1_000_000),
    # a trailer under the compressed size has wrapped at least once
    (10, 500_000_000, None, 10 + (1 << 32)),
    # the 20 M-event trace with stacks: 507 MB of gzip, 5.42 GB of JSON, its trailer 5.42 GB mod 2^32
    (5_422_452_369 - (1 << 32), 507_063_042, 10.7, 5_422_452_369),
    # a ratio that says less than the trailer never takes from it
    (3_000_000_000, 400_000_000, 2.0, 3_000_000_000),
])
def test_gzip_size_unwrapped_by_its_sampled_ratio(isize: int, size: int, ratio: float | None, want: int) -> None:
    """A Kineto trace over 4 GiB of JSON: its gzip trailer holds the size modulo 2^32; the memory
    estimate unwraps it by the ratio of its first megabyte (an estimate 4 GiB short let a whole read
    through that did not fit)."""
    assert unwrap_isize(isize, size, ratio) == want


def test_gzip_ratio_sampled_from_the_file(tmp_path: Path, monkeypatch) -> None:
    """The sampled ratio is the file's own, and a trailer that agrees with it is kept: sampling
    forced on a small file (the wrap threshold lowered)."""
    text = b"".join(b'{"ph": "X", "name": "aten::mm", "ts": %d, "dur": 3},\n' % i for i in range(400_000))
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(text))
    size = p.stat().st_size
    ratio = _inflate_ratio(p.read_bytes()[:RATIO_SAMPLE_BYTES])
    assert ratio is not None and abs(ratio - len(text) / size) < 0.2 * len(text) / size
    monkeypatch.setattr("srtscope.analyzers.readers.memory_estimate.MAX_GZIP_RATIO", 1 << 32)
    assert json_text_bytes(p) == len(text)
    # a damaged start: no ratio, the trailer alone
    p.write_bytes(b"\x1f\x8b" + b"\0" * (size - 6) + len(text).to_bytes(4, "little"))
    assert json_text_bytes(p) == len(text)


@pytest.mark.parametrize("members", [1, 40])
@pytest.mark.parametrize("rows", [2_000, 200_000])
def test_a_probe_streams_members_are_sized_together(tmp_path: Path, rows: int, members: int) -> None:
    """A probe stream appends one gzip member a flush: the trailer holds only the last member's size.
    It once read as a 4 GiB wrap (a 0.9 MB stream 'needed ~10 GiB'); the estimate is the text's
    size, within the ratio's sampling error."""
    text = b"".join(b'{"ph": "X", "name": "sched.schedule", "ts": %d, "dur": 3},\n' % i for i in range(rows))
    step = -(-len(text) // members)
    p = tmp_path / "s.json.gz"
    p.write_bytes(b"".join(gzip.compress(text[i:i + step]) for i in range(0, len(text), step)))
    got = json_text_bytes(p)
    assert 0.8 * len(text) <= got <= 1.25 * len(text), (got, len(text))
