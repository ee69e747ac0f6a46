"""The HTML report's charts: inline SVG with axes, units, tick labels and grouped legends, drawn from
the JSON contract's aggregates (``overview`` bins, per-step parts, histogram bins, matched
collectives) — never one element per kernel, so a page's size does not grow with the trace.

The timeline zooms: its plot is a nested ``<svg>`` whose ``viewBox`` the page's few lines of script
(``ZOOM_JS``) narrow; the tick labels and step numbers are redrawn in the outer, unscaled frame.
Without script the page shows the whole window, ticks and all. ``#tl0=0.2,0.4`` in the page's
address opens timeline 0 zoomed to that fraction of its span.
"""
from __future__ import annotations

import html
import math
from typing import Any

from srtscope.analyzers.model.units import fmt_ns, plural

# one colour per part; bubble classes share their names with the JSON's by_class keys
COLOURS = {"kernel_busy": "#3b6fb6", "memcpy_busy": "#e08a2c", "comm_busy": "#3a9d5d",
           "scheduler": "#b84fc4", "prep": "#d9b51c", "kernel": "#6fc3df", "sync": "#5261c9",
           "launch": "#d9473f", "unattributed": "#9e9e9e", "host": "#8b4a2b", "queued": "#8fd19e",
           "busy": "#3b6fb6", "comm": "#3a9d5d", "other": "#d6d6d6", "short_gaps": "#e6e6e6"}
LABELS = {"kernel_busy": "kernels", "memcpy_busy": "copies and memsets", "comm_busy": "collectives",
          "busy": "device busy", "comm": "exposed comm", "other": "other (gaps under the threshold, edges)",
          "short_gaps": "gaps under the threshold", "kernel": "kernel (host in model code)"}
DEVICE_KEYS = ("kernel_busy", "memcpy_busy", "comm_busy")
STEP_DEVICE_KEYS = ("busy", "comm")
CLASS_ORDER = ("scheduler", "prep", "kernel", "sync", "launch", "host", "queued", "unattributed")
W = 1100                  # chart width, px
L = 64                    # left margin (y axis), px
PW = W - L - 8            # plot width, px


def _e(x: Any) -> str:
    """Escaped text from a trace: never markup."""
    return html.escape(str(x), quote=True)


def legend(groups: list[tuple[str, list[str]]]) -> str:
    """Legend in named groups, e.g. ("device work", [...]), ("idle, by class", [...])."""
    out = []
    for name, keys in groups:
        if not keys:
            continue
        items = "".join(f'<span class="key"><i style="background:{COLOURS.get(k, "#999")}"></i>'
                        f'{_e(LABELS.get(k, k))}</span>' for k in keys)
        out.append(f'<span class="group">{f"<b>{_e(name)}:</b> " if name else ""}{items}</span>')
    return f'<div class="legend">{"".join(out)}</div>'


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 x 10^k steps), about ``n`` of them."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def y_axis(h: float, top: float, fmt: Any, title: str, y0: float = 0) -> str:
    """A left axis from 0 (bottom) to ``top`` over ``h`` px, with grid lines and a title."""
    out = []
    for v in nice_ticks(0, top, 4):
        y = y0 + h - h * v / top if top else y0 + h
        out.append(f'<line x1="{L - 4}" y1="{y:.1f}" x2="{L + PW}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{L - 6}" y="{y + 3:.1f}" class="ax" text-anchor="end">{_e(fmt(v))}</text>')
    out.append(f'<text class="axt" transform="translate(11,{y0 + h / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{_e(title)}</text>')
    return "".join(out)


def _pct(v: float) -> str:
    return f"{v:.0f}%"


def _span(dv: dict, per_step: list[dict]) -> tuple[int, int]:
    """The time range a device's timeline covers: its active window and its rank's steps."""
    n, bin_ns, start = len(dv.get("kernel_ns") or []), int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
    lo, hi = start, start + n * bin_ns
    mine = [s for s in per_step if s.get("rank") == dv.get("rank")]
    for s in mine:
        lo, hi = min(lo, int(s["start_ns"])), max(hi, int(s["start_ns"]) + int(s.get("wall_ns") or 0))
    for t in dv.get("steps_ns") or []:
        lo, hi = min(lo, int(t)), max(hi, int(t))
    return lo, max(hi, lo + 1)


def _stack(x: float, w: float, bottom: float, px_per_ns: float, parts: list[tuple[str, int]]) -> str:
    """One stacked column of ``parts`` (key, ns), bottom-up from ``bottom``, coloured by key."""
    y, rects = bottom, []
    for k, v in parts:
        if v <= 0:
            continue
        ph = v * px_per_ns
        y -= ph
        rects.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{ph:.2f}" '
                     f'fill="{COLOURS.get(k, "#999")}"/>')
    return "".join(rects)


