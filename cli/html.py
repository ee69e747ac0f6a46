"""HTML report of a diagnosis: one self-contained file (inline CSS and SVG, no script, no network),
drawn from the JSON contract only, so it can never disagree with ``--json``.

Every plot is built from aggregates (``overview`` bins, per-step parts, histogram bins, matched
collectives), never one element per kernel: the file stays small whatever the trace's size.
"""
from __future__ import annotations

import html
from typing import Any

from srtscope.analyzers.units import fmt_ns

# one colour per part; bubble classes share their names with the JSON's by_class keys
COLOURS = {"kernel_busy": "#3b6fb6", "memcpy_busy": "#e08a2c", "comm_busy": "#3a9d5d",
           "scheduler": "#b84fc4", "prep": "#d9b51c", "kernel": "#6fc3df", "sync": "#5261c9",
           "launch": "#d9473f", "unattributed": "#9e9e9e", "host": "#8b4a2b", "queued": "#8fd19e",
           "busy": "#3b6fb6", "comm": "#3a9d5d", "other": "#d6d6d6"}
LABELS = {"kernel_busy": "kernels", "memcpy_busy": "copies", "comm_busy": "collectives", "busy": "device busy",
          "comm": "exposed comm", "other": "other (short gaps, edges)"}
PANEL_BINS = 200          # bins per timeline panel: a panel is one readable row
W = 1100                  # plot width, px


def _e(x: Any) -> str:
    """Escaped text from a trace: never markup."""
    return html.escape(str(x), quote=True)


def _legend(keys: list[str]) -> str:
    items = "".join(f'<span class="key"><i style="background:{COLOURS.get(k, "#999")}"></i>'
                    f'{_e(LABELS.get(k, k))}</span>' for k in keys)
    return f'<div class="legend">{items}</div>'


def _bar_stack(x: float, w: float, h: float, parts: list[tuple[str, int]], total: float, title: str) -> str:
    """One stacked column, bottom-up, heights in proportion to ``total``."""
    out, y = [], h
    for key, v in parts:
        if v <= 0 or total <= 0:
            continue
        ph = h * v / total
        y -= ph
        out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(w, 0.5):.2f}" height="{ph:.2f}" '
                   f'fill="{COLOURS.get(key, "#999")}"/>')
    return f'<g><title>{_e(title)}</title>{"".join(out)}</g>' if out else ""


