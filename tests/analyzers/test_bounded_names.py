"""Huge names (issue 26 item 7): a name longer than ``MAX_NAME_CHARS`` is cut inside SQLite, keeping
its end, so it never reaches Python whole (a 300 MB kernel name took 1.9 GB and was kept whole in
the cached answer); every string of the diagnosis document is at most 4096 characters."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.analyzers.model.units import MAX_NAME_CHARS, MAX_TEXT_CHARS, NAME_END_CHARS, bound_strings
from srtscope.analyzers.readers import read_one
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
HUGE = "k" * (2 << 20) + "_the_end_that_tells_instances_apart"


@pytest.fixture
def trace(tmp_path) -> Path:
    """kernel_bound.sqlite with its first kernel's name (and an NVTX range's text) 2 MiB long."""
    p = tmp_path / "huge_name.sqlite"
    shutil.copyfile(SAMPLES / "kernel_bound.sqlite", p)
    con = sqlite3.connect(p)
    sid = con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (HUGE, sid))
    con.execute("UPDATE NVTX_EVENTS SET text = ? WHERE rowid = "
                "(SELECT MIN(rowid) FROM NVTX_EVENTS WHERE eventType = 59)", (HUGE,))
    con.commit()
    con.close()
    return p


def test_the_reader_cuts_huge_names_keeping_their_end(trace):
    tl = read_one(trace)
    longest = {t: max((len(str(n)) for n in getattr(tl, t)["name"].unique()), default=0) for t in ("device", "ranges")}
    assert longest == {"device": MAX_NAME_CHARS, "ranges": MAX_NAME_CHARS}
    cut = next(str(n) for n in tl.device["name"].unique() if len(str(n)) == MAX_NAME_CHARS)
    assert cut.endswith("…" + HUGE[-NAME_END_CHARS:]) and cut.startswith("kkkk")


def test_the_document_holds_no_string_over_the_bound(trace, monkeypatch, tmp_path):
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("SRTSCOPE_CACHE_MIN_BYTES", "0")
    r = CliRunner().invoke(app, ["diagnose", "--json", str(trace)])
    assert r.exit_code == 0, r.output
    strings: list[str] = []

    def walk(node) -> None:
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(k)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(r.stdout))
    assert max(map(len, strings)) == MAX_TEXT_CHARS
    assert any(s.endswith("_the_end_that_tells_instances_apart") and len(s) == MAX_TEXT_CHARS for s in strings)
    (answer,) = (tmp_path / "cache").glob("diagnosis-*")
    assert (answer / "meta.json").stat().st_size < 2 << 20          # the cached answer is bounded too


@pytest.mark.parametrize("node, want", [
    ("short", "short"),
    ("x" * 5000, "x" * (MAX_TEXT_CHARS - 65) + "…" + "x" * 64),
    ({"y" * 5000: ["z" * 4096, 1, None]}, {"y" * (MAX_TEXT_CHARS - 65) + "…" + "y" * 64: ["z" * 4096, 1, None]}),
    (1.5, 1.5),
])
def test_bound_strings(node, want):
    assert bound_strings(node) == want


def test_a_huge_kernel_name_is_never_loaded_whole(tmp_path):
    """A 64 MiB kernel name: read through blob I/O (its first and last bytes), the CLI's peak memory
    stays near a plain diagnosis' (~150 MB measured; 760 MB for a 100 MB name before)."""
    from tests.analyzers._cli import srtscope

    p = tmp_path / "huge.sqlite"
    shutil.copyfile(SAMPLES / "kernel_bound.sqlite", p)
    con = sqlite3.connect(p)
    sid = con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    con.execute("UPDATE StringIds SET value = ? WHERE id = ?", ("é" * (32 << 20) + "_end", sid))
    con.commit()
    con.close()
    r = srtscope("diagnose", "--json", "--no-cache", p)
    assert r.code == 0, r.stderr
    assert r.peak_rss_mb < 260, r.peak_rss_mb
    names = [k["name"] for k in json.loads(r.stdout)["top_kernels"]]
    assert any(n.startswith("éééé") and n.endswith("…" + "é" * 60 + "_end") for n in names)


def test_blob_io_and_the_sql_cut_agree(trace, monkeypatch):
    from srtscope.analyzers.readers.nsys_strings import NsysStrings

    blob = read_one(trace)
    monkeypatch.setattr(NsysStrings, "long_string_ids", lambda self: set())
    sql = read_one(trace)
    assert list(blob.device["name"].cat.categories) == list(sql.device["name"].cat.categories)


def test_kineto_names_are_cut_alike(tmp_path):
    import gzip

    doc = json.loads(gzip.decompress((SAMPLES / "profiler_steps.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["name"] = HUGE
    p = tmp_path / "huge.json"
    p.write_text(json.dumps(doc))
    names = [str(n) for n in read_one(p).device["name"].unique()]
    assert max(map(len, names)) == MAX_NAME_CHARS
    assert any(n.endswith("…" + HUGE[-NAME_END_CHARS:]) for n in names)
