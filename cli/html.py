"""HTML report of a diagnosis: one self-contained file (inline CSS, SVG and a few lines of script
for the timeline's zoom and hover figures; no network), drawn from the JSON contract only, so it can never disagree
with ``--json``.

Every plot is built from aggregates (``overview`` bins, per-step parts, histogram bins, matched
collectives), never one element per kernel: the file stays small whatever the trace's size. The
charts are in ``html_charts``; the timeline (every rank and device as a lane on one clock) in
``html_timeline``, its script in ``html_zoom``.
"""
from __future__ import annotations

from typing import Any

from srtscope.analyzers.model.units import fmt_bytes, fmt_ns, plural
from srtscope.cli import escape
from srtscope.cli.html_charts import COLOURS, W, histogram_svg, skew_svg, steps_svg
from srtscope.cli.html_timeline import timeline_html
from srtscope.cli.html_zoom import ZOOM_JS
from srtscope.cli.phases_view import HEAD as PHASES_HEAD
from srtscope.cli.phases_view import TITLE as PHASES_TITLE
from srtscope.cli.phases_view import phase_rows


def _e(x: Any) -> str:
    """Escaped text from a trace: never markup (``cli.escape.html``)."""
    return escape.html(x)


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
        ranks: dict[str, int] = {}
        for x in coll:
            if x.get("straggler_rank") is not None:
                ranks[str(x["straggler_rank"])] = ranks.get(str(x["straggler_rank"]), 0) + 1
        out += (skew_svg(coll) + f'<p class="note">Arrival skew of the {len(coll)} most skewed collectives. '
                'Last to arrive: '
                + (", ".join(f"rank {_e(r)} in {n}" for r, n in sorted(ranks.items())) or "no single rank")
                + '.</p>')
    return out


def _table(head: list[str], rows: list[tuple], name_cols: tuple[int, ...] = ()) -> str:
    """A table; cells of ``name_cols`` (names from the trace) may break anywhere, others never mid-word."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td{" class=name" if i in name_cols else ""}>{_e(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _subtitle(cap: dict[str, Any]) -> str:
    fmt, tool = str(cap.get("format", "?")), str(cap.get("tool_version") or "")
    srcs = ", ".join(str(x).rsplit("/", 1)[-1] for x in cap.get("sources") or [])
    ranks = ", ".join(str(r) for r in cap.get("ranks") or [0])
    return (f"{_e(tool if tool.startswith(fmt) else (fmt + ' ' + tool).strip())} · {_e(srcs)} · "
            f"rank{'s' if len(cap.get('ranks') or [0]) != 1 else ''} {_e(ranks)} · "
            f"window {fmt_ns(cap.get('window_ns') or 0)}")


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:%(w)dpx;
color:#1d1d1d;padding:0 20px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px;font-weight:600}
.card{border:2px solid %(c)s;border-radius:8px;padding:14px 18px;margin:16px 0}
.verdict{font-size:20px;font-weight:700} .cause{color:#555;font-weight:600}
.gain{font-size:15px;font-weight:600;margin:2px 0} .alt{color:#555;margin:4px 0}
details{margin:4px 0} summary{cursor:pointer;color:#444}
.conf{display:inline-block;width:160px;height:10px;background:#eee;border-radius:5px;vertical-align:middle}
.conf i{display:block;height:10px;border-radius:5px;background:%(c)s}
.warn{background:#fff6df;border:1px solid #e9c96b;border-radius:6px;padding:8px 14px}
table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top} th{color:#555;font-weight:600;white-space:nowrap}
td{max-width:640px} td.name{overflow-wrap:anywhere;font-family:ui-monospace,monospace;font-size:12px}
td.num{text-align:right;white-space:nowrap}
.legend{margin:4px 0 4px 64px} .group{margin-right:22px;font-size:12px} .key{margin-left:10px;white-space:nowrap}
.key i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
.note{color:#666;font-size:12px;margin:2px 0 10px} .ax{font-size:10px;fill:#555} .axt{font-size:11px;fill:#333}
.grid{stroke:#e2e2e2} .sep{stroke:#333;stroke-dasharray:3 3} svg{display:block} figure{margin:0}
.zoom{margin:0 0 2px 64px} .zoom button{font-size:11px;margin-right:4px}
figure.tl{user-select:none;position:relative} .vg{stroke:#000;stroke-opacity:.13} .lname{font-size:11px}
.cur{stroke:#d22;stroke-width:1} .tip{position:absolute;z-index:1;pointer-events:none;white-space:pre-line;
max-width:420px;background:#fff;border:1px solid #999;border-radius:4px;padding:4px 8px;font-size:12px;
box-shadow:0 1px 4px rgba(0,0,0,.2)} .tip[hidden]{display:none}
"""


