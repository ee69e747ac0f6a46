"""Rich rendering of a diagnosis — from the documented JSON contract only, so the terminal report
and ``--json`` can never disagree. No analysis happens here.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from srtscope.analyzers.model.units import clean_text, clip_text, fmt_bytes, fmt_ns, fmt_pct, plural
from srtscope.cli import escape
from srtscope.cli.phases_view import HEAD as PHASES_HEAD
from srtscope.cli.phases_view import TITLE as PHASES_TITLE
from srtscope.cli.phases_view import phase_rows
from srtscope.cli.report_words import (
    busy_note,
    caveat_lines,
    copy_memory,
    default_evidence,
    graph_split,
)
from srtscope.cli.terminal import Console

CLASS_STYLE = {"scheduler": "magenta", "prep": "yellow", "kernel": "cyan", "sync": "blue",
               "launch": "red", "unattributed": "grey50", "comm": "green", "host": "bright_red",
               "queued": "green"}
#: what each bubble class means, beside its name (the class ``kernel`` is host time, not kernels)
CLASS_GLOSS = {"scheduler": "host scheduling", "prep": "batch preparation", "kernel": "host in model code",
               "sync": "host waiting on the device", "launch": "launch calls", "unattributed": "unknown",
               "host": "other host work", "queued": "waiting on a dependency"}
_STRIP_CHARS = {"scheduler": "S", "prep": "P", "kernel": "K", "sync": "Y", "launch": "L",
                "unattributed": ".", "busy": "#", "comm": "C", "host": "H", "queued": "Q", "other": "o"}


def _t(text: object, width: int = 4096, style: str = "") -> Text:
    """Text from a trace: never parsed as markup, control characters removed, clipped."""
    return escape.terminal(text, width, style)


def _table(title: str, *cols: str, justify_right: tuple[int, ...] = (), wrap: tuple[int, ...] = ()) -> Table:
    """A report table: numbers right-aligned; no cell wraps (a word is never split over two
    lines) but the columns in ``wrap``, free text that wraps between words."""
    # NOTE: the title is printed as a heading line by ``render_diagnosis`` (a table title would
    # wrap to the table's width); it is kept on the table as ``title_text``.
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    t.title_text = title  # type: ignore[attr-defined]
    for i, c in enumerate(cols):
        free = i in wrap
        t.add_column(c, justify="right" if i in justify_right else "left", no_wrap=not free,
                     overflow="fold" if free else "ellipsis")
    return t


def capture_line(d: dict[str, Any], width: int = 80) -> Text:
    """What was read: format, files, ranks, devices, window; wrapped between its parts."""
    cap = d.get("capture", {})
    srcs = cap.get("sources") or []
    fmt, tool = clean_text(cap.get("format", "?"), 40), clean_text(cap.get("tool_version") or "", 80)
    ranks = cap.get("ranks") or [0]
    parts = ["capture: " + (tool if tool.startswith(fmt) else (fmt + " " + tool).strip()),
             f"{len(srcs)} file{'s' if len(srcs) != 1 else ''}",
             f"rank{'s' if len(ranks) != 1 else ''} {clip_text(', '.join(clean_text(r, 20) for r in ranks), 40)}"]
    devs = cap.get("devices") or []
    if devs:
        names = sorted({clean_text(x.get("name") or "", 60) for x in devs} - {""})
        parts.append(f"{len(devs)} device{'s' if len(devs) != 1 else ''}"
                     + (f" ({clip_text(', '.join(names), 40)})" if names else ""))
    if cap.get("window_ns"):
        parts.append(f"window {fmt_ns(cap['window_ns'])}")
    lines = [parts[0]]
    for p in parts[1:]:
        if len(lines[-1]) + 3 + len(p) <= width:
            lines[-1] += " · " + p
        else:
            lines.append("  " + p)
    out = Text("\n".join(lines))
    out.stylize("bold", 0, len("capture:"))
    return out


def clip_words(text: str, width: int) -> str:
    """``text`` in ``width`` characters, cut between words (``…`` where cut)."""
    if len(text) <= width:
        return text
    cut = text[:max(width - 1, 1)]
    if " " in cut[width // 2:]:
        cut = cut[:cut.rindex(" ")].rstrip(" ,;:(")
    return cut + "…"


def capture_panel(d: dict[str, Any], width: int = 80, full: bool = True) -> Text:
    """The capture line and the caveats; the default view gives each caveat one line, but a
    diagnosis of a window of the trace (``window_cut: memory budget: ...``) says it whole."""
    out = capture_line(d, width)
    for c in caveat_lines(d):
        out.append("\n! ", style="bold yellow")
        out.append(c if full or c.startswith("window_cut: memory budget:") else clip_words(c, width - 2),
                   style="yellow")
    return out


LEGEND = "lost time = all device waiting · bubble time = idle gaps over {thr}"
GLOSSARY = "words: docs/glossary.md"


def verdict_panel(d: dict[str, Any], full: bool = True, width: int = 80) -> Panel:
    """Line 1 the class, the cause and its one figure; line 2 what fixing it gives; the other causes
    on one line below (whole in ``full``); then the cause in words, the evidence and the advice."""
    v = d.get("verdict", {})
    bott = v.get("bottleneck", "?")
    conf = float(v.get("confidence", 0.0))
    head = Text()
    head.append("Bottleneck: ", style="bold")
    head.append(str(bott).upper(), style=f"bold {CLASS_STYLE.get(bott, 'white')}")
    if v.get("cause"):
        head.append(f" / {v['cause']}", style="bold")
    if v.get("headline"):
        head.append(f" · {clean_text(v['headline'], 200)}", style="bold")
    head.append(f"   confidence {conf:.0%}\n")
    if v.get("gain"):
        head.append(clean_text(v["gain"], 300) + "\n", style="bold")
    alt = clean_text(v.get("alternatives") or "", 1000)
    if alt:
        head.append((alt if full else clip_words(alt, width - 4)) + "\n", style="dim")
    head.append(clean_text(v.get("summary", ""), 600))
    evidence = [e if isinstance(e, dict) else {"kind": "", "text": e} for e in v.get("evidence") or []]
    shown, shares, _ = default_evidence(d)
    for ev in evidence if full else shown:
        head.append("\n  • ")
        head.append(clean_text(ev.get("text", ""), 400))
    for line in [] if full else shares:
        head.append("\n  • ")
        head.append(line)
    advice = v.get("advice") or []
    for i, a in enumerate(advice if full else advice[:1]):
        head.append("\n" if i else "\nWhat to do next:\n", style="bold")
        head.append(f"  → [{clean_text(a.get('cause'), 40)}] ", style="bold")
        head.append(clean_text(a.get("text", ""), 600))
    if not full and len(advice) > 1:
        head.append("\n  → also: " + ", ".join(clean_text(a.get("cause"), 40) for a in advice[1:])
                    + " (advice in --full)", style="dim")
    if any(str(e.get("kind")).startswith(("cause.", "class.")) for e in evidence):
        head.append("\n")
        legend = LEGEND.format(thr=fmt_ns((d.get("bubbles") or {}).get("threshold_ns") or 0))
        head.append(legend + (f" · {GLOSSARY}" if full else ""), style="dim")
    return Panel(head, title="verdict", title_align="left", box=box.HEAVY)


def device_table(d: dict[str, Any], full: bool = True) -> Table | None:
    """What device busy time was: kernels, collectives, copies by direction, memsets; the default
    view leaves out parts under 0.1% of it."""
    dv = d.get("device") or {}
    busy = int(dv.get("busy_ns") or 0)
    if not busy:
        return None
    t = _table(f"device busy time: {fmt_ns(busy)}{busy_note(d)}", "part", "time", "share of busy", "bytes",
               "GB/s", justify_right=(1, 2, 3, 4))

    def row(label: str | Text, ns: Any, *rest: str) -> None:
        if full or int(ns or 0) * 1000 >= busy:        # parts under 0.1% of busy: --full only
            t.add_row(label, fmt_ns(ns), fmt_pct(int(ns or 0), busy), *rest)

    row("kernel execution", dv.get("kernel_ns"), "", "")
    if dv.get("comm_ns"):
        row("collectives", dv["comm_ns"], "", "")
    for kind, c in (dv.get("memcpy") or {}).items():
        row(_t(f"memcpy {kind}" + copy_memory(c), 60), c.get("ns"),
            fmt_bytes(int(c.get("bytes", -1))), f"{c['gbps']:.1f}" if c.get("gbps") else "")
    if dv.get("memset_ns"):
        row("memset", dv["memset_ns"], "", "")
    if dv.get("exposed_memcpy_ns"):
        row(Text("  copies with no kernel running", style="dim"), dv["exposed_memcpy_ns"], "", "")
    return t


def budget_table(d: dict[str, Any]) -> Table | None:
    b = d.get("budget") or {}
    parts = b.get("parts_ns") or b.get("by_part_ns") or {}
    total = b.get("wall_ns") or sum(int(x) for x in parts.values())
    if not parts:
        return None
    n = b.get("steps") or 0
    t = _table(f"step budget: wall time of the {plural(int(n), 'step')} (inside steps only)", "part", "time", "share",
               justify_right=(1, 2))
    for name, ns in sorted(parts.items(), key=lambda kv: -int(kv[1])):
        if int(ns) == 0:
            continue
        t.add_row(Text(name, style=CLASS_STYLE.get(name.split(".")[-1], "")), fmt_ns(ns),
                  fmt_pct(int(ns), total))
    t.add_row(Text("wall", style="bold"), fmt_ns(total), "100%")
    return t


def bubbles_table(d: dict[str, Any], full: bool = True) -> Table:
    b = d.get("bubbles", {})
    total = int(b.get("total_ns", 0))
    gaps = plural(int(b.get("count", 0)), "gap")
    t = _table(f"bubbles: {gaps}, {fmt_ns(total)} idle, "
               f"{b.get('idle_share', 0) * 100:.1f}% of the whole active window"
               if "idle_share" in b else
               f"bubbles: {gaps}, {fmt_ns(total)} idle",
               "class (host activity)", "time", "% of bubble time", justify_right=(1, 2))
    if not total:
        t.add_row(Text(f"no gap over {fmt_ns(b.get('threshold_ns', 0))}", style="dim"), "", "")
    for cls, ns in sorted((b.get("by_class") or {}).items(), key=lambda kv: -int(kv[1])):
        if int(ns) == 0:
            continue
        label = Text(cls, style=CLASS_STYLE.get(cls, ""))
        if cls in CLASS_GLOSS:
            label.append(f" ({CLASS_GLOSS[cls]})", style="dim")
        t.add_row(label, fmt_ns(ns), fmt_pct(int(ns), total))
    causes = [(c, ns) for c, ns in (b.get("by_cause") or {}).items() if int(ns)]
    if causes and full:
        t.add_section()
        for c, ns in sorted(causes, key=lambda kv: -int(kv[1])):
            t.add_row(Text(f"  cause {c}", style="dim"), fmt_ns(ns), fmt_pct(int(ns), total))
    if b.get("sub_threshold_ns"):
        t.add_row(Text(f"  + {b.get('sub_threshold_count', 0)} gaps ≤ threshold (not bubbles)", style="dim"),
                  fmt_ns(b["sub_threshold_ns"]), "")
    by_stage = b.get("by_stage") or {}
    if by_stage and full:
        t.add_section()
        for stage, ns in sorted(by_stage.items(), key=lambda kv: -int(kv[1]))[:6]:
            if int(ns):
                t.add_row(_t(f"  {stage}", 60, "dim"), fmt_ns(ns), fmt_pct(int(ns), total))
    user = [(n, ns) for n, ns in (b.get("by_user_range") or {}).items() if int(ns)][:4]
    if user and full:   # where the unattributed time went: the trace's own ranges, which name no stage
        t.add_section()
        for name, ns in user:
            t.add_row(_t(f"  unattributed in {clip_text(clean_text(name, 200), 40)}", 60, "dim"), fmt_ns(ns),
                      fmt_pct(int(ns), total))
    return t


def steps_table(d: dict[str, Any]) -> Table | None:
    s = d.get("steps") or {}
    if not s.get("count"):
        return None
    per_rank = s.get("per_rank") or {}
    n = max(per_rank.values()) if per_rank else s.get("count")
    ranks = f" over {len(per_rank)} ranks ({s.get('count')} in all)" if len(per_rank) > 1 else ""
    t = _table(f"steps: {n} per rank{ranks}, from {s.get('source', '?')}{graph_split(s)}", "eager reason",
               "steps", justify_right=(1,))
    reasons = s.get("eager_reasons") or {}
    if not graph_split(s):
        reasons = {}
    elif not s.get("graph") and set(reasons) <= {"disabled"}:
        # no step replayed a graph anywhere: "eager (disabled)" for each step would say nothing
        t.add_row(Text("no step replayed a CUDA graph (none captured, or not traced)", style="dim"),
                  str(s.get("eager", 0)))
        reasons = {}
    for reason, n in sorted(reasons.items(), key=lambda kv: -int(kv[1])):
        t.add_row(_t(reason, 40), str(n))
    if not reasons and s.get("graph"):
        t.add_row(Text("no eager steps", style="dim"), "0")
    fb = s.get("fallback") or d.get("eager_fallback") or {}
    if fb.get("steps"):
        t.add_section()
        t.add_row(_t(f"fallback decode steps (bs {fb.get('batch_sizes', '?')})", 80), str(fb.get("steps")))
        if fb.get("launches_per_step_eager") is not None:
            t.add_row("launches/step eager vs graph",
                      f"{fb.get('launches_per_step_eager')} vs {fb.get('launches_per_step_graph', '-')}")
    return t


def comm_table(d: dict[str, Any]) -> Table | None:
    c = d.get("comm") or {}
    if not c.get("total_ns"):
        return None
    t = _table("communication", "figure", "value", justify_right=(1,))
    t.add_row("collective time", fmt_ns(c.get("total_ns")))
    t.add_row("exposed (not overlapped)", fmt_ns(c.get("exposed_ns")))
    if c.get("skew_ns") is not None:
        t.add_row("arrival skew (sum)", fmt_ns(c.get("skew_ns")))
    if c.get("straggler_rank") is not None:
        t.add_row("straggler rank", str(c.get("straggler_rank")))
    return t


def kernels_table(d: dict[str, Any], limit: int = 8, width: int = 80) -> Table | None:
    """The top kernels; names shortened to the width (``names.short_names``: distinct, function
    name kept), the full names being in the JSON and the HTML report."""
    from srtscope.cli.names import short_names

    ks = d.get("top_kernels") or []
    if not ks:
        return None
    t = _table("top kernels (share of kernel time; full names in --json / --html)", "kernel", "calls",
               "time", "share", justify_right=(1, 2, 3))
    calls = max([len(str(k.get("count", ""))) for k in ks[:limit]] + [5])
    room = min(max(width - calls - 9 - 5 - 6, 16), 120)
    for k, name in zip(ks[:limit], short_names([clean_text(k.get("name", "?"), 2000) for k in ks[:limit]], room)):
        t.add_row(Text(name), str(k.get("count", "")), fmt_ns(k.get("total_ns")),
                  f"{100 * float(k.get('share') or 0):.0f}%")
    return t


def step_strip(d: dict[str, Any], width: int = 60) -> Text | None:
    """One character per step: where most of its time went (# busy, S sched, P prep, ...)."""
    per = (d.get("steps") or {}).get("per_step") or []
    if not per:
        return None
    out = Text("per-step strip: what most of each step's time went to\n", style="bold")
    out.append("(# device busy  C comm  S scheduler  P prep  K kernel-side host  Y sync  L launch  "
               "H host work  Q queued  . unannotated  o other  - idle)\n", style="dim")
    for st in per[:width]:
        parts = {k: int(v) for k, v in (st.get("parts_ns") or {}).items()}
        if st.get("exec") == "idle" or not any(v for k, v in parts.items() if k != "other"):
            out.append("-", style="dim")  # idle step: nothing ran
            continue
        busy = parts.get("busy", 0) + parts.get("comm", 0)
        lost = {k: v for k, v in parts.items() if k not in ("busy", "comm") and v > 0}
        if lost and sum(lost.values()) > busy:
            key = max(lost.items(), key=lambda kv: kv[1])[0]
        else:
            key = "comm" if parts.get("comm", 0) > parts.get("busy", 0) else "busy"
        out.append(_STRIP_CHARS.get(key, "?"), style=CLASS_STYLE.get(key, ""))
    total = int((d.get("steps") or {}).get("count") or len(per))
    if total > width:
        out.append(f" … {total - width} more steps")
    return out


def _predicted(w: dict[str, Any]) -> bool:
    return w.get("predicted") is not False


#: the what-if table's columns: (header, formatter of a row, shown when narrow); a new column is one more entry
WHAT_IF_COLUMNS: tuple[tuple[str, Any, bool], ...] = (
    ("saved/step", lambda w: fmt_ns(w.get("saved_ns")) if _predicted(w) else "–", True),
    ("lost/step", lambda w: fmt_ns(w.get("lost_ns")), True),
    ("step before", lambda w: fmt_ns(w.get("step_ns_before")), False),
    ("after", lambda w: fmt_ns(w.get("step_ns_after")) if _predicted(w) else "–", True),
    ("speedup", lambda w: f"{float(w.get('speedup') or 1):.2f}x" if _predicted(w) else "–", True),
    ("bound", lambda w: str(w.get("bound") or ""), True))
WIDE = 140          # from this width the what-if assumptions fit in a column


def what_if_table(d: dict[str, Any], limit: int = 6, width: int = WIDE, full: bool = True) -> Table | None:
    """The predicted mean step time with each cause removed, largest saving first (``what_if``), what
    each cause lost and the bound that limited the saving. Narrower than ``WIDE``: the class and the
    step before (in the title) are dropped and the first assumption of each row becomes a footnote."""
    rows = [w for w in d.get("what_if") or []
            if int(w.get("saved_ns") or 0) > 0 or not _predicted(w)][:limit]
    if not rows:
        return None
    wide = width >= WIDE
    cols = [c for c in WHAT_IF_COLUMNS if wide or c[2]]
    heads = ["cause", *(["class"] if wide else []), *(h for h, _, _ in cols)] + (["assumes"] if wide else [])
    first = 2 if wide else 1
    title = "what if: the mean step without each cause (predicted; device work as measured)"
    if not wide:
        title = f"what if: the mean step of {fmt_ns(rows[0].get('step_ns_before'))} without each cause (predicted)"
    t = _table(title, *heads, justify_right=tuple(range(first, first + len(cols) - 1)),
               wrap=(len(heads) - 1,) if wide else ())
    notes = []
    for i, w in enumerate(rows, 1):
        a = list(w.get("assumptions") or [])
        if not _predicted(w):
            a = ["too little to predict: " + (a[0] if a else "the steps hold too little device work")]
        cause = _t(w.get("cause"), 40, CLASS_STYLE.get(str(w.get("class")), ""))
        if not wide and a:
            cause.append(f" [{i}]", style="dim")
            notes.append(f"[{i}] {clean_text(a[0], 400)}")
        t.add_row(cause, *([_t(w.get("class"), 20)] if wide else []), *(_t(fmt(w), 40) for _, fmt, _ in cols),
                  *([_t(a[0] if a else "", 400)] if wide else []))
    t.footnotes = [n if full else clip_words(n, width) for n in notes]  # type: ignore[attr-defined]
    return t


def phases_table(d: dict[str, Any]) -> Table | None:
    """Prefill and decode apart: the mean step of each phase and its verdict (``phases``)."""
    rows = phase_rows(d)
    if not rows:
        return None
    t = _table(PHASES_TITLE, *PHASES_HEAD, justify_right=(1, 2, 3, 4), wrap=(6,))
    for row in rows:
        t.add_row(*(_t(c, 80, CLASS_STYLE.get(c, "") if k == 5 else "") for k, c in enumerate(row)))
    return t


def steps_line(d: dict[str, Any], width: int = 80) -> Text | None:
    """One line: how many steps, from where, graph replay or eager."""
    t = steps_table(d)
    if t is None:
        return None
    head, _, tail = t.title_text.partition(" (")  # type: ignore[attr-defined]
    return Text(head + (" (" + tail if len(head) + len(tail) + 2 <= width else "\n  (" + tail), style="bold")


def render_diagnosis(d: dict[str, Any], console: Console, full: bool = False) -> None:
    """The terminal report. Default: about one screen — capture, verdict with evidence and advice,
    the top what-ifs, device time, bubbles by class, top kernels; ``full``: every table."""
    width = console.width
    console.print(capture_panel(d, width, full))
    console.print(verdict_panel(d, full, console.width))
    if full:
        parts = [device_table(d), budget_table(d), phases_table(d), what_if_table(d, 6, width, True),
                 bubbles_table(d, True),
                 steps_table(d), comm_table(d), kernels_table(d, 10, width), step_strip(d)]
    else:
        parts = [what_if_table(d, 3, width, False), phases_table(d), device_table(d, False), bubbles_table(d, False),
                 kernels_table(d, 5, width), steps_line(d, width)]
    for part in parts:
        if part is None:
            continue
        title = getattr(part, "title_text", None)
        if title:
            console.print(Text(title, style="bold"))
        console.print(part)
        for note in getattr(part, "footnotes", None) or []:
            console.print(Text(note, style="dim"))
    if not full:
        console.print(Text(clip_words(f"--full: all evidence, caveats and tables · {GLOSSARY}", width),
                           style="dim"))
