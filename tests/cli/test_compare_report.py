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


def _gate(before, after, *extra: str):
    r = CliRunner().invoke(app, ["compare", str(before), str(after), "--fail-on-regression", "5", "--json", *extra])
    return r.exit_code, json.loads(r.stdout), r.stderr


def test_the_gate_both_ways_on_a_planted_regression():
    """A pair with a planted scheduler delay (samples): the mean step, gated by default, fails one
    way (exit 3, the reason on stderr) and passes the other (exit 0, 'gate passed' on stderr)."""
    healthy, planted = SAMPLES / "healthy.sqlite", SAMPLES / "scheduler_bound.sqlite"
    code, doc, err = _gate(healthy, planted)
    assert code == 3 and doc["regressions"] == ["budget.mean_step.wall_ns"]
    assert doc["gate"][0]["outcome"] == "regressed"
    assert " ".join(err.split()).startswith("regression: mean step (budget.mean_step.wall_ns): 117 us -> 1.18 ms")
    code, doc, err = _gate(planted, healthy)
    assert code == 0 and doc["regressions"] == [] and doc["gate"][0]["outcome"] == "better"
    assert "gate passed: mean step" in err


def test_an_improved_mean_step_passes_though_other_figures_got_worse():
    """The audit: a run whose mean step fell 74% failed because one small figure grew. Only the
    gated figure decides; the figures the user names are gated instead, by label or key."""
    before, after = SAMPLES / "scheduler_bound.sqlite", SAMPLES / "host_sync_bound.sqlite"
    code, doc, _ = _gate(before, after)
    figs = {f["figure"]: f for f in doc["figures"]}
    assert figs["budget.mean_step.wall_ns"]["delta"] < 0 and code == 0
    assert figs["bubbles.by_class.sync_ns"]["worse"]                   # a planted sync grew
    code, doc, err = _gate(before, after, "--figure", "idle while the host was in sync")
    assert doc["gate"][0]["figure"] == "bubbles.by_class.sync_ns"
    assert code == 3 and "regression: idle while the host was in sync" in " ".join(err.split())


def test_the_gate_both_ways_on_the_real_fastvideo_pair(fastvideo_pair):
    before, after = fastvideo_pair
    one, doc_one, _ = _gate(before, after)
    two, doc_two, _ = _gate(after, before)
    assert {one, two} == {0, 3}                           # one way a regression, the other a fix
    outcomes = {doc_one["gate"][0]["outcome"], doc_two["gate"][0]["outcome"]}
    assert outcomes == {"regressed", "better"}