def diagnosis_html(d: dict[str, Any], title: str = "srtscope diagnosis") -> str:
    from srtscope.cli.report_words import busy_note, caveat_lines, default_evidence, graph_split

    v, b, cap = d.get("verdict") or {}, d.get("bubbles") or {}, d.get("capture") or {}
    bott = str(v.get("bottleneck", "?"))
    total = int(b.get("total_ns") or 0)
    # NOTE: the card shows what the terminal's default view shows; the rest is under a fold
    shown, shares, folded = default_evidence(d)
    ev = "".join(f"<li>{_e(x.get('text'))}</li>" for x in shown) + "".join(f"<li>{_e(x)}</li>" for x in shares)
    more = "".join(f"<li>{_e(x.get('text'))}</li>" for x in folded)
    advice = v.get("advice") or []
    adv = "".join(f"<li><b>{_e(a.get('cause'))}</b>: {_e(a.get('text'))}</li>" for a in advice[:1])
    adv_more = "".join(f"<li><b>{_e(a.get('cause'))}</b>: {_e(a.get('text'))}</li>" for a in advice[1:])
    line1 = f" · {_e(v['headline'])}" if v.get("headline") else ""
    warns = "".join(f"<li><b>{_e(c.split(':', 1)[0])}</b>:{_e(c.split(':', 1)[1]) if ':' in c else ''}</li>"
                    for c in caveat_lines(d))
    dv = d.get("device") or {}
    busy = int(dv.get("busy_ns") or 0)
    drows = [("kernel execution", fmt_ns(dv.get("kernel_ns")), _pct(dv.get("kernel_ns"), busy), "", "")]
    if dv.get("comm_ns"):
        drows.append(("collectives", fmt_ns(dv["comm_ns"]), _pct(dv["comm_ns"], busy), "", ""))
    for k, cp in (dv.get("memcpy") or {}).items():
        drows.append((f"memcpy {k}", fmt_ns(cp.get("ns")), _pct(cp.get("ns"), busy),
                      fmt_bytes(int(cp.get("bytes", -1))), f"{cp['gbps']:.1f}" if cp.get("gbps") else ""))
    if dv.get("memset_ns"):
        drows.append(("memset", fmt_ns(dv["memset_ns"]), _pct(dv["memset_ns"], busy), "", ""))
    if dv.get("exposed_memcpy_ns"):
        drows.append(("copies with no kernel running", fmt_ns(dv["exposed_memcpy_ns"]),
                      _pct(dv["exposed_memcpy_ns"], busy), "", ""))
    crows = [(c, fmt_ns(ns), _pct(ns, total)) for c, ns in sorted((b.get("by_class") or {}).items(),
                                                                  key=lambda kv: -int(kv[1])) if int(ns)]
    krows = [(c, fmt_ns(ns), _pct(ns, total)) for c, ns in sorted((b.get("by_cause") or {}).items(),
                                                                  key=lambda kv: -int(kv[1])) if int(ns)]
    kern = [(k.get("name"), k.get("count"), fmt_ns(k.get("total_ns")), f"{100 * float(k.get('share') or 0):.1f}%")
            for k in d.get("top_kernels") or []]
    s = d.get("steps") or {}
    per_rank = s.get("per_rank") or {}
    per = int(max(per_rank.values()) if per_rank else s.get("count", 0))
    split = graph_split(s)
    steps_line = (f"{plural(per, 'step')} per rank over {plural(max(len(per_rank), 1), 'rank')}, from "
                  f"{s.get('source', '?')}" + (f": {split[2:-1]}" if split else ""))
    wrows = [(w.get("cause"), "too little to predict" if w.get("predicted") is False else fmt_ns(w.get("saved_ns")),
              fmt_ns(w.get("lost_ns")), fmt_ns(w.get("step_ns_before")),
              "" if w.get("predicted") is False else fmt_ns(w.get("step_ns_after")),
              "" if w.get("predicted") is False else f"{float(w.get('speedup') or 1):.2f}x", w.get("bound") or "",
              "; ".join(str(x) for x in (w.get("assumptions") or [])[:2]))
             for w in (d.get("what_if") or [])
             if int(w.get("saved_ns") or 0) > 0 or w.get("predicted") is False][:6]
    conf = float(v.get("confidence") or 0)
    colour = COLOURS.get(bott, "#444")
    thr = fmt_ns(b.get("threshold_ns") or 0)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS % {"w": W + 40, "c": colour}}</style></head><body>
