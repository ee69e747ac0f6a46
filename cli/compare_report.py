"""``compare`` reports — terminal, Markdown and HTML — from the diff's JSON (``DiagnosisDiff.to_json``):
the one-line summary, the verdicts, the figures that moved by human name (largest change per step
first), and kernels and ranges per step (range instance numbers written ``N``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from srtscope.analyzers.model.units import clean_text, fmt_ns
from srtscope.cli import escape
from srtscope.cli.markdown import md_text as _md
from srtscope.cli.names import short_names
from srtscope.cli.terminal import Console

NAME_ROWS = 8          # kernels / ranges shown per table


def fmt_figure(name: object, value: object) -> str:
    """A compare figure with its unit: times for ``*_ns``, plain numbers otherwise."""
    if value is None:
        return "-"
    if str(name).endswith("_ns"):
        return fmt_ns(value)  # type: ignore[arg-type]
    return f"{value:g}" if isinstance(value, (int, float)) else clean_text(value, 40)


def gate_line(call: Any, pct: float, min_change_us: float) -> str:
    """One gated figure's outcome in words (``diff.GateCall``): its values, its change, and why it
    fails or passes the gate of ``pct`` percent and ``min_change_us`` per step."""
    f = call.figure
    change = "new" if f.pct is None else f"{f.pct:+.1f}%"
    timed = f.name.endswith("_ns")
    if timed and f.unit != "count":
        change += f", {_signed(call.change)}/step"
    floor = f" and {min_change_us:g} us/step" if timed else ""
    why = {"regressed": f"worse past {pct:g}%{floor}",
           "better": "better", "unchanged": "unchanged",
           "neutral": "neither better nor worse either way: not gated",
           "under_pct": f"worse, within {pct:g}%",
           "under_floor": f"worse, under {min_change_us:g} us/step"}[call.outcome]
    return f"{f.label} ({f.name}): {fmt_figure(f.name, f.before)} -> {fmt_figure(f.name, f.after)} ({change}): {why}"


def _signed(ns: float) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "") + fmt_ns(abs(ns))


def figure_rows(diff: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures that moved, in ``by_impact`` order, each with its change in words."""
    figs = {f["figure"]: f for f in diff.get("figures") or []}
    sb, sa = (diff.get("steps") or {}).get("before") or 0, (diff.get("steps") or {}).get("after") or 0
    out = []
    for name in diff.get("by_impact") or [n for n, f in figs.items() if f["before"] != f["after"]]:
        f = figs[name]
        pct = f.get("delta_pct")
        word = "" if f.get("better") == "neutral" else ("worse" if f.get("worse") else "better")
        per_step = ""
        if f.get("unit") == "ns/step":
            per_step = _signed(f["delta"])
        elif f.get("unit") == "ns" and sb and sa:
            per_step = _signed(f["after"] / sa - f["before"] / sb)
        out.append({"figure": name, "label": f.get("label") or name, "before": fmt_figure(name, f["before"]),
                    "after": fmt_figure(name, f["after"]), "change": "new" if pct is None else f"{pct:+.1f}%",
                    "per_step": per_step, "word": word, "pct": pct})
    return out


def _verdicts(diff: dict[str, Any]) -> str:
    v = diff.get("verdict") or {}
    b = f"{v.get('before')}/{v.get('before_cause')}"
    a = f"{v.get('after')}/{v.get('after_cause')}"
    return (f"verdict changed: before: {b}, after: {a}" if v.get("changed")
            else f"verdict unchanged: before and after: {a}")


def render_diff(diff: dict[str, Any], console: Console, regressions: list[str] | None = None) -> None:
    """The terminal report: summary, verdicts, warnings, figures by impact, kernels, ranges."""
    head = Text(clean_text(diff.get("summary", ""), 600), style="bold")
    head.append("\n" + clean_text(_verdicts(diff), 200))
    for w in diff.get("warnings") or []:
        head.append("\n! ", style="bold yellow")
        head.append(f"not like for like: {clean_text(w, 300)}", style="yellow")
    console.print(Panel(head, title="compare", title_align="left", box=box.ROUNDED))
    t = _tbl("figure", "before", "after", "change", "per step", "")
    for r in figure_rows(diff):
        style = "" if r["pct"] is not None and abs(r["pct"]) < 1 or not r["word"] else \
            ("red" if r["word"] == "worse" else "green")
        t.add_row(r["label"], r["before"], r["after"], Text(r["change"], style=style), r["per_step"],
                  Text(r["word"], style=style))
    console.print(Text("figures that moved, largest change per step first", style="bold"))
    console.print(t)
    width = console.width
    for kind, rows in (("kernels", diff.get("kernels") or []), ("ranges (instance numbers as N)",
                                                                diff.get("ranges") or [])):
        rows = rows[:NAME_ROWS]
        if not rows:
            continue
        t = _tbl(kind.split()[0][:-1], "before/step", "after/step", "change/step", "calls/step")
        names = short_names([clean_text(r["name"], 2000) for r in rows], max(width - 52, 16))
        for r, name in zip(rows, names):
            d = int(r["delta_ns_per_step"])
            t.add_row(Text(name), fmt_ns(r["before_ns_per_step"]), fmt_ns(r["after_ns_per_step"]),
                      Text(_signed(d), style="red" if d > 0 else "green"),
                      f"{r['before_calls_per_step']:g} -> {r['after_calls_per_step']:g}")
        console.print(Text(f"{kind}: time per step, largest change first", style="bold"))
        console.print(t)
    for msg in regressions or []:
        console.print(Text(f"regression: {clean_text(msg, 300)}", style="bold red"))