def timeline_svg(d: dict[str, Any], dv: dict[str, Any], idx: int) -> str:
    """One device's timeline: per bin, device work then idle by class (then gaps under the
    threshold) as a stacked column, % of the bin on the y axis, time on the x axis; the rank's
    steps as numbered spans above; the span outside the device's active window shaded."""
    per_step = (d.get("steps") or {}).get("per_step") or []
    n, bin_ns, start = len(dv.get("kernel_ns") or []), int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
    lo, hi = _span(dv, per_step)
    scale = PW / (hi - lo)
    classes = [c for c in CLASS_ORDER if c in (dv.get("bubbles_ns") or {})] + \
              [c for c in (dv.get("bubbles_ns") or {}) if c not in CLASS_ORDER]
    band, h, top = 18, 120, 22
    cols, short_any = [], False
    for i in range(n):
        parts = [(k, int(dv[k.split("_")[0] + "_ns"][i])) for k in DEVICE_KEYS]
        parts += [(c, int(dv["bubbles_ns"][c][i])) for c in classes]
        used = sum(v for _, v in parts)
        if used < bin_ns:
            parts.append(("short_gaps", bin_ns - used))
            short_any = short_any or (bin_ns - used) * 100 > bin_ns
        total = max(bin_ns, used)       # NOTE: a copy beside a kernel overlaps: the column is scaled to fit
        x, w = (start + i * bin_ns - lo) * scale, max(bin_ns * scale, 0.3)
        tip = (f"{fmt_ns(start + i * bin_ns - lo)}–{fmt_ns(start + (i + 1) * bin_ns - lo)}: "
               + ", ".join(f"{LABELS.get(k, k)} {fmt_ns(v)}" for k, v in parts if v))
        cols.append(f'<g><title>{_e(tip)}</title>{_stack(x, w, float(h), h / total, parts)}</g>')
    outside = []
    if start > lo:
        outside.append((0.0, (start - lo) * scale))
    if start + n * bin_ns < hi:
        outside.append(((start + n * bin_ns - lo) * scale, PW))
    shade = "".join(f'<rect x="{a:.2f}" y="0" width="{b - a:.2f}" height="{h}" fill="url(#hatch{idx})">'
                    f'<title>outside the device\'s active window (host steps only)</title></rect>'
                    for a, b in outside)
    steps, labels = _step_spans(dv, per_step, lo, scale, band)
    ticks = _time_ticks(lo, hi, 0, PW, band + h)
    chart_h = top + band + h + 34
    zoom = ('<div class="zoom"><button data-z="in">zoom in</button><button data-z="out">zoom out</button>'
            '<button data-z="reset">reset</button> <span class="note">or scroll over the chart, '
            'drag to pan, double-click to reset</span></div>')
    return (f'<figure class="tl" id="tl{idx}" data-span="{hi - lo}" data-pw="{PW}">{zoom}'
            f'<svg width="{W}" height="{chart_h}" viewBox="0 0 {W} {chart_h}" role="img">'
            f'<defs><pattern id="hatch{idx}" width="6" height="6" patternUnits="userSpaceOnUse">'
            f'<rect width="6" height="6" fill="#fafafa"/><path d="M0,6 L6,0" stroke="#ccc"/></pattern></defs>'
            + y_axis(h, 100, _pct, "% of column", top + band) +
            f'<g transform="translate({L},{top})">'
            f'<svg class="zp" x="0" y="0" width="{PW}" height="{band}" viewBox="0 0 {PW} {band}" '
            f'preserveAspectRatio="none">{steps}</svg>'
            f'<svg class="zp" x="0" y="{band}" width="{PW}" height="{h}" viewBox="0 0 {PW} {h}" '
            f'preserveAspectRatio="none"><rect width="{PW}" height="{h}" fill="#f4f4f4"/>{shade}{"".join(cols)}</svg>'
            f'<g class="sl">{labels}</g><g class="xt">{ticks}</g></g>'
            f'<text x="{L}" y="12" class="axt">steps of rank {_e(dv.get("rank"))}</text>'
            f'<text x="{L + PW / 2:.0f}" y="{chart_h - 2}" class="axt" text-anchor="middle">time since '
            f'the first step or device activity of rank {_e(dv.get("rank"))} '
            f'(column width {fmt_ns(bin_ns)})</text></svg></figure>'
            + legend([("device work", [k for k in DEVICE_KEYS if any(dv.get(k.split("_")[0] + "_ns") or [])]),
                      ("idle, by class", classes),
                      ("", ["short_gaps"] if short_any else [])]))


