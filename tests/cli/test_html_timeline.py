"""The HTML timeline of a multi-rank trace (issue 46): every (rank, device) a lane on ONE shared
clock — one origin (the earliest step or device activity over all ranks), one time axis, one
zoom control that moves every lane, one legend — so a rank that starts a step or a collective
later is visibly offset; compact lanes; still one offline file. Checked on the 2-rank sample, on
8 generated ranks (rank 5 the straggler) and, where Chromium is installed, in the browser."""
from __future__ import annotations

import copy
import html as htmllib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from formats import CHROMIUM, browse, check_html, console_messages

from sample_traces import generate as gen
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.cli.html import diagnosis_html
from srtscope.cli.html_charts import PW

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
LATE = 5                                   # the straggler of the 8 generated ranks
_LANE = re.compile(r'<svg class="zp lane" x="0" y="([\d.]+)" width="(\d+)" height="(\d+)" viewBox="([^"]+)" '
                   r'[^>]*data-name="([^"]*)" data-start="(-?\d+)" data-bin="(\d+)" data-keys="([^"]*)" '
                   r'data-v="([^"]*)">(.*?)</svg>', re.S)
_BAND = re.compile(r'<svg class="zp" x="0" y="([\d.]+)" width="\d+" height="\d+" viewBox="([^"]+)"[^>]*>(.*?)</svg>',
                   re.S)


@pytest.fixture(scope="module")
def two() -> dict:
    return diagnose(load_timeline([SAMPLES / "comm_straggler.rank0.sqlite",
                                   SAMPLES / "comm_straggler.rank1.sqlite"])).to_json()


@pytest.fixture(scope="module")
def eight(tmp_path_factory) -> dict:
    """Eight rank exports of one simulated job in lockstep; rank 5's forward is slower: it is last
    to every all-reduce, so the others wait in it while rank 5 still computes."""
    base = next(s for s in gen.SCENARIOS if s.name == "comm_straggler")
    fast = base.ranks[0]
    sc = replace(base, name="eight", ranks=tuple(replace(fast, kernel_us=90) if i == LATE else fast
                                                 for i in range(8)))
    files = gen.write(sc, tmp_path_factory.mktemp("eight"))
    return diagnose(load_timeline(files)).to_json()


def _timeline(page: str) -> str:
    """The timeline section of a report."""
    return page[page.index('<h2 id="timeline">'):page.index('<h2 id="device">')]


def _span(page: str) -> int:
    return int(re.search(r'<figure class="tl" id="tl0" data-span="(\d+)"', page).group(1))


def _origin(d: dict) -> int:
    """The shared clock's origin, from the JSON: the earliest step or device activity of any rank."""
    starts = [int(s["start_ns"]) for s in d["steps"]["per_step"]]
    starts += [int(dv["start_ns"]) for dv in d["overview"]["devices"]]
    starts += [int(t) for dv in d["overview"]["devices"] for t in dv["steps_ns"]]
    return min(starts)


def _step_x(band: str, rank: int, step: int) -> float:
    m = re.search(rf'<rect x="([\d.]+)" y="1" [^>]*><title>rank {rank} step {step}: ', band)
    assert m, (rank, step)
    return float(m.group(1))


def _first_x(lane_body: str, colour: str) -> float:
    """Where a lane's first column of ``colour`` starts, px on the shared axis."""
    m = re.search(rf'<path fill="{colour}" d="M([\d.]+) ', lane_body)
    assert m, colour
    return float(m.group(1))


@pytest.mark.parametrize("which, lanes", [("two", 2), ("eight", 8)])
def test_one_axis_one_zoom_one_legend_for_all_lanes(which, lanes, request):
    d = request.getfixturevalue(which)
    page = diagnosis_html(d)
    check_html(page)
    assert re.findall(r"<script[^>]*>", page) == ["<script>"]                       # one inline script
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)          # opens offline
    tl = _timeline(page)
    assert tl.count('<figure class="tl"') == 1                                      # one chart
    assert tl.count('<g class="xt"') == 1 and tl.count("time since the first step") == 1   # one time axis
    assert tl.count('class="zoom"') == 1 and tl.count('data-z="in"') == 1           # one zoom control
    assert tl.count('<div class="legend">') == 1 and tl.count("<b>device work:</b>") == 1   # one legend
    found = _LANE.findall(tl)
    assert [htmllib.unescape(f[4]) for f in found] == [f"rank {dv['rank']} · device {dv['device']}"
                                                       for dv in d["overview"]["devices"]]
    assert len(found) == lanes
    # every lane the same width over the same view: one x axis
    assert {(f[1], f[3].split()[0], f[3].split()[2]) for f in found} == {(str(PW), "0", str(PW))}
    # the axis starts at the shared origin: the first tick reads 0 at x 0
    assert re.search(r'<g class="xt"[^>]*><line x1="0.0" y1="0" x2="0.0"[^>]*/><line[^>]*/>'
                     r'<text x="0.0" [^>]*>0 ns</text>', tl)


