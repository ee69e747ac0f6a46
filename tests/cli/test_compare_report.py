"""``compare``'s reports (issue 29): a one-line summary of what got better or worse and why, human
names sorted by impact, kernels and ranges per step; ``--markdown`` (GFM) and ``--html`` written
beside the terminal or ``--json`` output."""
from __future__ import annotations

import json
from pathlib import Path

from formats import check_html, check_markdown
from typer.testing import CliRunner

from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_compare_writes_markdown_and_html_and_says_why(tmp_path):
    md, page = tmp_path / "c.md", tmp_path / "c.html"
    before, after = SAMPLES / "healthy.sqlite", SAMPLES / "scheduler_bound.sqlite"
    r = CliRunner().invoke(app, ["compare", str(before), str(after), "--markdown", str(md), "--html", str(page),
                                 "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"]["changed"] and doc["summary"].startswith("mean step ")
    assert "verdict kernel/compute -> scheduler/sched_cpu" in doc["summary"]
    text = check_markdown(md.read_text())
    assert doc["summary"].replace("_", "").split(":")[0] in text.replace("_", "")
    check_html(page.read_text())
    assert 'id="summary">' in page.read_text()
    # the title names the two files; their full paths follow on a line that wraps anywhere (the
    # audit: two absolute paths in the heading overflowed the page)
    html = page.read_text()
    assert "<title>srtscope compare: healthy.sqlite → scheduler_bound.sqlite</title>" in html
    assert f'<p class="paths">before {before}<br>after {after}</p>' in html
    assert "h1{font-size:22px;overflow-wrap:anywhere}" in html
    # the terminal report: the summary first, figures by human name, largest change per step first
    r = CliRunner(env={"COLUMNS": "100"}).invoke(app, ["compare", str(before), str(after)])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "mean step" in lines[1]
    head = next(i for i, x in enumerate(lines) if x.startswith("figure ") and "before" in x)
    rows = [ln.split("  ")[0].strip() for ln in lines[head + 2:]]
    assert rows[0] == "mean step"                                  # the largest mover per step
    assert "bubbles.total_ns" not in r.stdout                      # human names, not JSON keys


def test_compare_regression_names_the_figure_in_words(tmp_path):
    r = CliRunner().invoke(app, ["compare", str(SAMPLES / "healthy.sqlite"), str(SAMPLES / "scheduler_bound.sqlite"),
                                 "--fail-on-regression", "5"])
    assert r.exit_code == 3
    assert "regression: mean step (budget.mean_step.wall_ns): 117 us -> 1.18 ms" in r.stdout