<h1>{_e(title)}</h1>
<div class="note">{_subtitle(cap)}</div>
<div class="card"><div class="verdict">Bottleneck: {_e(bott.upper())}
<span class="cause">/ {_e(v.get("cause", "?"))}{line1}</span></div>
{f'<div class="gain" id="gain">{_e(v["gain"])}</div>' if v.get("gain") else ""}
<div>confidence {conf:.0%} <span class="conf"><i style="width:{100 * conf:.0f}%"></i></span>
{"· healthy" if v.get("healthy") else ""}</div>
{f'<p class="alt" id="alternatives">{_e(v["alternatives"])}</p>' if v.get("alternatives") else ""}
<p id="summary">{_e(v.get("summary", ""))}</p>
<ul>{ev}</ul>
{f"<details><summary>All evidence ({len(folded)} more)</summary><ul>{more}</ul></details>" if more else ""}
<p class="note">Lost time: all the time the device waited (bubbles, gaps under the threshold, exposed copies and
collectives), by cause. Bubble time: idle gaps over {thr}, by class (what the host was doing).
The words used here are explained in srtscope's <code>docs/glossary.md</code>.</p>
{f"<h3>What to do next</h3><ul>{adv}</ul>" if adv else ""}
{f"<details><summary>More advice ({len(advice) - 1})</summary><ul>{adv_more}</ul></details>" if adv_more else ""}</div>
{f'<div class="warn"><b>Caveats</b><ul>{warns}</ul></div>' if warns else ""}
{('<h2 id="what-if">What if: the mean step without each cause</h2>' + _table(["cause", "saved per step",
    "lost per step", "step before", "step after", "speedup", "bound", "assumes"], wrows)
    + '<p class="note">Predicted from this trace: device work as measured, only the time the device waited '
    'for is given back, never more than the cause lost (bound: what limited it).</p>') if wrows else ""}
{(f'<h2 id="phases">{_e(PHASES_TITLE[0].upper() + PHASES_TITLE[1:])}</h2>' + _table(list(PHASES_HEAD), phase_rows(d)))
    if d.get("phases") else ""}
<h2 id="timeline">Timeline</h2>{timeline_html(d)}
<h2 id="device">Device busy time: {fmt_ns(busy)}{_e(busy_note(d))}</h2>{_table(
    ["part", "time", "share of busy", "bytes", "GB/s"], drows)
    if busy else '<p class="note">No device activity.</p>'}
<h2 id="bubbles">Bubbles: {_e(plural(int(b.get("count", 0)), "gap"))}, {fmt_ns(total)} idle</h2>
{_table(["class", "time", "share of bubble time"], crows) if crows else '<p class="note">No bubbles.</p>'}
{_table(["cause", "time", "share of bubble time"], krows) if krows else ""}
<p class="note">Plus {_e(b.get("sub_threshold_count", 0))} gaps at or under the threshold ({thr}):
{fmt_ns(b.get("sub_threshold_ns") or 0)}.</p>
<h3>Bubble durations</h3>{histogram_svg(d)}
<h2 id="steps">Steps</h2><p>{_e(steps_line)}</p>{steps_svg(d)}
<h2 id="comm">Communication</h2>{comm_section(d)}
<h2 id="kernels">Top kernels (share of kernel time)</h2>{_table(["kernel", "calls", "time", "share"], kern, (0,))
    if kern else '<p class="note">No kernels.</p>'}
<script>{ZOOM_JS}</script>
</body></html>
"""


def _pct(part: Any, whole: int) -> str:
    return f"{100 * int(part or 0) / whole:.1f}%" if whole else ""
