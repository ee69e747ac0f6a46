"""``--memory-budget``: sizes parsed or refused in one line, the same JSON when the trace fits, a
diagnosis over a window that fits said in every report, ``--steps`` read alone with the same JSON."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.gen_nsys import generate
from srtscope.analyzers.model.timeline import SourceFormat
from srtscope.analyzers.readers.memory_estimate import BASE_BYTES, estimate
from srtscope.cli.app import app
from srtscope.cli.memory_budget import AUTO_FLOOR, AUTO_SHARE, mem_available, parse_budget
from tests.conftest import REPO

SAMPLES = REPO / "sample_traces"
runner = CliRunner()


def invoke(*args: object, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "100", **(env or {})})


def _one_error_line(r, *needles: str) -> str:
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("srtscope: error: "), r.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "gen_20mb.sqlite"
    generate(out, 20)
    return out


@pytest.mark.parametrize("text,size", [("2GiB", 2 << 30), ("1500MB", 1_500_000_000), ("800M", 800 << 20),
                                       ("4g", 4 << 30), (" 1.5 GiB ", 3 << 29), ("100000000", 100_000_000),
                                       ("none", None), ("NONE", None)])
def test_sizes(text: str, size: int | None) -> None:
    assert parse_budget(text).bytes == size


def test_auto_is_a_share_of_the_available_memory() -> None:
    avail = mem_available()
    got = parse_budget("auto").bytes
    if avail is None:
        assert got is None
    else:       # the available memory moves between the two reads: within 5%
        assert got == pytest.approx(max(AUTO_FLOOR, AUTO_SHARE * avail), rel=0.05)


@pytest.mark.parametrize("text,says", [("1x", "expected a size such as 2GiB"), ("10M", "at least 64MiB"),
                                       ("-2G", "expected a size"), ("2 GiB GiB", "expected a size"),
                                       ("", "expected a size"), ("9" * 30, "at most 1EiB")])
def test_bad_sizes_exit_2_with_one_line(text: str, says: str) -> None:
    r = invoke("diagnose", SAMPLES / "healthy.sqlite", "--memory-budget", text)
    _one_error_line(r, "--memory-budget", says)


@pytest.mark.parametrize("trace", ["healthy.sqlite", "vllm_instrument_clean.json.gz"])
def test_within_budget_the_json_is_the_same(trace: str) -> None:
    plain = invoke("diagnose", SAMPLES / trace, "--json", "--no-cache")
    for budget in ("none", "auto", "64GiB"):
        r = invoke("diagnose", SAMPLES / trace, "--json", "--no-cache", "--memory-budget", budget)
        assert r.exit_code == 0 and r.stdout == plain.stdout, budget


def test_over_budget_one_export_is_diagnosed_whole_in_windows(export: Path, tmp_path: Path, monkeypatch) -> None:
    """One engine process's export over the budget: the whole trace, window by window; the same
    JSON as the whole read, no window_cut, kept as the answer; the spill under $TMPDIR removed."""
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr("tempfile.tempdir", None)          # re-read $TMPDIR
    env = {"SRTSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    est = estimate(export, SourceFormat.NSYS_SQLITE)
    budget = str(est.peak_bytes - (1 << 20))
    got = invoke("diagnose", export, "--json", "--memory-budget", budget, env=env)
    assert got.exit_code == 0, got.output
    whole = invoke("diagnose", export, "--json", "--no-cache", "--memory-budget", "none")
    assert got.stdout == whole.stdout and "window_cut" not in got.stdout
    # a budget under what any diagnosis holds (the interpreter alone): said, in one line
    note = [x for x in got.stderr.splitlines() if "over --memory-budget" in x]
    assert len(note) == 1 and note[0].startswith(f"srtscope: note: {export.name}: a diagnosis in windows holds")
    assert list((tmp_path / "cache").rglob("*.json*"))                  # the answer is kept ...
    again = invoke("diagnose", export, "--json", "--memory-budget", budget, env=env)
    assert again.stdout == whole.stdout                                   # ... and given again
    assert not list(spill.iterdir())                                      # the spill is gone


def _no_room_to_spill(monkeypatch) -> None:
    """A $TMPDIR too full for the spill: the export is read over a window instead."""
    real = shutil.disk_usage

    def full(path):
        u = real(path)
        return type(u)(u.total, u.total - 1, 1)
    monkeypatch.setattr("srtscope.analyzers.traces.shutil.disk_usage", full)


def test_over_budget_diagnoses_a_window_and_every_report_says_so(export: Path, tmp_path: Path, monkeypatch) -> None:
    _no_room_to_spill(monkeypatch)
    est = estimate(export, SourceFormat.NSYS_SQLITE)
    budget = str(est.peak_bytes - (1 << 20))
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    r = invoke("diagnose", export, "--json", "--no-cache", "--memory-budget", budget, "--markdown", md,
               "--html", html)
    assert r.exit_code == 0, r.output
    assert "not diagnosed whole in windows: its spill needs" in r.stderr
    doc = json.loads(r.stdout)
    cut = [w["message"] for w in doc["capture"]["warnings"] if w["code"] == "window_cut"]
    assert len(cut) == 1 and cut[0].startswith("memory budget: only ") and " s of the capture" in cut[0]
    assert re.search(r"\d+ whole steps? of \d+", cut[0])
    assert "--memory-budget 1GiB for all" in cut[0] and "--steps A:B" in cut[0]
    whole = json.loads(invoke("diagnose", export, "--json", "--no-cache", "--memory-budget", "none").stdout)
    assert 0 < doc["steps"]["count"] < whole["steps"]["count"]
    assert "memory budget: only" in md.read_text() and "memory budget: only" in html.read_text()
    text = invoke("diagnose", export, "--no-cache", "--memory-budget", budget)
    assert text.exit_code == 0 and "window_cut" in text.stdout


def test_a_windowed_answer_is_never_kept_as_the_whole_one(export: Path, tmp_path: Path, monkeypatch) -> None:
    _no_room_to_spill(monkeypatch)
    env = {"SRTSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    est = estimate(export, SourceFormat.NSYS_SQLITE)
    cut = invoke("diagnose", export, "--json", "--memory-budget", str(est.peak_bytes - (1 << 20)), env=env)
    assert cut.exit_code == 0 and "window_cut" in cut.stdout
    # neither the window's tables nor its answer are kept: both are the whole file's entries
    assert not list((tmp_path / "cache").rglob("*.arrow")) and not list((tmp_path / "cache").rglob("*.json*"))
    whole = invoke("diagnose", export, "--json", "--memory-budget", "none", env=env)
    assert whole.exit_code == 0 and "memory budget: only" not in whole.stdout


def test_kineto_over_budget_is_refused_in_one_line() -> None:
    r = invoke("diagnose", SAMPLES / "vllm_instrument_clean.json.gz", "--memory-budget", "64MiB")
    _one_error_line(r, "vllm_instrument_clean.json.gz: a diagnosis needs ~", "over --memory-budget 64 MiB",
                    "raise it (--memory-budget 1GiB)", "only nsys exports can be read by time window")


@pytest.mark.parametrize("a, b", [("healthy.sqlite", "prep_bound.sqlite"),          # steps from step ranges
                                  ("host_sync_bound.sqlite", "copy_bound.sqlite")])  # ... from the API rows
def test_compare_takes_the_budget_for_each_side(a: str, b: str) -> None:
    # each side over the budget is diagnosed whole, window by window: the same comparison
    plain = invoke("compare", SAMPLES / a, SAMPLES / b)
    r = invoke("compare", SAMPLES / a, SAMPLES / b, "--memory-budget", "64MiB")
    assert r.exit_code == 0 and r.stdout == plain.stdout, r.output
    assert "not diagnosed whole in windows" not in r.stderr


TWO_GPUS = REPO.parent / "shared" / "traces" / "real" / "nsys" / \
    "fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite"


@pytest.mark.skipif(not TWO_GPUS.is_file(), reason="the shared real traces are not here")
def test_compare_over_budget_on_a_two_gpu_export() -> None:
    # two GPUs in one export, steps from the CUDA API rows: windowed too, the same comparison
    plain = invoke("compare", TWO_GPUS, SAMPLES / "healthy.sqlite")
    r = invoke("compare", TWO_GPUS, SAMPLES / "healthy.sqlite", "--memory-budget", "64MiB")
    assert r.exit_code == plain.exit_code and r.stdout == plain.stdout, r.output
    assert "not diagnosed whole in windows" not in r.stderr


@pytest.mark.parametrize("trace,steps", [("healthy.sqlite", "3:8"), ("eager_fallback.sqlite", "2:5"),
                                         ("scheduler_bound.sqlite", "5:")])
def test_steps_read_alone_print_the_same_json(trace: str, steps: str, tmp_path: Path) -> None:
    # with the cache on (every file cached: min bytes 0) --steps crops the whole read, as ever;
    # with --no-cache only the steps' window is read
    cached = invoke("diagnose", SAMPLES / trace, "--json", "--steps", steps,
                    env={"SRTSCOPE_CACHE_MIN_BYTES": "0", "SRTSCOPE_CACHE_DIR": str(tmp_path / "c")})
    alone = invoke("diagnose", SAMPLES / trace, "--json", "--steps", steps, "--no-cache")
    assert cached.exit_code == alone.exit_code == 0
    assert alone.stdout == cached.stdout


def test_rank_files_over_budget_are_diagnosed_over_one_window(export: Path, tmp_path: Path) -> None:
    files = [tmp_path / "job.rank0.sqlite", tmp_path / "job.rank1.sqlite"]
    for f in files:
        shutil.copyfile(export, f)
    est = estimate(export, SourceFormat.NSYS_SQLITE)
    r = invoke("diagnose", *files, "--json", "--no-cache", "--jobs", "2", "--memory-budget",
               str(2 * est.peak_bytes - BASE_BYTES - (1 << 20)))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [w["code"] for w in doc["capture"]["warnings"]].count("window_cut") == 1
    assert doc["capture"]["ranks"] == [0, 1]
