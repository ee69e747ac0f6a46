"""The HTML report's timeline: every (rank, device) of the trace as a lane on ONE shared clock.

One figure holds all the lanes, stacked: per lane its rank's steps as numbered spans (a thin band)
and, per ``overview`` bin, the device's work then its idle time by class as a stacked column (% of
the bin). Every lane is drawn against the same origin — the earliest step or device activity over
all ranks — and the same ns-to-px scale, so a rank that starts a step or a collective later is
visibly offset to the right. One time axis (at the bottom, with grid lines through every lane), one
zoom/pan control that moves all lanes together (``html_zoom.ZOOM_JS``), one legend.

The columns of a lane are one ``<path>`` per colour (runs of equal columns merged), not one element
per column; their figures are in the lane's ``data-v`` and shown by the script on hover, with a
line through all lanes at the pointer's time. Without script the page shows the whole window.
``#tl0=0.2,0.4`` in the page's address opens the timeline zoomed to that fraction of its span.
"""
from __future__ import annotations

import json
from typing import Any

from srtscope.analyzers.model.units import fmt_ns
from srtscope.cli import escape
from srtscope.cli.html_charts import CLASS_ORDER, COLOURS, DEVICE_KEYS, LABELS, PW, L, W, legend, nice_ticks, y_axis

TOP = 16         # px above the first lane
GAP = 10         # px between lanes (a dashed line in it where the rank changes)
AXIS = 34        # px below the last lane: ticks, their labels, the axis title


def _e(x: Any) -> str:
    """Escaped text from a trace: never markup (``cli.escape.html``)."""
    return escape.html(x)


