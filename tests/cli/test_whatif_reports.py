"""The what-if table in the text, Markdown and HTML reports, from the JSON contract's ``what_if``."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html
from srtscope.cli.markdown import diagnosis_markdown
from srtscope.cli.render import render_diagnosis, what_if_table

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _json(name: str) -> dict:
    return diagnose(load_timeline([SAMPLES / name])).to_json()


def test_text_report_shows_the_largest_payoff_first():
    j = _json("scheduler_bound.sqlite")
    top = j["what_if"][0]
    assert top["cause"] == "sched_cpu" and top["speedup"] > 1.5
    buf = io.StringIO()
    render_diagnosis(j, Console(file=buf, width=160, force_terminal=False, color_system=None), full=True)
    out = buf.getvalue()
    assert "what if: the mean step without each cause" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("sched_cpu ") and "x " in x)
    assert f"{top['speedup']:.2f}x" in line
    assert "what if: without sched_cpu" in out               # the verdict's evidence line


def test_markdown_and_html_carry_the_table():
    j = _json("prep_bound.sqlite")
    md = diagnosis_markdown(j)
    assert "## What if" in md and "| batch\\_prep [1] |" in md
    page = diagnosis_html(j)
    assert "What if: the mean step without each cause" in page and "<td>batch_prep</td>" in page


def test_no_table_without_a_saving():
    j = _json("healthy.sqlite")
    j["what_if"] = []
    assert what_if_table(j) is None
    assert "## What if" not in diagnosis_markdown(j)
    assert "What if:" not in diagnosis_html(j)


def test_each_row_shows_its_bound_and_a_thin_capture_predicts_nothing():
    j = _json("scheduler_bound.sqlite")
    top = j["what_if"][0]
    assert top["bound"] in ("none", "lost", "overlap", "copy_engine", "transport") and top["lost_ns"] >= top["saved_ns"]
    buf = io.StringIO()
    render_diagnosis(j, Console(file=buf, width=220, force_terminal=False, color_system=None))
    line = next(x for x in buf.getvalue().splitlines() if x.strip().startswith("sched_cpu ") and "x " in x)
    assert f" {top['bound']} " in line
    assert "| bound |" in diagnosis_markdown(j) and "<th>bound</th>" in diagnosis_html(j)
    # too little device work: the rows say so instead of a speedup
    j["what_if"] = [dict(w, saved_ns=0, step_ns_after=w["step_ns_before"], speedup=1.0, bound="too_little",
                         predicted=False) for w in j["what_if"]]
    buf = io.StringIO()
    render_diagnosis(j, Console(file=buf, width=220, force_terminal=False, color_system=None))
    assert "too little to predict" in buf.getvalue()
    assert "too little to predict" in diagnosis_markdown(j) and "too little to predict" in diagnosis_html(j)
