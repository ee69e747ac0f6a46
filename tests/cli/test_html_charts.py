"""The HTML report's charts (issue 29): axes with units and tick labels, grouped legends, rank
separators and step numbers, byte units that scale, the caveats the terminal shows, host steps
outside the device's window drawn, and a timeline that zooms (in headless Chromium, where installed)."""
from __future__ import annotations

import copy
import html as htmllib
import re
from pathlib import Path

import pytest
from formats import CHROMIUM, browse, check_html, console_messages

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.units import fmt_bytes
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html
from srtscope.cli.html_charts import PW, bin_label, nice_ticks
from srtscope.cli.report_words import caveat_lines

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
_DOCS: dict[str, dict] = {}


def doc(*names: str) -> dict:
    key = ",".join(names)
    if key not in _DOCS:
        _DOCS[key] = diagnose(load_timeline([SAMPLES / n for n in names])).to_json()
    return copy.deepcopy(_DOCS[key])


def _svgs(page: str) -> list[str]:
    return re.findall(r'<svg width="\d+".*?</svg>(?=<div class="legend"|<p|</figure>|<h|$)', page, re.S)


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (3_400, "3.4 kB"), (50_000, "50.0 kB"),
                                     (12_000_000, "12.0 MB"), (2_600_000_000, "2.6 GB"), (-1, "?")])
def test_byte_units_scale(n, text):
    assert fmt_bytes(n) == text


def test_a_small_copy_is_not_zero_megabytes():
    d = doc("copy_bound.sqlite")
    kind = next(iter(d["device"]["memcpy"]))
    d["device"]["memcpy"][kind]["bytes"] = 256
    page = diagnosis_html(d)
    assert "<td>256 B</td>" in page and "0.0 MB" not in page


@pytest.mark.parametrize("lo, hi, text", [(0, 10_000, "< 10 us"), (10_000, 20_000, "10–20 us"),
                                          (500_000, 1_000_000, "500 us–1 ms"), (50_000_000, None, "≥ 50 ms")])
def test_histogram_bins_read_short(lo, hi, text):
    assert bin_label(lo, hi) == text


def test_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0, 47e6, 6) == [0, 1e7, 2e7, 3e7, 4e7]
    assert nice_ticks(0, 100, 4) == [0, 50, 100] or nice_ticks(0, 100, 4) == [0, 20, 40, 60, 80, 100]


def test_every_chart_has_axes_with_units_and_a_grouped_legend():
    d = doc("comm_straggler.rank0.sqlite", "comm_straggler.rank1.sqlite")
    page = diagnosis_html(d)
    check_html(page)
    text = htmllib.unescape(page)
    for title in ("% of column", "step wall time", "idle time", "arrival skew"):      # y-axis titles
        assert f">{title}</text>" in text, title
    for title in ("time since the first step", "step number", "bubble duration", "collective (number"):
        assert title in text, title                                                     # x-axis titles
    assert re.search(r'class="ax" text-anchor="end">\d+(\.\d+)? (ms|us|s)</text>', page)   # y ticks in time
    assert re.search(r'class="ax" text-anchor="end">100%</text>', page)
    assert "<b>device work:</b>" in page and "<b>idle, by class:</b>" in page
    assert page.count('class="sep"') == 2           # two ranks: one divider in the timeline, one in the step chart
    assert ">rank 0</text>" in page and ">rank 1</text>" in page
    numbers = re.findall(r'class="ax sn"[^>]*>(\d+)</text>', page)      # step numbers on the timeline
    assert numbers and set(numbers) <= {str(s["step"]) for s in d["steps"]["per_step"]}


def test_caveats_shown_in_the_terminal_are_in_the_page():
    d = doc("low_coverage.sqlite")
    d["capture"]["warnings"].append({"code": "window_cut", "message": "trimmed <here>"})
    lines = caveat_lines(d)
    assert len(lines) >= 2
    text = " ".join(htmllib.unescape(re.sub(r"<[^>]+>", "", diagnosis_html(d))).split())
    for c in lines:
        assert " ".join(c.split()) in text, c


def test_a_host_step_before_the_device_window_is_drawn():
    d = doc("healthy.sqlite")
    dv = d["overview"]["devices"][0]
    span = dv["bin_ns"] * len(dv["kernel_ns"])
    first = min(d["steps"]["per_step"], key=lambda s: s["start_ns"])
    early = copy.deepcopy(first)
    early.update(step=-1, start_ns=dv["start_ns"] - span, wall_ns=span // 2)    # host-only, before any kernel
    d["steps"]["per_step"].insert(0, early)
    page = diagnosis_html(d)
    # the shaded span outside the device's window starts at the plot's left edge and covers half of it
    m = re.search(r'<rect x="0.00" y="0" width="([\d.]+)" height="\d+" fill="url\(#hatch0\)">', page)
    assert m and float(m.group(1)) == pytest.approx(PW / 2, rel=0.02)
    assert 'step -1: starts 0 ns' in page


def test_subtitle_says_the_format_once():
    d = doc("profiler_steps.json.gz")
    sub = re.search(r'<div class="note">(.*?)</div>', diagnosis_html(d), re.S).group(1)
    words = sub.split()
    assert all(a != b for a, b in zip(words, words[1:])), sub


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian package 'chromium')")
def test_the_timeline_zooms_in_the_browser(tmp_path):
    d = doc("healthy.sqlite")
    page = tmp_path / "r.html"
    page.write_text(diagnosis_html(d))
    whole, log = browse(page, tmp_path)
    assert not console_messages(log), log
    # opened zoomed through the address: the plot's viewBox narrows and the ticks are redrawn for it
    dom, log = browse(page, tmp_path, fragment="#tl0=0.25,0.5")
    assert not console_messages(log), log
    box = re.search(r'class="zp" x="0" y="\d+" width="\d+" height="\d+" viewBox="([\d.]+) 0 ([\d.]+) ', dom)
    assert box and float(box.group(1)) == pytest.approx(0.25 * PW, rel=1e-3)
    assert float(box.group(2)) == pytest.approx(0.25 * PW, rel=1e-3)
    ticks_whole = re.findall(r'<g class="xt"[^>]*>(.*?)</g>', whole)[0]
    ticks_zoomed = re.findall(r'<g class="xt"[^>]*>(.*?)</g>', dom)[0]
    assert ticks_whole != ticks_zoomed and ">0 ns<" in ticks_whole and ">0 ns<" not in ticks_zoomed
