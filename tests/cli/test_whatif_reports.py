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
