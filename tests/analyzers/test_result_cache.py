"""The diagnosis cache (``analyzers/cache/result_cache.py``): the same question about the same traces is
answered from the cache; any change of a trace, a parameter or the code is a miss; a damaged entry is
dropped; the cache's own trouble never fails a diagnosis."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.analyzers.cache import cache_store
from srtscope.analyzers.cache import result_cache as R
from srtscope.analyzers.cache import table_cache as C
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "sched.sqlite"
    shutil.copyfile(SAMPLES / "scheduler_bound.sqlite", p)
    return p


class Analyses:
    """Counts the analyses' runs (``diagnose``): an answer from the cache makes none."""

    def __init__(self, monkeypatch) -> None:
        import srtscope.analyzers.diagnose as D

        self.n = 0
        real = D.diagnose

        def counted(*a, **kw):
            self.n += 1
            return real(*a, **kw)

        monkeypatch.setattr(D, "diagnose", counted)


def _run(*args: str | Path) -> str:
    r = CliRunner().invoke(app, ["diagnose", "--json", *[str(a) for a in args]])
    assert r.exit_code == 0, r.output
    return r.stdout


def _entries() -> list[Path]:
    root = C.cache_dir()
    return sorted(root.glob("diagnosis-*")) if root.exists() else []


def test_second_look_is_answered_from_the_cache(trace, monkeypatch):
    runs = Analyses(monkeypatch)
    first = _run(trace)
    assert runs.n == 1 and len(_entries()) == 1
    second = _run(trace)
    assert runs.n == 1, "the same question ran the analyses again"
    assert second == first


def test_the_answer_is_the_one_without_the_cache(trace):
    cached = (_run(trace), _run(trace))
    fresh = _run("--no-cache", trace)
    assert cached[0] == cached[1] == fresh
    assert len(_entries()) == 1          # --no-cache neither used nor filled it


@pytest.mark.parametrize("change", [
    "threshold",        # another bubble threshold: another question
    "steps",            # another step range
    "touched",          # the trace's mtime moved
    "rewritten",        # the same mtime, other contents (SQLite bumps its header's change counter)
    "code",             # the analyses' code changed
])
def test_what_changes_the_answer_is_a_miss(trace, monkeypatch, change):
    runs = Analyses(monkeypatch)
    _run(trace)
    args: list[str | Path] = [trace]
    if change == "threshold":
        args = ["--threshold-us", "7", trace]
    elif change == "steps":
        args = ["--steps", "1:4", trace]
    elif change == "touched":
        st = trace.stat()
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "rewritten":
        st = trace.stat()
        con = sqlite3.connect(trace)
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = end - 1 WHERE rowid = 1")
        con.commit()
        con.close()
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "code":
        monkeypatch.setattr(R, "code_fingerprint", lambda: "another build")
    _run(*args)
    assert runs.n == 2


def test_the_sources_are_named_as_given(trace, monkeypatch, tmp_path):
    """The document names the traces as the user spelled them: another spelling is another entry."""
    monkeypatch.chdir(tmp_path)
    a = json.loads(_run(trace))
    b = json.loads(_run(trace.name))
    assert a["capture"]["sources"] == [str(trace)] and b["capture"]["sources"] == [trace.name]
    assert len(_entries()) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other_key", "not_an_object"])
def test_a_damaged_entry_is_dropped_and_rebuilt(trace, monkeypatch, damage):
    first = _run(trace)
    (entry,) = _entries()
    doc = entry / "meta.json"
    text = doc.read_text()
    if damage == "garbage":
        doc.write_bytes(os.urandom(64))
    elif damage == "truncated":
        doc.write_text(text[: len(text) // 2])
    elif damage == "other_key":
        stored = json.loads(text)
        stored["key"]["params"]["threshold_us"] = 123.0
        doc.write_text(json.dumps(stored))
    else:
        doc.write_text("[1, 2, 3]")
    runs = Analyses(monkeypatch)
    assert _run(trace) == first
    assert runs.n == 1
    assert json.loads((_entries()[0] / "meta.json").read_text())["doc"] == json.loads(first)


def test_an_unwritable_cache_warns_once_and_diagnoses(trace, monkeypatch, tmp_path):
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(blocker / "cache"))
    key = R.diagnosis_key([trace], {"threshold_us": 5.0})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert R.put_diagnosis(key, {"answer": 1}) == {"answer": 1}
        R.put_diagnosis(key, {"answer": 1})
    assert len([w for w in seen if issubclass(w.category, C.CacheWarning)]) == 1
    assert R.get_diagnosis(key) is None


def test_the_table_and_diagnosis_entries_share_one_cap(trace, monkeypatch):
    """Diagnosis entries count against the cache's size cap and are evicted least recently used first."""
    _run(trace)
    (answer,) = _entries()
    os.utime(answer / "meta.json", (1_000_000, 1_000_000))          # the least recently used entry
    cap = sum(b for _, b, _ in C.TimelineCache().entries())        # exactly what is there now
    monkeypatch.setattr(cache_store, "max_bytes", lambda: cap)
    other = trace.with_name("other.sqlite")                        # a name as long as the first's
    shutil.copyfile(trace, other)
    _run(other)
    assert not answer.exists()
    assert sum(b for _, b, _ in C.TimelineCache().entries()) <= cap


def test_an_answer_from_the_cache_imports_no_numpy_pandas_or_analyses(trace, tmp_path):
    """What keeps a second look near Python's start-up time: the hit path reads JSON only."""
    import subprocess
    import sys

    env = dict(os.environ, SRTSCOPE_CACHE_DIR=str(tmp_path / "cache"), SRTSCOPE_CACHE_MIN_BYTES="0")
    cmd = [sys.executable, "-X", "importtime", "-m", "srtscope", "diagnose", "--json", str(trace)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
    assert first.stdout == second.stdout

    def imported(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}

    assert {"pandas", "srtscope.analyzers.diagnose"} <= imported(first.stderr)
    assert not {"numpy", "pandas", "pyarrow", "srtscope.analyzers.diagnose"} & imported(second.stderr)


def test_every_output_of_an_answer_from_the_cache_is_the_first_look_s(trace, monkeypatch, tmp_path):
    """Text, HTML and Markdown rendered from the kept answer equal those of the first look, byte for byte."""
    monkeypatch.setenv("COLUMNS", "160")
    runs = Analyses(monkeypatch)
    outs = []
    for look in ("first", "second"):
        html, md = tmp_path / f"{look}.html", tmp_path / f"{look}.md"
        r = CliRunner().invoke(app, ["diagnose", str(trace), "--html", str(html), "--markdown", str(md)])
        assert r.exit_code == 0, r.output
        outs.append((r.stdout, html.read_bytes(), md.read_bytes()))
    assert runs.n == 1
    assert outs[0] == outs[1]
