"""The HTML report's charts and their parts: inline SVG with axes, units, tick labels and grouped
legends, drawn from the JSON contract's aggregates (per-step parts, histogram bins, matched
collectives) — never one element per kernel, so a page's size does not grow with the trace.
The timeline, all ranks on one clock, is ``html_timeline``; its zoom script ``html_zoom``.
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


def y_axis(h: float, top: float, fmt: Any, title: str, y0: float = 0, ticks: int = 4) -> str:
    """A left axis from 0 (bottom) to ``top`` over ``h`` px, with grid lines and a title (if any)."""
    out = []
    for v in nice_ticks(0, top, ticks):
        y = y0 + h - h * v / top if top else y0 + h
        out.append(f'<line x1="{L - 4}" y1="{y:.1f}" x2="{L + PW}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{L - 6}" y="{y + 3:.1f}" class="ax" text-anchor="end">{_e(fmt(v))}</text>')
    if title:
        out.append(f'<text class="axt" transform="translate(11,{y0 + h / 2:.0f}) rotate(-90)" '
                   f'text-anchor="middle">{_e(title)}</text>')
    return "".join(out)


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
