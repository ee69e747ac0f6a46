"""The verdict as the reports show it (issue 46): the HTML card shows what the terminal's default
view shows — the headline, what fixing it gives, the other causes, the same evidence — and folds
the rest; a figure that looks impossible (busy time past the window, shares past 100%) says why."""
from __future__ import annotations

import html
import re

import pytest
from test_all_outputs import SAMPLES

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html
from srtscope.cli.report_words import busy_note, default_evidence


@pytest.mark.parametrize("name", ["scheduler_bound.sqlite", "comm_straggler.rank0.sqlite", "healthy.sqlite"])
def test_the_card_shows_the_terminal_view_and_folds_the_rest(name):
    d = diagnose(load_timeline([SAMPLES / name])).to_json()
    v = d["verdict"]
    page = diagnosis_html(d)
    card = page.split('<div class="card">', 1)[1].split('<div class="warn">', 1)[0]
    assert f"Bottleneck: {v['bottleneck'].upper()}" in card and html.escape(v["headline"]) in card
    if v["gain"]:
        assert f'<div class="gain" id="gain">{html.escape(v["gain"])}</div>' in card
    shown, shares, folded = default_evidence(d)
    first = re.search(r"</p>\s*<ul>(.*?)</ul>", card, re.S).group(1)
    assert first.count("<li>") == len(shown) + len(shares)
    if folded:
        fold = re.search(r"<details><summary>All evidence \((\d+) more\)</summary><ul>(.*?)</ul></details>", card, re.S)
        assert fold and int(fold.group(1)) == len(folded) == fold.group(2).count("<li>")
    assert "docs/glossary.md" in card


@pytest.mark.parametrize("doc, note", [
    # scenario: one device, kernels only: nothing to explain
    ({"device": {"busy_ns": 100, "kernel_ns": 100}, "capture": {"devices": [{}]}}, ""),
    # scenario: two devices summed: busy time can exceed the window
    ({"device": {"busy_ns": 100, "kernel_ns": 100}, "capture": {"devices": [{}, {}]}}, " (summed over 2 devices)"),
    # scenario: collectives overlap kernels: shares of busy time add past 100%
    ({"device": {"busy_ns": 100, "kernel_ns": 90, "comm_ns": 30}, "capture": {"devices": [{}]}},
     " (parts overlap: shares add past 100%)"),
])
def test_busy_note_says_why_a_figure_looks_impossible(doc, note):
    assert busy_note(doc) == note


@pytest.mark.parametrize("steps, split", [
    # scenario: an engine's steps, some replaying graphs: the split is the point
    ({"source": "loop.step", "graph": 12, "eager": 12}, " (12 graph replay, 12 eager)"),
    # scenario: an engine's steps, none replaying a graph: still its words
    ({"source": "vllm", "graph": 0, "eager": 3}, " (0 graph replay, 3 eager)"),
    # scenario: a solver's loop (steps from syncs), no graph: neither word applies
    ({"source": "sync", "graph": 0, "eager": 5}, ""),
    # scenario: a training script's profiler steps replaying graphs: graphs were there
    ({"source": "profiler_step", "graph": 4, "eager": 1}, " (4 graph replay, 1 eager)"),
])
def test_graph_replay_and_eager_only_where_they_mean_something(steps, split):
    from srtscope.cli.report_words import graph_split

    assert graph_split(steps) == split


def test_low_coverage_names_the_traces_own_kind_of_range():
    """The audit: ``low_nvtx_coverage`` said "NVTX ranges" on Kineto traces, which hold user
    annotations (record_function), not NVTX."""
    from srtscope.analyzers.analyses.verdict import caveats
    from srtscope.analyzers.model.results import BubbleResult
    from srtscope.analyzers.model.timeline import SourceFormat, TimelineMeta

    def line(fmt):
        b = BubbleResult.__new__(BubbleResult)
        object.__setattr__(b, "nvtx_coverage", 0.0)
        for k, v in (("total_ns", 100), ("window_ns", 1000), ("by_class", {})):
            object.__setattr__(b, k, v)
        notes, _ = caveats(TimelineMeta(format=fmt), b, "sync")
        return next(n for n in notes if n.startswith("low_nvtx_coverage"))

    assert "user annotations (record_function) cover 0%" in line(SourceFormat.KINETO)
    assert "NVTX ranges cover 0%" in line(SourceFormat.NSYS_SQLITE)