def timeline_svgs(d: dict[str, Any]) -> str:
    """Per device, the active window in panels of ``PANEL_BINS`` bins: busy by part, then bubbles
    by class; step starts as ticks."""
    ov = d.get("overview") or {}
    out = []
    for dv in ov.get("devices") or []:
        n = len(dv.get("kernel_ns") or [])
        bin_ns, start = int(dv.get("bin_ns") or 1), int(dv.get("start_ns") or 0)
        classes = [c for c in (dv.get("bubbles_ns") or {})]
        out.append(f'<h3>rank {_e(dv.get("rank"))} · device {_e(dv.get("device"))} — '
                   f'{fmt_ns(n * bin_ns)} active, {fmt_ns(bin_ns)} per column</h3>')
        for p0 in range(0, n, PANEL_BINS):
            p1 = min(p0 + PANEL_BINS, n)
            bw, h = W / PANEL_BINS, 90
            cols = []
            for i in range(p0, p1):
                parts = [("kernel_busy", dv["kernel_ns"][i]), ("memcpy_busy", dv["memcpy_ns"][i]),
                         ("comm_busy", dv["comm_ns"][i])]
                parts += [(c, dv["bubbles_ns"][c][i]) for c in classes]
                t0 = (i * bin_ns) / 1e6
                tip = f"{t0:.3f} ms: " + ", ".join(f"{LABELS.get(k, k)} {fmt_ns(v)}" for k, v in parts if v)
                # NOTE: parts overlap (a copy beside a kernel): the column is scaled to fit, not clipped
                cols.append(_bar_stack((i - p0) * bw, bw, h, parts, max(bin_ns, sum(v for _, v in parts)), tip))
            # one tick per column holding step starts (a long trace has tens of thousands of steps)
            starts: dict[int, int] = {}
            for t in dv.get("steps_ns") or []:
                col = int((t - start) // bin_ns)
                if p0 <= col < p1:
                    starts[col] = starts.get(col, 0) + 1
            ticks = "".join(f'<g><title>{n} step start{"s" if n > 1 else ""}</title>'
                            f'<line x1="{(c - p0 + 0.5) * bw:.1f}" y1="0" x2="{(c - p0 + 0.5) * bw:.1f}" y2="6" '
                            f'stroke="#222"/></g>' for c, n in sorted(starts.items()))
            axis = (f'<text x="0" y="{h + 14}" class="ax">{fmt_ns(p0 * bin_ns)}</text>'
                    f'<text x="{W}" y="{h + 14}" class="ax" text-anchor="end">{fmt_ns(p1 * bin_ns)}</text>')
            out.append(f'<svg width="{W}" height="{h + 18}" viewBox="0 0 {W} {h + 18}" role="img">'
                       f'<rect width="{W}" height="{h}" fill="#f4f4f4"/>{"".join(cols)}{ticks}{axis}</svg>')
        out.append(_legend(["kernel_busy", "memcpy_busy", "comm_busy", *classes]) +
                   '<p class="note">Ticks on top: step starts. Hover a column for its figures.</p>')
    return "".join(out) or '<p class="note">No device activity.</p>'


def budget_svg(d: dict[str, Any]) -> str:
    per = (d.get("steps") or {}).get("per_step") or []
    rows = [(st, {k: int(v) for k, v in (st.get("parts_ns") or {}).items()}) for st in per]
    rows = [(st, p) for st, p in rows if sum(p.values())]
    if not rows:
        return '<p class="note">No steps.</p>'
    keys = [k for k in ("busy", "comm", "scheduler", "prep", "kernel", "sync", "launch", "host", "queued",
                        "unattributed", "other") if any(p.get(k) for _, p in rows)]
    top = max(sum(p.values()) for _, p in rows)
    h, bw = 160, W / len(rows)
    cols = []
    for i, (st, p) in enumerate(rows):
        parts = [(k, p.get(k, 0)) for k in keys]
        tip = f"step {st.get('step')} (rank {st.get('rank')}, {st.get('exec')}): " + \
              ", ".join(f"{LABELS.get(k, k)} {fmt_ns(v)}" for k, v in parts if v)
        col_h = h * sum(p.values()) / top
        cols.append(f'<g transform="translate(0,{h - col_h:.2f})">'
                    f'{_bar_stack(i * bw, bw * 0.9, col_h, parts, sum(p.values()), tip)}</g>')
    note = f' (first {len(per)} steps)' if (d.get("steps") or {}).get("count", 0) > len(per) else ""
    return (f'<svg width="{W}" height="{h + 4}" viewBox="0 0 {W} {h + 4}" role="img">{"".join(cols)}</svg>'
            + _legend(keys) + f'<p class="note">One column per step{_e(note)}, height = wall time '
            f'(tallest {fmt_ns(top)}).</p>')


def histogram_svg(d: dict[str, Any]) -> str:
    bins = (d.get("bubbles") or {}).get("histogram") or []
    if not any(b.get("count") for b in bins):
        return '<p class="note">No bubbles.</p>'
    h, bw = 120, W / len(bins)
    top = max(int(b.get("total_ns") or 0) for b in bins) or 1
    out = []
    for i, b in enumerate(bins):
        tot = int(b.get("total_ns") or 0)
        bh = h * tot / top
        hi = "∞" if b.get("hi_ns") is None else fmt_ns(b["hi_ns"])
        label = f"{fmt_ns(b['lo_ns'])}–{hi}"
        out.append(f'<g><title>{_e(label)}: {b.get("count")} bubbles, {fmt_ns(tot)}</title>'
                   f'<rect x="{i * bw + 2:.1f}" y="{h - bh:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" '
                   f'fill="#9e9e9e"/><text x="{i * bw + bw / 2:.1f}" y="{h + 14}" class="ax" '
                   f'text-anchor="middle">{_e(label)}</text></g>')
    return (f'<svg width="{W}" height="{h + 20}" viewBox="0 0 {W} {h + 20}" role="img">{"".join(out)}</svg>'
            '<p class="note">Bubble time per duration bin (hover for counts).</p>')


def comm_section(d: dict[str, Any]) -> str:
    c = d.get("comm") or {}
    if not c.get("total_ns"):
        return '<p class="note">No collectives.</p>'
    rows = [("collective time", fmt_ns(c.get("total_ns"))), ("exposed", fmt_ns(c.get("exposed_ns")))]
    if c.get("skew_ns") is None:
        rows.append(("arrival skew, straggler", "unknown: the trace holds only some ranks"))
    else:
        rows += [("arrival skew (sum)", fmt_ns(c.get("skew_ns"))),
                 ("straggler rank", "none" if c.get("straggler_rank") is None else str(c["straggler_rank"]))]
    out = _table(["figure", "value"], rows)
    coll = c.get("collectives") or []
    if coll:
        top = max(int(x.get("skew_ns") or 0) for x in coll) or 1
        h, bw = 100, W / len(coll)
        bars = "".join(f'<g><title>{_e(x.get("name"))} #{_e(x.get("index"))}: skew {fmt_ns(x.get("skew_ns"))}, '
                       f'last rank {_e(x.get("straggler_rank"))}</title><rect x="{i * bw + 1:.1f}" '
                       f'y="{h - h * int(x.get("skew_ns") or 0) / top:.1f}" width="{max(bw - 2, 0.5):.1f}" '
                       f'height="{h * int(x.get("skew_ns") or 0) / top:.1f}" fill="#3a9d5d"/></g>'
                       for i, x in enumerate(coll))
        ranks: dict[str, int] = {}
        for x in coll:
            if x.get("straggler_rank") is not None:
                ranks[str(x["straggler_rank"])] = ranks.get(str(x["straggler_rank"]), 0) + 1
        out += (f'<svg width="{W}" height="{h + 2}" viewBox="0 0 {W} {h + 2}" role="img">{bars}</svg>'
                f'<p class="note">Arrival skew of the {len(coll)} most skewed collectives. Last to arrive: '
                + (", ".join(f"rank {_e(r)} in {n}" for r, n in sorted(ranks.items())) or "no single rank")
                + '.</p>')
    return out


def _table(head: list[str], rows: list[tuple]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def diagnosis_html(d: dict[str, Any], title: str = "srtscope diagnosis") -> str:
    v, b, cap = d.get("verdict") or {}, d.get("bubbles") or {}, d.get("capture") or {}
    bott = str(v.get("bottleneck", "?"))
    total = int(b.get("total_ns") or 0)
    ev = "".join(f"<li>{_e(x.get('text') if isinstance(x, dict) else x)}</li>" for x in v.get("evidence") or [])
    adv = "".join(f"<li><b>{_e(a.get('cause'))}</b>: {_e(a.get('text'))}</li>" for a in v.get("advice") or [])
    warns = "".join(f"<li><b>{_e(w.get('code'))}</b>: {_e(w.get('message'))}</li>" for w in cap.get("warnings") or [])
    dv = d.get("device") or {}
    busy = int(dv.get("busy_ns") or 0)
    drows = [("kernels", fmt_ns(dv.get("kernel_ns")), _pct(dv.get("kernel_ns"), busy), "", "")]
    if dv.get("comm_ns"):
        drows.append(("collectives", fmt_ns(dv["comm_ns"]), _pct(dv["comm_ns"], busy), "", ""))
    for k, cp in (dv.get("memcpy") or {}).items():
        drows.append((f"memcpy {k}", fmt_ns(cp.get("ns")), _pct(cp.get("ns"), busy),
                      "?" if int(cp.get("bytes", -1)) < 0 else f"{int(cp['bytes']) / 1e6:.1f} MB",
                      f"{cp['gbps']:.1f}" if cp.get("gbps") else ""))
    if dv.get("memset_ns"):
        drows.append(("memset", fmt_ns(dv["memset_ns"]), _pct(dv["memset_ns"], busy), "", ""))
    crows = [(c, fmt_ns(ns), _pct(ns, total)) for c, ns in sorted((b.get("by_class") or {}).items(),
                                                                  key=lambda kv: -int(kv[1])) if int(ns)]
    krows = [(c, fmt_ns(ns), _pct(ns, total)) for c, ns in sorted((b.get("by_cause") or {}).items(),
                                                                  key=lambda kv: -int(kv[1])) if int(ns)]
    kern = [(k.get("name"), k.get("count"), fmt_ns(k.get("total_ns")), f"{100 * float(k.get('share') or 0):.1f}%")
            for k in d.get("top_kernels") or []]
    s = d.get("steps") or {}
    per_rank = s.get("per_rank") or {}
    steps_line = (f"{max(per_rank.values()) if per_rank else s.get('count', 0)} steps per rank over "
                  f"{max(len(per_rank), 1)} rank(s), from {s.get('source', '?')}: {s.get('graph', 0)} graph replay, "
                  f"{s.get('eager', 0)} eager")
    wrows = [(w.get("cause"), "too little to predict" if w.get("predicted") is False else fmt_ns(w.get("saved_ns")),
              fmt_ns(w.get("lost_ns")), fmt_ns(w.get("step_ns_before")),
              "" if w.get("predicted") is False else fmt_ns(w.get("step_ns_after")),
              "" if w.get("predicted") is False else f"{float(w.get('speedup') or 1):.2f}x", w.get("bound") or "",
              "; ".join(str(x) for x in (w.get("assumptions") or [])[:2]))
             for w in (d.get("what_if") or [])
             if int(w.get("saved_ns") or 0) > 0 or w.get("predicted") is False][:6]
    conf = float(v.get("confidence") or 0)
    srcs = ", ".join(str(x).rsplit("/", 1)[-1] for x in cap.get("sources") or [])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:{W + 40}px;
color:#1d1d1d;padding:0 20px}}
h1{{font-size:22px;margin:0 0 4px}} h2{{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}}
h3{{font-size:14px;margin:14px 0 4px;font-weight:600}}
.card{{border:2px solid {COLOURS.get(bott, "#444")};border-radius:8px;padding:14px 18px;margin:16px 0}}
.verdict{{font-size:20px;font-weight:700}} .cause{{color:#555;font-weight:600}}
.conf{{display:inline-block;width:160px;height:10px;background:#eee;border-radius:5px;vertical-align:middle}}
.conf i{{display:block;height:10px;border-radius:5px;background:{COLOURS.get(bott, "#444")}}}
.warn{{background:#fff6df;border:1px solid #e9c96b;border-radius:6px;padding:8px 14px}}
table{{border-collapse:collapse;margin:6px 0}} td,th{{padding:3px 10px;border-bottom:1px solid #eee;
text-align:left;max-width:640px;overflow-wrap:anywhere}} th{{color:#555;font-weight:600}}
.legend{{margin:4px 0}} .key{{margin-right:14px;font-size:12px;white-space:nowrap}}
.key i{{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}}
.note{{color:#666;font-size:12px;margin:2px 0 10px}} .ax{{font-size:10px;fill:#555}} svg{{display:block}}
</style></head><body>
<h1>{_e(title)}</h1>
<div class="note">{_e(cap.get("format", "?"))} {_e(cap.get("tool_version") or "")} · {_e(srcs)} ·
ranks {_e(cap.get("ranks"))} · window {fmt_ns(cap.get("window_ns") or 0)}</div>
<div class="card"><div class="verdict">Bottleneck: {_e(bott.upper())}
<span class="cause">/ {_e(v.get("cause", "?"))}</span></div>
<div>confidence {conf:.0%} <span class="conf"><i style="width:{100 * conf:.0f}%"></i></span>
{"· healthy" if v.get("healthy") else ""}</div>
<p id="summary">{_e(v.get("summary", ""))}</p>
<ul>{ev}</ul>
{f"<h3>What to do next</h3><ul>{adv}</ul>" if adv else ""}</div>
{f'<div class="warn"><b>Capture warnings</b><ul>{warns}</ul></div>' if warns else ""}
{("<h2>What if: the mean step without each cause</h2>" + _table(["cause", "saved per step", "lost per step",
    "step before", "step after", "speedup", "bound", "assumes"], wrows)
    + '<p class="note">Predicted from this trace: device work as measured, only the time the device waited '
    'for is given back, never more than the cause lost (bound: what limited it).</p>') if wrows else ""}
<h2>Timeline overview</h2>{timeline_svgs(d)}
<h2>Device busy time: {fmt_ns(busy)}</h2>{_table(["part", "time", "share of busy", "bytes", "GB/s"], drows)
    if busy else '<p class="note">No device activity.</p>'}
<h2>Bubbles: {_e(b.get("count", 0))} gaps, {fmt_ns(total)} idle</h2>
{_table(["class", "time", "share"], crows) if crows else '<p class="note">No bubbles.</p>'}
{_table(["cause", "time", "share"], krows) if krows else ""}
<p class="note">Plus {_e(b.get("sub_threshold_count", 0))} gaps at or under the threshold:
{fmt_ns(b.get("sub_threshold_ns") or 0)}.</p>
<h3>Bubble durations</h3>{histogram_svg(d)}
<h2>Steps</h2><p>{_e(steps_line)}</p>{budget_svg(d)}
<h2>Communication</h2>{comm_section(d)}
<h2>Top kernels (share of kernel time)</h2>{_table(["kernel", "calls", "time", "share"], kern)
    if kern else '<p class="note">No kernels.</p>'}
</body></html>
"""


def _pct(part: Any, whole: int) -> str:
    return f"{100 * int(part or 0) / whole:.1f}%" if whole else ""