def _step_spans(dv: dict, per_step: list[dict], lo: int, scale: float, band: int) -> tuple[str, str]:
    """(spans in the zoomed frame, step-number labels in the outer frame) for the rank's steps."""
    mine = [s for s in per_step if s.get("rank") == dv.get("rank")]
    spans = [(int(s["start_ns"]), int(s.get("wall_ns") or 0), s.get("step")) for s in mine]
    if not spans:                      # the per-step list was capped or absent: starts only
        spans = [(int(t), 0, None) for t in dv.get("steps_ns") or []]
    rects, labels, last_x = [], [], -1e9
    for j, (t, wall, num) in enumerate(spans):
        x, w = (t - lo) * scale, max(wall * scale, 0.6)
        fill = "#c9d3e0" if j % 2 else "#a9b7c9"
        tip = f"step {num}: starts {fmt_ns(t - lo)}, wall {fmt_ns(wall)}" if num is not None else \
              f"step start at {fmt_ns(t - lo)}"
        rects.append(f'<rect x="{x:.2f}" y="1" width="{w:.2f}" height="{band - 2}" fill="{fill}" '
                     f'stroke="#fff" vector-effect="non-scaling-stroke"><title>{_e(tip)}</title></rect>')
        if num is not None:
            cx = x + w / 2
            hidden = cx - last_x < 22
            if not hidden:
                last_x = cx
            vis = "hidden" if hidden else "visible"
            labels.append(f'<text class="ax sn" data-x="{cx:.2f}" x="{cx:.1f}" y="{band - 5}" '
                          f'text-anchor="middle" visibility="{vis}">{_e(num)}</text>')
    return "".join(rects), "".join(labels)


def _time_ticks(lo: int, hi: int, x0: float, x1: float, y: float) -> str:
    """Tick marks and labels for times ``lo..hi`` (shown relative to ``lo``) over x0..x1 px."""
    out = []
    for v in nice_ticks(0, hi - lo, 8):
        x = x0 + (x1 - x0) * v / (hi - lo)
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#555"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" class="ax" text-anchor="middle">{_e(fmt_ns(v))}</text>')
    return "".join(out)


def steps_svg(d: dict[str, Any]) -> str:
    """One column per step (grouped by rank, a divider between ranks): height = wall time, split
    into device work and idle by class; y axis in time, step numbers below."""
    per = (d.get("steps") or {}).get("per_step") or []
    rows = [(st, {k: int(v) for k, v in (st.get("parts_ns") or {}).items()}) for st in per]
    rows = [(st, p) for st, p in rows if sum(p.values())]
    if not rows:
        return '<p class="note">No steps.</p>'
    rows.sort(key=lambda r: (int(r[0].get("rank") or 0), int(r[0].get("step") or 0)))
    keys = [k for k in (*STEP_DEVICE_KEYS, *CLASS_ORDER, "other") if any(p.get(k) for _, p in rows)]
    top = max(sum(p.values()) for _, p in rows)
    ranks = sorted({int(st.get("rank") or 0) for st, _ in rows})
    gap = 14 if len(ranks) > 1 else 0
    h, y0 = 170, 18
    bw = min((PW - gap * (len(ranks) - 1)) / len(rows), 48)
    cols, xlabels, seps, x, prev = [], [], [], float(L), None
    every = max(1, math.ceil(24 / bw))
    for i, (st, p) in enumerate(rows):
        rank = int(st.get("rank") or 0)
        if prev is not None and rank != prev:
            seps.append(f'<line x1="{x + gap / 2 - 1:.1f}" y1="{y0 - 14}" x2="{x + gap / 2 - 1:.1f}" '
                        f'y2="{y0 + h + 16}" class="sep"/>')
            x += gap
        if rank != prev:
            cols.append(f'<text x="{x + 2:.1f}" y="{y0 - 4}" class="axt">rank {rank}</text>')
            first = i
        prev = rank
        total = sum(p.values())
        rects = _stack(x, max(bw * 0.85, 0.5), float(y0 + h), h / top, [(k, p.get(k, 0)) for k in keys])
        tip = (f"step {st.get('step')} (rank {rank}, {st.get('exec')}): wall {fmt_ns(total)}; "
               + ", ".join(f"{LABELS.get(k, k)} {fmt_ns(p.get(k, 0))}" for k in keys if p.get(k)))
        cols.append(f'<g><title>{_e(tip)}</title>{rects}</g>')
        if (i - first) % every == 0:
            xlabels.append(f'<text x="{x + bw * 0.42:.1f}" y="{y0 + h + 13}" class="ax" '
                           f'text-anchor="middle">{_e(st.get("step"))}</text>')
        x += bw
    total_h = y0 + h + 34
    capped = (d.get("steps") or {}).get("count", 0) > len(per)
    note = f" (the first {len(per)} of {d['steps']['count']} steps)" if capped else ""
    return (f'<svg width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" role="img">'
            + y_axis(h, top, fmt_ns, "step wall time", y0) + "".join(seps) + "".join(cols) + "".join(xlabels)
            + f'<text x="{L + PW / 2:.0f}" y="{total_h - 3}" class="axt" text-anchor="middle">step number'
            f'{_e(note)}</text></svg>'
            + legend([("device work", [k for k in keys if k in STEP_DEVICE_KEYS]),
                      ("idle, by class", [k for k in keys if k not in STEP_DEVICE_KEYS])]))


