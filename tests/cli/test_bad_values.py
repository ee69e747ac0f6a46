"""Items 9 and 10 of issue 14: every bad value exits 2 with one line, never 1; absurd sizes meet a
stated maximum before any work starts (a subprocess timeout bounds each case)."""
from __future__ import annotations

import os
import shutil

import pytest
from cli_proc import SAMPLES, Done, srtscope
from typer.testing import CliRunner

from srtscope.cli.app import app

TRACE = str(SAMPLES / "healthy.sqlite")
RUN = ["run", "--requests", "2", "--max-new-tokens", "2", "--device", "cpu"]

# work that could never finish if accepted: each in a subprocess bounded by a timeout
ABSURD = {
    "requests 10**12": (["run", "-n", str(10**12)], "--requests: must be in 1..100000"),
    "max-new-tokens 10**9": (["run", "--max-new-tokens", str(10**9)], "--max-new-tokens: must be in 1..1024"),
    "tp 1000": (["run", "--tp", "1000"], "--tp: must be in 1..8"),
    "inject 1e12": (["run", "--inject", "sched=1e12"], "at most 1000000 us"),
    "inject inf": (["run", "--inject", "sched=inf"], "finite"),
    "threshold 1e300": (["diagnose", TRACE, "--threshold-us", "1e300"], "--threshold-us"),
}

# the rest fail before any work: checked in-process (fast)
CASES = {
    "cuda-graph-max-bs huge": (["run", "--cuda-graph-max-bs", str(10**9)], "--cuda-graph-max-bs"),
    "seed 2**80": (["run", "--seed", str(2**80)], "--seed: must be in 0..4294967295"),
    "seed negative": (["run", "--seed", "-1"], "--seed"),
    "inject nan": (["run", "--inject", "sched=nan"], "finite"),
    "inject -0.5": (["run", "--inject", "prep=-0.5"], ">= 0"),
    "inject no number": (["run", "--inject", "result=soon"], "must be a number"),
    "straggler rank 5": (["run", "--tp", "2", "--inject", "straggler=10@5"], "straggler_rank=5"),
    "straggler bad rank": (["run", "--tp", "2", "--inject", "straggler=10@x"], "rank after '@'"),
    # diagnose / compare thresholds
    "threshold inf": (["diagnose", TRACE, "--threshold-us", "inf"], "--threshold-us"),
    "threshold nan": (["diagnose", TRACE, "--threshold-us", "nan"], "--threshold-us"),
    "threshold negative": (["diagnose", TRACE, "--threshold-us", "-1"], "--threshold-us"),
    "compare threshold inf": (["compare", TRACE, TRACE, "--threshold-us", "inf"], "--threshold-us"),
    "regression nan": (["compare", TRACE, TRACE, "--fail-on-regression", "nan"], "--fail-on-regression"),
    "regression -inf": (["compare", TRACE, TRACE, "--fail-on-regression", "-inf"], "--fail-on-regression"),
    "steps huge": (["diagnose", TRACE, "--steps", f"0:{10**30}"], "--steps"),
}


@pytest.mark.parametrize("args, needle", ABSURD.values(), ids=ABSURD.keys())
def test_work_that_cannot_finish_is_refused(args, needle):
    srtscope(*args, timeout=30).one_error_line(2, needle)


@pytest.mark.parametrize("args, needle", CASES.values(), ids=CASES.keys())
def test_bad_value_is_exit_2_one_line(args, needle):
    r = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    Done(r.exit_code, r.stdout, r.stderr).one_error_line(2, needle)


def test_trace_in_a_folder_without_search_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    shutil.copy(TRACE, locked / "t.sqlite")
    os.chmod(locked / "t.sqlite", 0o644)
    os.chmod(locked, 0o644)                    # readable, not searchable
    try:
        srtscope("diagnose", locked / "t.sqlite", unprivileged=True).one_error_line(2, "permission denied")
        srtscope("compare", locked / "t.sqlite", TRACE, unprivileged=True).one_error_line(2, "permission denied")
    finally:
        os.chmod(locked, 0o755)


def test_unwritable_out(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        srtscope(*RUN, "--out", ro, unprivileged=True).one_error_line(2, str(ro), "not writable")
        srtscope(*RUN, "--out", ro / "sub", unprivileged=True).one_error_line(2, "Permission denied")
        srtscope("diagnose", TRACE, "--markdown", ro / "r.md", unprivileged=True).one_error_line(2, "r.md")
    finally:
        os.chmod(ro, 0o755)
