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
from srtscope.cli.render import busy_note, default_evidence


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