def dims(lanes: int) -> tuple[int, int]:
    """(step band, column plot) heights in px of each lane: one lane as tall as ever, more compact."""
    if lanes <= 1:
        return 18, 120
    return 16, max(36, min(80, 320 // lanes))


def span(d: dict[str, Any]) -> tuple[int, int]:
    """The shared clock's range: from the earliest step or device activity over all ranks to the last."""
    per_step = (d.get("steps") or {}).get("per_step") or []
    los, his = [], []
    for dv in (d.get("overview") or {}).get("devices") or []:
        lo, hi = _lane_span(dv, per_step)
        los.append(lo)
        his.append(hi)
    if not los:
        return 0, 1
    return min(los), max(max(his), min(los) + 1)


def _lane_span(dv: dict, per_step: list[dict]) -> tuple[int, int]:
    """The time range a lane covers: its device's active window and its rank's steps."""
    n, bin_ns, start = len(dv.get("kernel_ns") or []), int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
    lo, hi = start, start + n * bin_ns
    for s in per_step:
        if s.get("rank") == dv.get("rank"):
            lo, hi = min(lo, int(s["start_ns"])), max(hi, int(s["start_ns"]) + int(s.get("wall_ns") or 0))
    for t in dv.get("steps_ns") or []:
        lo, hi = min(lo, int(t)), max(hi, int(t))
    return lo, hi


def _classes(dv: dict) -> list[str]:
    bub = dv.get("bubbles_ns") or {}
    return [c for c in CLASS_ORDER if c in bub] + [c for c in bub if c not in CLASS_ORDER]


def _columns(dv: dict, lo: int, scale: float, h: int) -> tuple[str, str, bool]:
    """(one path per colour, the bins' figures for the script, whether gaps under the threshold
    show): per bin, device work then idle by class then the rest, stacked bottom-up, % of the bin."""
    n, bin_ns, start = len(dv.get("kernel_ns") or []), int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
    classes = _classes(dv)
    keys = [*DEVICE_KEYS, *classes, "short_gaps"]
    runs: dict[str, list[list[float]]] = {k: [] for k in keys}       # per key: [x0, x1, y, height]
    figures, short_any = [], False
    for i in range(n):
        vals = [int(dv[k.split("_")[0] + "_ns"][i]) for k in DEVICE_KEYS]
        vals += [int(dv["bubbles_ns"][c][i]) for c in classes]
        used = sum(vals)
        rest = max(bin_ns - used, 0)
        short_any = short_any or rest * 100 > bin_ns
        total = max(bin_ns, used)       # NOTE: a copy beside a kernel overlaps: the column is scaled to fit
        x, w = (start + i * bin_ns - lo) * scale, max(bin_ns * scale, 0.3)
        cum, bottom = 0, float(h)
        for k, v in zip(keys, [*vals, rest]):
            cum += max(v, 0)
            y = round(h - cum * h / total, 1)            # from the running sum: no rounding drift
            ph, bottom = round(bottom - y, 1), y
            if ph <= 0:
                continue
            run = runs[k]
            if run and abs(run[-1][1] - x) < 0.011 and run[-1][2] == y and run[-1][3] == ph:
                run[-1][1] = x + w                                      # the same as the column before
            else:
                run.append([x, x + w, y, ph])
        figures.append(",".join("" if v <= 0 else str(v) for v in vals).rstrip(","))
    paths = "".join(f'<path fill="{COLOURS.get(k, "#999")}" d="'
                    + "".join(f"M{a:.2f} {y:g}h{b - a:.2f}v{ph:g}h{a - b:.2f}z" for a, b, y, ph in run) + '"/>'
                    for k, run in runs.items() if run)
    return paths, " ".join(figures), short_any


def _step_spans(dv: dict, per_step: list[dict], lo: int, scale: float, band: int,
                y0: float) -> tuple[str, str]:
    """(spans in the zoomed frame, step-number labels in the plot frame, the lane's band at ``y0``)
    for the lane's rank's steps; where the per-step list was capped (or is absent), the device's
    step starts after it as one path of marks, at least a pixel apart (a long capture has tens of
    thousands)."""
    mine = [s for s in per_step if s.get("rank") == dv.get("rank")]
    rects, labels, last_x = [], [], -1e9
    for j, s in enumerate(mine):
        t, wall, num = int(s["start_ns"]), int(s.get("wall_ns") or 0), s.get("step")
        x, w = (t - lo) * scale, max(wall * scale, 0.6)
        tip = f"rank {dv.get('rank')} step {num}: starts {fmt_ns(t - lo)}, wall {fmt_ns(wall)}"
        rects.append(f'<rect x="{x:.2f}" y="1" width="{w:.2f}" height="{band - 2}" '
                     f'fill="{"#c9d3e0" if j % 2 else "#a9b7c9"}" stroke="#fff" vector-effect="non-scaling-stroke">'
                     f'<title>{_e(tip)}</title></rect>')
        cx = x + w / 2
        hidden = cx - last_x < 22
        if not hidden:
            last_x = cx
        labels.append(f'<text class="ax sn" data-x="{cx:.2f}" x="{cx:.1f}" y="{y0 + band - 3:g}" '
                      f'text-anchor="middle" visibility="{"hidden" if hidden else "visible"}">{_e(num)}</text>')
    after = max((int(s["start_ns"]) for s in mine), default=None)
    marks, last_x = [], -1e9
    for t in dv.get("steps_ns") or []:
        x = (int(t) - lo) * scale
        if (after is None or int(t) > after) and x - last_x >= 1:
            marks.append(f"M{x:.2f} 1v{band - 2}")
            last_x = x
    if marks:
        tip = (f"rank {dv.get('rank')}: step starts" + (" after the steps listed one by one" if mine else ""))
        rects.append(f'<path d="{"".join(marks)}" stroke="#6a7b93" stroke-width="1.5" '
                     f'vector-effect="non-scaling-stroke"><title>{_e(tip)}</title></path>')
    return "".join(rects), "".join(labels)


def _time_ticks(lo: int, hi: int, y0: float, y: float) -> str:
    """Grid lines through every lane (from ``y0``), tick marks and labels at ``y`` for times
    ``lo..hi`` (shown relative to ``lo``) over the plot's width."""
    out = []
    for v in nice_ticks(0, hi - lo, 8):
        x = PW * v / (hi - lo)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y}" class="vg"/>'
                   f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#555"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" class="ax" text-anchor="middle">{_e(fmt_ns(v))}</text>')
    return "".join(out)


def _lane_name(dv: dict, several: bool) -> str:
    """The lane's name in the left margin: its rank, and its device where a rank has several."""
    return f"r{dv.get('rank')} · d{dv.get('device')}" if several else f"rank {dv.get('rank')}"


def _lane(d: dict, dv: dict, y0: float, lo: int, hi: int, band: int, h: int, several: bool) -> tuple[str, str, bool]:
    """(the lane's drawing in the plot frame, its axis and name in the outer frame, short gaps shown)."""
    per_step = (d.get("steps") or {}).get("per_step") or []
    n, bin_ns, start = len(dv.get("kernel_ns") or []), int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
    scale = PW / (hi - lo)
    paths, figures, short_any = _columns(dv, lo, scale, h)
    outside = []
    if start > lo:
        outside.append((0.0, (start - lo) * scale))
    if start + n * bin_ns < hi:
        outside.append(((start + n * bin_ns - lo) * scale, float(PW)))
    shade = "".join(f'<rect x="{a:.2f}" y="0" width="{b - a:.2f}" height="{h}" fill="url(#hatch0)">'
                    f'<title>outside the device\'s active window</title></rect>' for a, b in outside if b > a)
    steps, labels = _step_spans(dv, per_step, lo, scale, band, y0)
    name, full = _lane_name(dv, several), f"rank {dv.get('rank')} · device {dv.get('device')}"
    keys = [LABELS.get(k, k) for k in (*DEVICE_KEYS, *_classes(dv))]
    plot = (f'<svg class="zp" x="0" y="{y0:g}" width="{PW}" height="{band}" viewBox="0 0 {PW} {band}" '
            f'preserveAspectRatio="none">{steps}</svg>'
            f'<svg class="zp lane" x="0" y="{y0 + band:g}" width="{PW}" height="{h}" viewBox="0 0 {PW} {h}" '
            f'preserveAspectRatio="none" data-name="{_e(full)}" data-start="{start - lo}" '
            f'data-bin="{bin_ns}" data-keys="{_e(json.dumps(keys))}" data-v="{figures}">'
            f'<rect width="{PW}" height="{h}" fill="#f4f4f4"/>{shade}{paths}</svg>'
            f'<g class="sl">{labels}</g>')
    title = (f"{full}: {fmt_ns(n * bin_ns)} active from "
             f"{fmt_ns(start - lo)} on the shared clock (one column: {fmt_ns(bin_ns)})")
    outer = (y_axis(h, 100, lambda v: f"{v:.0f}%", "", TOP + y0 + band, ticks=2)
             + f'<text x="4" y="{TOP + y0 + 10:g}" class="axt lname">{_e(name)}'
             f'<title>{_e(title)}</title></text>')
    return plot, outer, short_any


def _heading(devices: list[dict], lo: int, hi: int) -> str:
    """What the lanes are: one device and its active time, or how many on one clock and how far
    apart their first device activity is."""
    if len(devices) == 1:
        dv = devices[0]
        active = len(dv.get("kernel_ns") or []) * int(dv.get("bin_ns") or 1)
        return f'<h3>rank {_e(dv.get("rank"))} · device {_e(dv.get("device"))} — {fmt_ns(active)} active</h3>'
    first = min(devices, key=lambda dv: int(dv.get("start_ns") or 0))
    last = max(devices, key=lambda dv: int(dv.get("start_ns") or 0))
    ranks = len({dv.get("rank") for dv in devices})
    return (f'<h3>{ranks} ranks, {len(devices)} devices on one clock — {fmt_ns(hi - lo)} from the first to the '
            f'last activity; the last device to start (rank {_e(last.get("rank"))}) starts '
            f'{fmt_ns(int(last.get("start_ns") or 0) - int(first.get("start_ns") or 0))} after the first '
            f'(rank {_e(first.get("rank"))})</h3>')


def timeline_html(d: dict[str, Any]) -> str:
    """The timeline figure: all (rank, device) lanes on one clock, one axis, one zoom, one legend."""
    devices = list((d.get("overview") or {}).get("devices") or [])
    if not devices:
        return '<p class="note">No device activity.</p>'
    lo, hi = span(d)
    band, h = dims(len(devices))
    ranks = {dv.get("rank") for dv in devices}
    several = len(ranks) < len(devices)              # a rank with more than one device: name the device
    plots, outers, short_any, y, prev = [], [], False, 0.0, None
    for dv in devices:
        if prev is not None:
            if dv.get("rank") != prev:
                outers.append(f'<line x1="8" y1="{TOP + y + GAP / 2:g}" x2="{W}" y2="{TOP + y + GAP / 2:g}" '
                              f'class="sep"/>')
            y += GAP
        plot, outer, short = _lane(d, dv, y, lo, hi, band, h, several)
        plots.append(plot)
        outers.append(outer)
        short_any = short_any or short
        prev = dv.get("rank")
        y += band + h
    chart_h = TOP + y + AXIS
    bins = sorted({int(dv.get("bin_ns") or 1) for dv in devices})
    col = fmt_ns(bins[0]) if fmt_ns(bins[0]) == fmt_ns(bins[-1]) else f"{fmt_ns(bins[0])} to {fmt_ns(bins[-1])}"
    who = f"rank {devices[0].get('rank')}" if len(ranks) == 1 else f"any of the {len(ranks)} ranks"
    zoom = ('<div class="zoom"><button data-z="in">zoom in</button><button data-z="out">zoom out</button>'
            '<button data-z="reset">reset</button> <span class="note">or scroll over the chart, '
            'drag to pan, double-click to reset'
            + (' — all lanes move together' if len(devices) > 1 else '') + '</span></div>')
    keys = [k for k in DEVICE_KEYS if any(any(dv.get(k.split("_")[0] + "_ns") or []) for dv in devices)]
    classes = list(dict.fromkeys(c for dv in devices for c in _classes(dv)))
    return (_heading(devices, lo, hi) + f'<figure class="tl" id="tl0" data-span="{hi - lo}" data-pw="{PW}">{zoom}'
            f'<div class="tip" hidden></div>'
            f'<svg width="{W}" height="{chart_h:g}" viewBox="0 0 {W} {chart_h:g}" role="img">'
            f'<defs><pattern id="hatch0" width="6" height="6" patternUnits="userSpaceOnUse">'
            f'<rect width="6" height="6" fill="#fafafa"/><path d="M0,6 L6,0" stroke="#ccc"/></pattern></defs>'
            + "".join(outers)
            + (f'<text class="axt" transform="translate(11,{TOP + band + h / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">% of column</text>' if len(devices) == 1 else
               f'<text x="4" y="{TOP - 4}" class="ax">% of column</text>')
            + f'<g transform="translate({L},{TOP})">{"".join(plots)}'
            f'<g class="xt" data-y0="0" data-y="{y:g}">{_time_ticks(lo, hi, 0, y)}</g>'
            f'<line class="cur" x1="0" y1="0" x2="0" y2="{y:g}" visibility="hidden"/></g>'
            f'<text x="{L + PW / 2:.0f}" y="{chart_h - 2:g}" class="axt" text-anchor="middle">time since '
            f'the first step or device activity of {_e(who)} (one column: {col})</text></svg></figure>'
            + legend([("device work", keys), ("idle, by class", classes),
                      ("", ["short_gaps"] if short_any else [])])
            + '<p class="note">Each lane: one device, its rank\'s steps in the band above it; each column: what '
              'the device did in that slice of time — its work, then the idle time by what the host was doing. '
              + ('All lanes share one clock: a rank that starts later sits further right. ' if len(devices) > 1
                 else '')
            + 'Hover a column or a step for its figures.</p>')