def _tbl(*cols: str) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, c in enumerate(cols):
        t.add_column(c, justify="right" if i else "left", no_wrap=True, overflow="ellipsis")
    return t


def diff_markdown(diff: dict[str, Any], regressions: list[str] | None = None) -> str:
    """The compare report as GitHub-flavoured Markdown (for a PR comment)."""
    out = ["# srtscope compare", "", f"**{_md(diff.get('summary', ''))}**", "", _md(_verdicts(diff)), ""]
    out += [f"- not like for like: {_md(w)}" for w in diff.get("warnings") or []]
    out += [f"- **regression**: {_md(m)}" for m in regressions or []]
    out += ["", "## Figures that moved (largest change per step first)", "",
            "| figure | before | after | change | per step | |", "|---|---:|---:|---:|---:|---|"]
    out += [f"| {_md(r['label'])} | {r['before']} | {r['after']} | {r['change']} | {r['per_step']} | {r['word']} |"
            for r in figure_rows(diff)]
    for kind, rows in (("Kernels", diff.get("kernels") or []), ("Ranges (instance numbers as N)",
                                                                diff.get("ranges") or [])):
        if rows:
            out += ["", f"## {kind}: time per step", "",
                    "| name | before/step | after/step | change/step | calls/step |", "|---|---:|---:|---:|---:|"]
            out += [f"| {escape.markdown_code(r['name'], 200)} | "
                    f"{fmt_ns(r['before_ns_per_step'])} | {fmt_ns(r['after_ns_per_step'])} | "
                    f"{_signed(int(r['delta_ns_per_step']))} | "
                    f"{r['before_calls_per_step']:g} -> {r['after_calls_per_step']:g} |" for r in rows[:NAME_ROWS * 2]]
    return "\n".join(out) + "\n"


def diff_html(diff: dict[str, Any], paths: tuple[str, str] | None = None,
              regressions: list[str] | None = None) -> str:
    """The compare report as one offline HTML page (tables; no script). ``paths``: (before, after)
    as given: the title names their files, the full paths follow on a line that wraps anywhere."""
    e = escape.html
    title, where = "srtscope compare", ""
    if paths is not None:
        title += f": {Path(paths[0]).name} → {Path(paths[1]).name}"
        where = f'<p class="paths">before {e(paths[0])}<br>after {e(paths[1])}</p>'

    def table(head: list[str], rows: list[list[Any]], cls: list[str]) -> str:
        th = "".join(f"<th>{e(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f'<td class="{c}">{e(x)}</td>' for x, c in zip(r, cls)) + "</tr>"
                       for r in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    figs = [[r["label"], r["before"], r["after"], r["change"], r["per_step"], r["word"]] for r in figure_rows(diff)]
    parts = [table(["figure", "before", "after", "change", "per step", ""], figs,
                   ["", "num", "num", "num", "num", ""])]
    for kind, rows in (("Kernels", diff.get("kernels") or []), ("Ranges (instance numbers as N)",
                                                                diff.get("ranges") or [])):
        if rows:
            parts.append(f"<h2>{e(kind)}: time per step</h2>" + table(
                ["name", "before/step", "after/step", "change/step", "calls/step"],
                [[r["name"], fmt_ns(r["before_ns_per_step"]), fmt_ns(r["after_ns_per_step"]),
                  _signed(int(r["delta_ns_per_step"])),
                  f"{r['before_calls_per_step']:g} -> {r['after_calls_per_step']:g}"] for r in rows[:NAME_ROWS * 2]],
                ["name", "num", "num", "num", "num"]))
    warns = "".join(f"<li>not like for like: {e(w)}</li>" for w in diff.get("warnings") or [])
    warns += "".join(f"<li><b>regression</b>: {e(m)}</li>" for m in regressions or [])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;padding:0 20px}}
h1{{font-size:22px;overflow-wrap:anywhere}} h2{{font-size:17px;border-bottom:1px solid #ddd}}
.sum{{font-size:16px;font-weight:600}} .paths{{font:12px ui-monospace,monospace;color:#555;overflow-wrap:anywhere}}
table{{border-collapse:collapse}} td,th{{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}}
th{{white-space:nowrap;color:#555}} td.num{{text-align:right;white-space:nowrap}}
td.name{{font:12px ui-monospace,monospace;overflow-wrap:anywhere;max-width:640px}}</style></head><body>
<h1>{e(title)}</h1>{where}<p class="sum" id="summary">{e(diff.get("summary", ""))}</p><p>{e(_verdicts(diff))}</p>
{f"<ul>{warns}</ul>" if warns else ""}
<h2>Figures that moved (largest change per step first)</h2>{"".join(parts)}
</body></html>
"""