def test_lanes_are_drawn_on_the_shared_origin(two):
    page = diagnosis_html(two)
    lo, span = _origin(two), _span(page)
    scale = PW / span
    lanes, bands = _LANE.findall(page), _BAND.findall(page)
    assert len(lanes) == len(bands) == 2
    for f, dv in zip(lanes, two["overview"]["devices"]):
        assert int(f[5]) == int(dv["start_ns"]) - lo                     # the lane's own start, on the shared clock
    # every step is at its absolute time: step 0 starts at the same instant on both ranks, so at one x
    per = {(s["rank"], s["step"]): int(s["start_ns"]) for s in two["steps"]["per_step"]}
    assert per[(0, 0)] == per[(1, 0)]
    assert _step_x(bands[0][2], 0, 0) == _step_x(bands[1][2], 1, 0) == pytest.approx((per[(0, 0)] - lo) * scale,
                                                                                       abs=0.01)
    for (rank, step), t in per.items():
        assert _step_x(bands[rank][2], rank, step) == pytest.approx((t - lo) * scale, abs=0.01)


def test_a_rank_that_starts_later_is_offset_by_its_lateness(two):
    late = copy.deepcopy(two)
    shift = 5_000_000                                                    # rank 1 all 5 ms later
    for s in late["steps"]["per_step"]:
        if s["rank"] == 1:
            s["start_ns"] += shift
    for dv in late["overview"]["devices"]:
        if dv["rank"] == 1:
            dv["start_ns"] += shift
            dv["steps_ns"] = [t + shift for t in dv["steps_ns"]]
    page = diagnosis_html(late)
    scale = PW / _span(page)
    lanes, bands = _LANE.findall(page), _BAND.findall(page)
    for step in (0, 7, 29):
        gap = _step_x(bands[1][2], 1, step) - _step_x(bands[0][2], 0, step)
        own = next(s["start_ns"] for s in two["steps"]["per_step"] if s["rank"] == 1 and s["step"] == step) - \
            next(s["start_ns"] for s in two["steps"]["per_step"] if s["rank"] == 0 and s["step"] == step)
        assert gap == pytest.approx((shift + own) * scale, abs=0.02)
    kernel = "#3b6fb6"
    dv0, dv1 = late["overview"]["devices"]
    assert _first_x(lanes[1][9], kernel) - _first_x(lanes[0][9], kernel) == pytest.approx(
        (dv1["start_ns"] - dv0["start_ns"]) * scale, abs=0.02)
    # rank 1's lane is shaded from the shared origin to its own first activity
    assert re.search(rf'<rect x="0.00" y="0" width="{(dv1["start_ns"] - _origin(late)) * scale:.2f}" '
                     rf'height="\d+" fill="url\(#hatch0\)">', lanes[1][9])


def test_the_straggler_reaches_each_collective_late_on_the_axis(eight):
    assert eight["comm"]["straggler_rank"] == LATE
    page = diagnosis_html(eight)
    scale = PW / _span(page)
    lanes = _LANE.findall(page)
    first = min(eight["comm"]["collectives"], key=lambda c: c["index"])
    assert first["straggler_rank"] == LATE
    comm = "#3a9d5d"                         # the ranks on time wait inside the all-reduce: comm columns
    x = [_first_x(f[9], comm) for f in lanes]
    col = max(int(f[6]) for f in lanes) * scale                      # one column, px
    for rank, xr in enumerate(x):
        if rank != LATE:
            assert xr == pytest.approx(x[0], abs=2 * col)
    assert x[LATE] - x[0] == pytest.approx(first["skew_ns"] * scale, abs=2 * col)
    assert x[LATE] - x[0] > 4 * col


def test_eight_lanes_stay_compact(eight):
    page = diagnosis_html(eight)
    svg_h = int(re.search(r'<figure class="tl"[^>]*>.*?<svg width="\d+" height="([\d.]+)"', page, re.S).group(1))
    assert svg_h < 700                       # was 8 charts of 194 px, each with its own zoom bar and legend
    assert len(page) < 450_000               # was 909 kB: one path per colour per lane, not one element per column
    assert len(_timeline(page)) < 300_000


