"""``srtscope cache``: what the cache holds, and ``--clear`` empties it without touching a trace."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SRTSCOPE_CACHE_MIN_BYTES", "0")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("COLUMNS", "200")


def _cli(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def test_lists_tables_and_answers_then_clears(tmp_path):
    trace = tmp_path / "healthy.sqlite"
    shutil.copyfile(SAMPLES / "healthy.sqlite", trace)
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    assert "empty" in _cli("cache")
    _cli("diagnose", "--json", str(trace))
    listing = _cli("cache")
    assert "2 entries" in listing
    assert "tables" in listing and "answer" in listing and str(trace) in listing
    cleared = _cli("cache", "--clear")
    assert "2 entries removed" in cleared
    assert "0 entries" in _cli("cache")
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == digest


def test_a_damaged_entry_is_listed_as_such_and_cleared(tmp_path):
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(SAMPLES / "healthy.sqlite", trace)
    _cli("diagnose", "--json", "--threshold-us", "6", str(trace))
    (answer,) = (tmp_path / "cache").glob("diagnosis-*")
    (answer / "meta.json").write_text("{not json")
    listing = _cli("cache")
    assert " damaged " in listing and " tables " in listing
    assert "2 entries removed" in _cli("cache", "--clear")


def test_a_long_trace_path_keeps_its_file_name_at_80_columns(tmp_path, monkeypatch):
    """The audit: at 80 columns the path was cut with "…" before the file name; it folds instead."""
    deep = tmp_path / "a_rather_long_folder_name" / "and_another_one_below_it"
    deep.mkdir(parents=True)
    trace = deep / "cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite"
    shutil.copyfile(SAMPLES / "healthy.sqlite", trace)
    _cli("diagnose", "--json", str(trace))
    monkeypatch.setenv("COLUMNS", "80")
    listing = _cli("cache")
    rows = [ln.rsplit("│", 1)[1].strip() for ln in listing.splitlines() if ln.count("│") >= 3]
    assert all(len(ln) <= 80 for ln in listing.splitlines())
    assert "…" not in listing and str(trace) in "".join(rows)