def histogram_svg(d: dict[str, Any]) -> str:
    """Bubble time per duration bin; the count above each bar."""
    bins = (d.get("bubbles") or {}).get("histogram") or []
    if not any(b.get("count") for b in bins):
        return '<p class="note">No bubbles.</p>'
    h, y0 = 130, 16
    bw = PW / len(bins)
    top = max(int(b.get("total_ns") or 0) for b in bins) or 1
    out = [y_axis(h, top, fmt_ns, "idle time", y0)]
    for i, b in enumerate(bins):
        tot, x = int(b.get("total_ns") or 0), L + i * bw
        bh = h * tot / top
        label = bin_label(int(b["lo_ns"]), None if b.get("hi_ns") is None else int(b["hi_ns"]))
        out.append(f'<g><title>{_e(label)}: {_e(plural(int(b.get("count") or 0), "bubble"))}, {fmt_ns(tot)}</title>'
                   f'<rect x="{x + 3:.1f}" y="{y0 + h - bh:.1f}" width="{bw - 6:.1f}" height="{bh:.1f}" '
                   f'fill="#9e9e9e"/>'
                   + (f'<text x="{x + bw / 2:.1f}" y="{y0 + h - bh - 3:.1f}" class="ax" text-anchor="middle">'
                      f'{_e(b.get("count"))}</text>' if b.get("count") else "")
                   + f'<text x="{x + bw / 2:.1f}" y="{y0 + h + 13}" class="ax" text-anchor="middle">'
                   f'{_e(label)}</text></g>')
    total_h = y0 + h + 32
    return (f'<svg width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" role="img">{"".join(out)}'
            f'<text x="{L + PW / 2:.0f}" y="{total_h - 3}" class="axt" text-anchor="middle">bubble duration '
            f'(the number above a bar: how many bubbles)</text></svg>')


def _short(ns: int) -> tuple[str, str]:
    """(number, unit) of a round duration: (10, us), (1, ms), (500, us)."""
    for unit, f in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= f:
            return f"{ns / f:g}", unit
    return f"{ns}", "ns"


def bin_label(lo: int, hi: int | None) -> str:
    """A histogram bin in few characters: ``< 10 us``, ``10–20 us``, ``500 us–1 ms``, ``≥ 50 ms``."""
    if hi is None:
        return "≥ " + " ".join(_short(lo))
    (a, ua), (b, ub) = _short(lo), _short(hi)
    if lo == 0:
        return f"< {b} {ub}"
    return f"{a}–{b} {ub}" if ua == ub else f"{a} {ua}–{b} {ub}"


def skew_svg(coll: list[dict[str, Any]]) -> str:
    """Arrival skew of the matched collectives, in the order they ran (collective number below)."""
    coll = sorted(coll, key=lambda x: int(x.get("index") or 0))
    h, y0 = 110, 10
    bw = min(PW / len(coll), 40)
    top = max(int(x.get("skew_ns") or 0) for x in coll) or 1
    out = [y_axis(h, top, fmt_ns, "arrival skew", y0)]
    every = max(1, math.ceil(28 / bw))
    for i, x in enumerate(coll):
        sk, px = int(x.get("skew_ns") or 0), L + i * bw
        out.append(f'<g><title>{_e(x.get("name"))} #{_e(x.get("index"))}: skew {fmt_ns(sk)}, last to arrive: '
                   f'rank {_e(x.get("straggler_rank"))}</title><rect x="{px + 1:.1f}" y="{y0 + h - h * sk / top:.1f}" '
                   f'width="{max(bw - 2, 0.5):.1f}" height="{h * sk / top:.1f}" fill="#3a9d5d"/></g>')
        if i % every == 0:
            out.append(f'<text x="{px + bw / 2:.1f}" y="{y0 + h + 13}" class="ax" text-anchor="middle">'
                       f'#{_e(x.get("index"))}</text>')
    total_h = y0 + h + 32
    return (f'<svg width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" role="img">{"".join(out)}'
            f'<text x="{L + PW / 2:.0f}" y="{total_h - 3}" class="axt" text-anchor="middle">collective '
            f'(number in the order they ran)</text></svg>')