def test_lane_figures_are_escaped_and_read_back(two):
    d = copy.deepcopy(two)
    for dv in d["overview"]["devices"]:
        dv["bubbles_ns"]['<img src=x onerror=alert(1)>"'] = dv["bubbles_ns"].pop("prep")
    page = diagnosis_html(d)
    assert "<img src=x" not in page
    lane = _LANE.findall(page)[0]
    keys = json.loads(htmllib.unescape(lane[7]))
    assert keys[-1] == '<img src=x onerror=alert(1)>"' and keys[:3] == ["kernels", "copies and memsets", "collectives"]
    dv = d["overview"]["devices"][0]
    bins = lane[8].split(" ")
    assert len(bins) == len(dv["kernel_ns"])
    order = ["kernel_ns", "memcpy_ns", "comm_ns"]
    for i in (0, 17, len(bins) - 1):                 # per bin: each part's ns in data-keys' order, empty for 0
        want = [dv[k][i] for k in order] + [dv["bubbles_ns"][c][i] for c in dv["bubbles_ns"]]
        got = (bins[i].split(",") + [""] * len(want))[:len(want)]
        assert [int(v) if v else 0 for v in got] == want


_HOOK = """<script>
(function(){var f=document.querySelector('figure.tl'),lanes=f.querySelectorAll('svg.lane');
function at(l,fx,fy){var r=l.getBoundingClientRect();return {clientX:r.left+fx*r.width,clientY:r.top+fy*r.height,
bubbles:true,cancelable:true};}
f.dispatchEvent(new WheelEvent('wheel',Object.assign(at(lanes[lanes.length-1],0.3,0.5),{deltaY:-100})));
f.dispatchEvent(new WheelEvent('wheel',Object.assign(at(lanes[0],0.3,0.5),{deltaY:-100})));
f.dispatchEvent(new MouseEvent('mousemove',at(lanes[3],0.31,0.5)));
var out=document.createElement('pre');out.id='hook';out.textContent=JSON.stringify({
boxes:[].map.call(f.querySelectorAll('svg.zp'),function(p){return p.getAttribute('viewBox');}),
tip:f.querySelector('div.tip').textContent,shown:!f.querySelector('div.tip').hidden,
cur:f.querySelector('line.cur').getAttribute('visibility')});document.body.appendChild(out);})();
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian package 'chromium')")
def test_zoom_moves_every_lane_together_in_the_browser(eight, tmp_path):
    page = diagnosis_html(eight)
    path = tmp_path / "r.html"
    path.write_text(page)
    # opened zoomed through the address: every lane's plots narrow to the same view
    dom, log = browse(path, tmp_path, fragment="#tl0=0.25,0.5")
    assert not console_messages(log), log
    boxes = re.findall(r'<svg class="zp[^"]*" x="0" y="[\d.]+" width="\d+" height="\d+" viewBox="([^"]+)"', dom)
    assert len(boxes) == 16                                          # 8 lanes: steps band and columns
    assert {tuple(round(float(v), 3) for v in b.split()[:3:2]) for b in boxes} == {(round(0.25 * PW, 3),
                                                                                   round(0.25 * PW, 3))}
    labels = re.findall(r'class="ax sn"[^>]*x="([-\d.]+)"[^>]*visibility="visible"', dom)
    assert labels and all(0 <= float(x) <= PW for x in labels)      # step numbers redrawn for the view
    # the wheel over the last lane, then over the first, then the pointer over lane 3 (a test hook in a
    # copy of the page: the page itself has one script)
    hooked = tmp_path / "hooked.html"
    hooked.write_text(page.replace("</body>", _HOOK))
    dom, log = browse(hooked, tmp_path)
    assert not console_messages(log), log
    got = json.loads(htmllib.unescape(re.search(r'<pre id="hook">(.*?)</pre>', dom, re.S).group(1)))
    views = {tuple(round(float(v), 6) for v in b.split()[:3:2]) for b in got["boxes"]}
    assert len(got["boxes"]) == 16 and len(views) == 1              # all lanes moved together
    (x0, w), = views
    assert w == pytest.approx(PW * 0.64, rel=1e-6) and x0 > 0        # zoomed twice by the wheel, about the pointer
    assert got["shown"] and got["cur"] == "visible"
    assert got["tip"].startswith("at ") and "rank 3 · device 3: " in got["tip"] and " us" in got["tip"]
