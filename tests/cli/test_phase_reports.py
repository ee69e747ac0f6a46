"""Prefill and decode apart in every report: the terminal, Markdown and HTML show the same rows of
the JSON's ``phases`` (an instrumented vLLM run: 2 prefill steps among decode steps)."""
from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html
from srtscope.cli.markdown import diagnosis_markdown
from srtscope.cli.phases_view import phase_rows
from srtscope.cli.render import render_diagnosis

TRACE = Path(__file__).resolve().parents[2] / "sample_traces" / "vllm_instrument_sched.json.gz"


def test_each_report_shows_each_phase_with_its_verdict():
    d = diagnose(load_timeline([TRACE])).to_json()
    rows = phase_rows(d)
    assert {r[0] for r in rows} == {"prefill", "decode"}
    assert sum(int(r[1]) for r in rows) == sum(int(p["steps"]) for p in d["phases"])
    buf = io.StringIO()
    render_diagnosis(d, Console(file=buf, width=100, color_system=None))
    text, md, page = buf.getvalue(), diagnosis_markdown(d), diagnosis_html(d)
    for phase, steps, step, *_ , verdict, _worst in rows:
        line = next(x for x in text.splitlines() if x.startswith(phase + " ") and verdict in x)
        assert steps in line and step in line and verdict in line
        assert f"| {phase} | {steps} | {step} |" in md
        assert f"<td>{phase}</td><td>{steps}</td><td>{step}</td>" in page
