"""Markdown report of a diagnosis (from the JSON contract) — for PR comments and CI artefacts."""
from __future__ import annotations

from typing import Any

from srtscope.analyzers.model.units import fmt_ns, fmt_pct, plural
from srtscope.cli import escape
from srtscope.cli.phases_view import HEAD as PHASES_HEAD
from srtscope.cli.phases_view import TITLE as PHASES_TITLE
from srtscope.cli.phases_view import phase_rows
from srtscope.cli.report_words import busy_note, graph_split


def md_text(text: object, width: int = 400) -> str:
    """A string from a trace as Markdown text (``cli.escape.markdown``): no table or code-span
    breaks, no raw HTML nor link syntax."""
    return escape.markdown(text, width)


_md = md_text


def _code(text: object, width: int = 80) -> str:
    """A name from a trace inside a code span (``cli.escape.markdown_code``)."""
    return escape.markdown_code(text, width)


def diagnosis_markdown(d: dict[str, Any]) -> str:
    v, b, s, c = d.get("verdict", {}), d.get("bubbles", {}), d.get("steps", {}), d.get("comm", {})
    cap = d.get("capture", {})
    headline = f" · {_md(v['headline'], 200)}" if v.get("headline") else ""
    out = ["# srtscope diagnosis", "",
           f"**Bottleneck: {str(v.get('bottleneck', '?')).upper()} / {v.get('cause', '?')}{headline}** "
           f"(confidence {float(v.get('confidence', 0)):.0%})", ""]
    out += [f"**{_md(v['gain'], 300)}**", ""] if v.get("gain") else []
    out += [f"_{_md(v['alternatives'], 1000)}_", ""] if v.get("alternatives") else []
    out += [_md(v.get("summary", ""), 600), ""]
    for ev in v.get("evidence") or []:
        out.append(f"- {_md(ev if isinstance(ev, str) else ev.get('text', ev))}")
    out += ["", f"_Lost time: all the time the device waited (bubbles, gaps under the threshold, exposed copies "
                f"and collectives), by cause. Bubble time: idle gaps over "
                f"{fmt_ns(b.get('threshold_ns') or 0)}, by class (what the host was doing)._"]
    if v.get("advice"):
        out += ["", "## What to do next", ""]
        for a in v["advice"]:
            out.append(f"- **{_md(a.get('cause'), 40)}**: {_md(a.get('text'), 600)}")
    wif = [w for w in d.get("what_if") or []
           if int(w.get("saved_ns") or 0) > 0 or w.get("predicted") is False][:6]
    if wif:
        out += ["", "## What if (predicted mean step without each cause; device work as measured)", "",
                "| cause | saved per step | lost per step | step before | step after | speedup | bound |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for i, w in enumerate(wif, 1):
            none = w.get("predicted") is False
            out.append(f"| {_md(w.get('cause'), 40)} [{i}] | "
                       f"{'too little to predict' if none else fmt_ns(w.get('saved_ns'))} | "
                       f"{fmt_ns(w.get('lost_ns'))} | {fmt_ns(w.get('step_ns_before'))} | "
                       f"{'' if none else fmt_ns(w.get('step_ns_after'))} | "
                       f"{'' if none else format(float(w.get('speedup') or 1), '.2f') + 'x'} | "
                       f"{_md(w.get('bound') or '', 20)} |")
        out += [""] + [f"{i}. {_md((w.get('assumptions') or ['-'])[0], 600)}" for i, w in enumerate(wif, 1)]
    phases = phase_rows(d)
    if phases:
        out += ["", f"## {PHASES_TITLE[0].upper()}{PHASES_TITLE[1:]}", "", "| " + " | ".join(PHASES_HEAD) + " |",
                "|---|---:|---:|---:|---:|---|---|"]
        out += ["| " + " | ".join(_md(c, 200) for c in row) + " |" for row in phases]
    dv = d.get("device") or {}
    if dv.get("busy_ns"):
        busy = int(dv["busy_ns"])
        out += ["", f"## Device busy time: {fmt_ns(busy)}{busy_note(d)}", "",
                "| part | time | share of busy | GB/s |", "|---|---:|---:|---:|",
                f"| kernels | {fmt_ns(dv.get('kernel_ns'))} | {fmt_pct(int(dv.get('kernel_ns') or 0), busy)} | |"]
        if dv.get("comm_ns"):
            out.append(f"| collectives | {fmt_ns(dv['comm_ns'])} | {fmt_pct(int(dv['comm_ns']), busy)} | |")
        for kind, cp in (dv.get("memcpy") or {}).items():
            gbps = f"{cp['gbps']:.1f}" if cp.get("gbps") else ""
            out.append(f"| memcpy {kind} | {fmt_ns(cp.get('ns'))} | {fmt_pct(int(cp.get('ns') or 0), busy)} | {gbps} |")
        if dv.get("memset_ns"):
            out.append(f"| memset | {fmt_ns(dv['memset_ns'])} | {fmt_pct(int(dv['memset_ns']), busy)} | |")
    out += ["", "## Capture", "",
            f"- format: {cap.get('format', '?')}; files: {len(cap.get('sources') or [])}; "
            f"ranks: {cap.get('ranks', [0])}"]
    codes = set()
    for w in cap.get("warnings") or []:
        codes.add(w.get("code") if isinstance(w, dict) else "")
        out.append(f"- warning: {_md(w.get('message', w) if isinstance(w, dict) else w)}")
    for cav in v.get("caveats") or []:
        if str(cav).split(":", 1)[0] not in codes:
            out.append(f"- caveat: {_md(cav)}")
    total = int(b.get("total_ns", 0))
    out += ["", "## Bubbles", "", f"{plural(int(b.get('count', 0)), 'gap')}, {fmt_ns(total)} idle.", "",
            "| class | time | share |", "|---|---:|---:|"]    # share: of bubble time
    for cls, ns in sorted((b.get("by_class") or {}).items(), key=lambda kv: -int(kv[1])):
        if int(ns):
            out.append(f"| {cls} | {fmt_ns(ns)} | {fmt_pct(int(ns), total)} |")
    if b.get("by_cause"):
        out += ["", "| cause | time | share |", "|---|---:|---:|"]
        for c_, ns in sorted(b["by_cause"].items(), key=lambda kv: -int(kv[1])):
            out.append(f"| {c_} | {fmt_ns(ns)} | {fmt_pct(int(ns), total)} |")
    if not total:
        out.append(f"| no gap over {fmt_ns(b.get('threshold_ns', 0))} | | |")
    stages = list((b.get("by_stage") or {}).items())[:6]
    if stages:   # a breakdown of the classes above, in its own table so shares add up per table
        out += ["", "Host stage during the bubbles:", "", "| stage | time | share of bubble time |",
                "|---|---:|---:|"]
        out += [f"| {_code(name)} | {fmt_ns(ns)} | {fmt_pct(int(ns), total)} |" for name, ns in stages]
    user = list((b.get("by_user_range") or {}).items())[:4]
    if user:
        out += ["", "Unattributed time inside the trace's own ranges:", "",
                "| range | time | share of bubble time |", "|---|---:|---:|"]
        out += [f"| {_code(name, 60)} | {fmt_ns(ns)} | {fmt_pct(int(ns), total)} |" for name, ns in user]
    split = graph_split(s)
    out += ["", "## Steps", "",
            f"{plural(int(s.get('count', 0)), 'step')} from {s.get('source', '?')} "
            f"({', '.join(f'rank {r}: {n}' for r, n in (s.get('per_rank') or {}).items())})"
            f"{': ' + split[2:-1] if split else ''}."]
    if split and not s.get("graph") and set(s.get("eager_reasons") or {}) <= {"disabled"}:
        out.append("- no step replayed a CUDA graph")
    elif split:
        for reason, n in (s.get("eager_reasons") or {}).items():
            out.append(f"- eager ({_md(reason, 40)}): {n}")
    bud = d.get("budget") or {}
    parts = {k: int(x) for k, x in (bud.get("parts_ns") or {}).items() if int(x)}
    if parts:
        wall = int(bud.get("wall_ns") or sum(parts.values()))
        n = plural(int(bud.get("steps", 0)), "step")
        out += ["", f"Step budget: the wall time of the {n} (inside steps only).", "",
                "| part | time | share |", "|---|---:|---:|"]
        out += [f"| {k} | {fmt_ns(x)} | {fmt_pct(x, wall)} |" for k, x in sorted(parts.items(), key=lambda kv: -kv[1])]
    if c.get("total_ns"):
        out += ["", "## Communication", "",
                f"- collective time {fmt_ns(c.get('total_ns'))}, exposed {fmt_ns(c.get('exposed_ns'))}",
                (f"- arrival skew {fmt_ns(c.get('skew_ns'))}; straggler rank: "
                 f"{c.get('straggler_rank') if c.get('straggler_rank') is not None else 'none'}"
                 if c.get("skew_ns") is not None else "- arrival skew and straggler: unknown (partial ranks)")]
    ks = d.get("top_kernels") or []
    if ks:
        out += ["", "## Top kernels (share of kernel time)", "", "| kernel | calls | time |", "|---|---:|---:|"]
        for k in ks[:10]:
            out.append(f"| {_code(k.get('name', '?'), 80)} | {k.get('count', '')} | {fmt_ns(k.get('total_ns'))} |")
    return "\n".join(out) + "\n"
