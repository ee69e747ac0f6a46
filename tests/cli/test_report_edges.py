"""The text, Markdown and Perfetto reports' edges: names from traces printed literally and clipped
without collisions, counts that say what they count, no unexplained symbols, compare in words."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.compare_report import render_diff
from srtscope.cli.contract import SavedDiagnosis
from srtscope.cli.markdown import diagnosis_markdown
from srtscope.cli.names import short_names
from srtscope.cli.perfetto import perfetto_events, write_perfetto
from srtscope.cli.render import render_diagnosis, step_strip

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
_CACHE: dict[str, tuple] = {}


def diag(*names: str):
    key = ",".join(names)
    if key not in _CACHE:
        d = diagnose(load_timeline([SAMPLES / n for n in names]))
        _CACHE[key] = (d, d.to_json())
    d, j = _CACHE[key]
    return d, copy.deepcopy(j)


def text_report(j: dict, width: int = 80, full: bool = False) -> str:
    buf = io.StringIO()
    render_diagnosis(j, Console(file=buf, width=width, force_terminal=False, color_system=None), full=full)
    return buf.getvalue()


@pytest.mark.parametrize("hostile", [
    "[/bold]",                                   # closing tag without opener: crashed Rich
    "[link=file:///etc/passwd]x[/link]",         # would become a terminal hyperlink
    "\x1b[2J\x1b]0;pwned\x07kernel",             # clear screen, window title
    "bad \ud800 surrogate",                      # unencodable
])
def test_names_from_traces_print_literally(hostile):
    _, j = diag("healthy.sqlite")
    j["top_kernels"][0]["name"] = hostile
    j["capture"]["tool_version"] = hostile
    j["verdict"]["evidence"][0]["text"] = hostile
    out = text_report(j)
    assert "\x1b" not in out and "\x07" not in out
    if hostile.startswith("["):
        assert hostile[:7] in out                 # shown as text, not applied as markup


def test_long_metadata_is_clipped_before_layout():
    _, j = diag("healthy.sqlite")
    j["capture"]["tool_version"] = "v" * 5_000_000
    j["capture"]["warnings"] = [{"code": "other", "message": "m" * 5_000_000}]
    out = text_report(j)
    assert len(out) < 50_000


def test_clipped_kernel_names_stay_distinct():
    names = [f"sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize{t}x128x32_stage{s}_warpsize2x2x1_tensor16x8x16"
             for t, s in ((64, 3), (128, 4), (256, 5))]
    clipped = short_names(names, 48)
    assert len(set(clipped)) == 3 and all(len(c) <= 48 for c in clipped)


@pytest.mark.parametrize("width", [20, 30, 40, 56])
def test_tags_of_alike_names_show_what_differs_with_brackets_closed(width):
    """The audit: ``cutlass::Kernel<… [cutlass_80_tensor… #1``: a tag that repeated the names' common
    start (identical halves) and lost its ``]`` to the number. Four real cutlass names (HTA torchrec
    trace) that differ only in the middle of their template argument."""
    tiles = ("256x64_16x4_tn", "256x128_32x3_nt", "256x128_32x3_nn", "256x128_32x3_tn")
    names = [f"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_{t}_align1>"
             f"(cutlass_80_tensorop_s1688gemm_{t}_align1::Params)" for t in tiles]
    shown = short_names(names, width)
    assert len(set(shown)) == 4 and all(len(c) <= width for c in shown)
    tags = [c.split(" [", 1)[1] if " [" in c else "" for c in shown]
    for c, tag in zip(shown, tags):
        assert c.count("[") == c.count("]") <= 1 and "cutlass_80" not in tag, c
    assert tags[1:] == ["…nt_align1]", "…nn_align1]", "…tn_align1]"]
    assert tags[0] == "" or tags[0].startswith("…256x64_1")


def test_strip_counts_every_step_and_explains_its_symbols():
    _, j = diag("launch_bound_eager.sqlite")
    total = j["steps"]["count"]
    strip = step_strip(j, width=8).plain
    legend, row = strip.splitlines()[1], strip.splitlines()[2]
    assert f"… {total - 8} more steps" in row
    for ch in set(row.split(" …")[0]):
        assert re.search(rf"(^|\s|\(){re.escape(ch)} ", legend), f"{ch!r} not in the legend"


def test_budget_and_bubbles_say_what_they_cover():
    _, j = diag("scheduler_bound.sqlite")
    out = text_report(j, width=200, full=True)
    assert "inside steps only" in out and "of the whole active window" in out


def test_no_graph_anywhere_lists_no_eager_reasons():
    _, j = diag("launch_bound_eager.sqlite")
    out = text_report(j, width=120, full=True)
    assert "no step replayed a CUDA graph" in out and "disabled" not in out


def test_markdown_tables_add_up_and_never_print_none():
    _, j = diag("comm_straggler.rank0.sqlite", "comm_straggler.rank1.sqlite")
    md = diagnosis_markdown(j)
    assert "None" not in md
    cls = md.split("| class | time | share |")[1].split("\n\n")[0]
    shares = [float(x) for x in re.findall(r"\| ([\d.]+)% \|", cls)]
    assert shares and abs(sum(shares) - 100.0) < 0.5
    assert "Step budget" in md and "## What to do next" in md


def test_perfetto_keeps_the_source_clock_and_names_steps_cleanly(tmp_path):
    d, _ = diag("healthy.sqlite")
    ev = perfetto_events(d)
    steps = [e for e in ev if e.get("cat") == "step"]
    assert steps and all("  " not in e["name"] for e in steps)
    first = int(d.steps.table["start_ns"].min())
    assert min(e["ts"] for e in steps) == pytest.approx(first / 1e3)       # source µs, offset 0
    tl = load_timeline([SAMPLES / "healthy.sqlite"])
    path = write_perfetto(d, tmp_path / "p.json", timeline=tl)
    doc = json.loads(path.read_text())
    assert doc["otherData"]["clock_offset_ns"] == 0
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == int((tl.device["kind"] == "kernel").sum())


def test_compare_says_worse_and_better_in_words_with_units():
    _, a = diag("scheduler_bound.sqlite")
    _, b = diag("healthy.sqlite")
    from srtscope.analyzers.analyses.diff import compare
    doc = compare(SavedDiagnosis(a), SavedDiagnosis(b)).to_json()
    buf = io.StringIO()
    render_diff(doc, Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert re.search(r"idle time in bubbles .*ms .* better", out)
    assert not re.search(r"\d{7,}", out)                     # no raw ns
    b["capture"]["devices"] = [{"id": 0, "name": "NVIDIA A100", "rank": 0}]
    buf = io.StringIO()
    render_diff(compare(SavedDiagnosis(a), SavedDiagnosis(b)).to_json(), Console(file=buf, width=120,
                                                                                 color_system=None))
    assert "different devices" in buf.getvalue()


def test_perfetto_device_activity_is_capped_with_a_note(tmp_path, monkeypatch):
    """``--perfetto-kernels`` on a 300 MB export took 3.96 GB and wrote 556 MB: the device activity is
    streamed in batches and capped; the file and the CLI say how many of how many."""
    from typer.testing import CliRunner

    import srtscope.cli.perfetto as P
    from srtscope.cli.app import app

    tl = load_timeline([SAMPLES / "healthy.sqlite"])
    total = len(tl.device)
    monkeypatch.setattr(P, "MAX_DEVICE_EVENTS", 25)
    monkeypatch.setattr(P, "BATCH", 7)                        # several batches
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["diagnose", "--no-cache", str(SAMPLES / "healthy.sqlite"), "--perfetto", str(out),
                                 "--perfetto-kernels"])
    assert r.exit_code == 0, r.output
    assert f"srtscope: note: --perfetto-kernels wrote the first 25 of {total:,} device activities" in r.stderr
    doc = json.loads(out.read_text())
    assert doc["otherData"]["device_events"] == {"written": 25, "total": total, "cap": 25}
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "memcpy", "memset")]
    assert len(slices) == 25
    assert [e["ts"] for e in slices] == sorted(e["ts"] for e in slices)      # the earliest, in order
    assert all(e["name"] for e in slices)
    named = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named