#: zoom and pan for ``figure.tl``: narrows the plots' viewBox, redraws ticks and step numbers
ZOOM_JS = r"""
(function(){
function fmt(ns){var a=Math.abs(ns);if(a>=1e9)return (ns/1e9).toPrecision(3)+' s';
if(a>=1e6)return (ns/1e6).toPrecision(3)+' ms';if(a>=1e3)return (ns/1e3).toPrecision(3)+' us';
return Math.round(ns)+' ns';}
function ticks(lo,hi,n){var raw=(hi-lo)/n,mag=Math.pow(10,Math.floor(Math.log10(raw))),s=mag;
[1,2,5,10].some(function(m){s=m*mag;return s>=raw;});var out=[];
for(var v=Math.ceil(lo/s)*s;v<=hi+1e-9*s;v+=s)out.push(v);return out;}
document.querySelectorAll('figure.tl').forEach(function(f){
var pw=+f.dataset.pw,span=+f.dataset.span,v0=0,v1=pw,NS='http://www.w3.org/2000/svg';
var plots=f.querySelectorAll('svg.zp'),xt=f.querySelector('g.xt'),labels=f.querySelectorAll('text.sn');
var y=+xt.querySelector('line').getAttribute('y1');
function draw(){plots.forEach(function(p){p.setAttribute('viewBox',v0+' 0 '+(v1-v0)+' '+p.getAttribute('height'));});
var k=pw/(v1-v0),t0=v0/pw*span,t1=v1/pw*span;xt.textContent='';
ticks(t0,t1,8).forEach(function(t){var x=(t/span*pw-v0)*k;var l=document.createElementNS(NS,'line');
l.setAttribute('x1',x);l.setAttribute('x2',x);l.setAttribute('y1',y);l.setAttribute('y2',y+4);
l.setAttribute('stroke','#555');var s=document.createElementNS(NS,'text');s.setAttribute('x',x);
s.setAttribute('y',y+15);s.setAttribute('class','ax');s.setAttribute('text-anchor','middle');
s.textContent=fmt(t);xt.appendChild(l);xt.appendChild(s);});
var last=-1e9;labels.forEach(function(s){var x=(+s.dataset.x-v0)*k;s.setAttribute('x',x);
var show=x>=0&&x<=pw&&x-last>=22;if(show)last=x;s.setAttribute('visibility',show?'visible':'hidden');});}
function zoom(c,fx){var w=(v1-v0)*fx;w=Math.max(Math.min(w,pw),pw/1e7);var a=c-(c-v0)*w/(v1-v0);
v0=Math.max(0,Math.min(a,pw-w));v1=v0+w;draw();}
function at(e){var r=plots[1].getBoundingClientRect();return v0+(e.clientX-r.left)/r.width*(v1-v0);}
f.addEventListener('wheel',function(e){e.preventDefault();zoom(at(e),e.deltaY<0?0.8:1.25);},{passive:false});
var drag=null;f.addEventListener('mousedown',function(e){drag=[e.clientX,v0,v1];});
window.addEventListener('mouseup',function(){drag=null;});
f.addEventListener('mousemove',function(e){if(!drag)return;var r=plots[1].getBoundingClientRect();
var d=(e.clientX-drag[0])/r.width*(drag[2]-drag[1]);var w=drag[2]-drag[1];
v0=Math.max(0,Math.min(drag[1]-d,pw-w));v1=v0+w;draw();});
f.addEventListener('dblclick',function(){v0=0;v1=pw;draw();});
var m=location.hash.match(new RegExp('[#&]'+f.id+'=([0-9.]+),([0-9.]+)'));
if(m){v0=Math.max(0,+m[1]*pw);v1=Math.min(pw,Math.max(+m[2]*pw,v0+pw/1e7));draw();}
f.querySelectorAll('button').forEach(function(b){b.addEventListener('click',function(){
var z=b.dataset.z;if(z==='reset'){v0=0;v1=pw;draw();}else zoom((v0+v1)/2,z==='in'?0.5:2);});});
});})();
"""
