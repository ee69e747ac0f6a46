"""Rich rendering of a diagnosis — from the documented JSON contract only, so the terminal report
and ``--json`` can never disagree. No analysis happens here.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from srtscope.analyzers.units import clean_text, clip_text, fmt_ns, fmt_pct

CLASS_STYLE = {"scheduler": "magenta", "prep": "yellow", "kernel": "cyan", "sync": "blue",
               "launch": "red", "unattributed": "grey50", "comm": "green", "host": "bright_red",
               "queued": "green"}
_STRIP_CHARS = {"scheduler": "S", "prep": "P", "kernel": "K", "sync": "Y", "launch": "L",
                "unattributed": ".", "busy": "#", "comm": "C", "host": "H", "queued": "Q", "other": "o"}


def _t(text: object, width: int = 4096, style: str = "") -> Text:
    """Text from a trace: never parsed as markup, control characters removed, clipped."""
    return Text(clean_text(text, width), style=style)


def _table(title: str, *cols: str, justify_right: tuple[int, ...] = ()) -> Table:
    # NOTE: the title is printed as a heading line by ``render_diagnosis`` (a table title would
    # wrap to the table's width); it is kept on the table as ``title_text``.
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.title_text = title  # type: ignore[attr-defined]
    for i, c in enumerate(cols):
        t.add_column(c, justify="right" if i in justify_right else "left", overflow="fold")
    return t


def capture_panel(d: dict[str, Any]) -> Panel:
    cap = d.get("capture", {})
    lines = Text()
    srcs = cap.get("sources") or []
    fmt, tool = clean_text(cap.get("format", "?"), 40), clean_text(cap.get("tool_version") or "", 80)
    lines.append(f"format {tool if tool.startswith(fmt) else (fmt + ' ' + tool).strip()}")
    lines.append(f"  ·  {len(srcs)} file(s)  ·  ranks {clean_text(cap.get('ranks', [0]), 80)}")
    devs = cap.get("devices") or []
    if devs:
        names = sorted({clean_text(x.get("name") or f"device {x.get('id')}", 60) for x in devs})
        lines.append(f"  ·  devices {len(devs)} ({clip_text(', '.join(names), 60)})")
    if cap.get("window_ns"):
        lines.append(f"  ·  window {fmt_ns(cap['window_ns'])}")
    codes = set()
    for w in cap.get("warnings") or []:
        msg = w.get("message", w) if isinstance(w, dict) else str(w)
        codes.add(w.get("code") if isinstance(w, dict) else "")
        lines.append("\n")
        lines.append("! ", style="bold yellow")
        lines.append(clean_text(msg, 400), style="yellow")
    # the verdict's own caveats (low NVTX coverage, unattributed time, no steps), not said above
    for c in (d.get("verdict") or {}).get("caveats") or []:
        code = str(c).split(":", 1)[0]
        if code not in codes:
            lines.append("\n")
            lines.append("! ", style="bold yellow")
            lines.append(clean_text(c, 400), style="yellow")
    return Panel(lines, title="capture", title_align="left", box=box.ROUNDED)


def verdict_panel(d: dict[str, Any]) -> Panel:
    v = d.get("verdict", {})
    bott = v.get("bottleneck", "?")
    conf = float(v.get("confidence", 0.0))
    head = Text()
    head.append("Bottleneck: ", style="bold")
    head.append(str(bott).upper(), style=f"bold {CLASS_STYLE.get(bott, 'white')}")
    if v.get("cause"):
        head.append(f" / {v['cause']}", style="bold")
    head.append(f"   confidence {conf:.0%}\n")
    head.append(clean_text(v.get("summary", ""), 600))
    for ev in v.get("evidence") or []:
        head.append("\n  • ")
        head.append(clean_text(ev if isinstance(ev, str) else ev.get("text", ev), 400))
    for i, a in enumerate(v.get("advice") or []):
        head.append("\n" if i else "\n\nWhat to do next:\n", style="bold")
        head.append(f"  → [{clean_text(a.get('cause'), 40)}] ", style="bold")
        head.append(clean_text(a.get("text", ""), 600))
    return Panel(head, title="verdict", title_align="left", box=box.HEAVY)


def device_table(d: dict[str, Any]) -> Table | None:
    """What device busy time was: kernels, collectives, copies by direction, memsets."""
    dv = d.get("device") or {}
    busy = int(dv.get("busy_ns") or 0)
    if not busy:
        return None
    t = _table(f"device busy time: {fmt_ns(busy)}", "part", "time", "share of busy", "bytes", "GB/s",
               justify_right=(1, 2, 3, 4))
    t.add_row("kernels (compute)", fmt_ns(dv.get("kernel_ns")), fmt_pct(int(dv.get("kernel_ns") or 0), busy), "", "")
    if dv.get("comm_ns"):
        t.add_row("collectives", fmt_ns(dv.get("comm_ns")), fmt_pct(int(dv["comm_ns"]), busy), "", "")
    for kind, c in (dv.get("memcpy") or {}).items():
        nb = int(c.get("bytes", -1))
        t.add_row(_t(f"memcpy {kind}" + (" (pageable)" if c.get("pageable_ns") else ""), 40), fmt_ns(c.get("ns")),
                  fmt_pct(int(c.get("ns") or 0), busy), _bytes(nb) if nb >= 0 else "?",
                  f"{c['gbps']:.1f}" if c.get("gbps") else "")
    if dv.get("memset_ns"):
        t.add_row("memset", fmt_ns(dv.get("memset_ns")), fmt_pct(int(dv["memset_ns"]), busy), "", "")
    if dv.get("exposed_memcpy_ns"):
        t.add_row(Text("  copies with no kernel running", style="dim"), fmt_ns(dv.get("exposed_memcpy_ns")),
                  fmt_pct(int(dv["exposed_memcpy_ns"]), busy), "", "")
    return t


def _bytes(n: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


def budget_table(d: dict[str, Any]) -> Table | None:
    b = d.get("budget") or {}
    parts = b.get("parts_ns") or b.get("by_part_ns") or {}
    total = b.get("wall_ns") or sum(int(x) for x in parts.values())
    if not parts:
        return None
    n = b.get("steps") or 0
    t = _table(f"step budget: wall time of the {n} steps (inside steps only)", "part", "time", "share",
               justify_right=(1, 2))
    for name, ns in sorted(parts.items(), key=lambda kv: -int(kv[1])):
        if int(ns) == 0:
            continue
        t.add_row(Text(name, style=CLASS_STYLE.get(name.split(".")[-1], "")), fmt_ns(ns),
                  fmt_pct(int(ns), total))
    t.add_row(Text("wall", style="bold"), fmt_ns(total), "100%")
    return t


def bubbles_table(d: dict[str, Any]) -> Table:
    b = d.get("bubbles", {})
    total = int(b.get("total_ns", 0))
    t = _table(f"bubbles: {b.get('count', 0)} gaps, {fmt_ns(total)} idle, "
               f"{b.get('idle_share', 0) * 100:.1f}% of the whole active window"
               if "idle_share" in b else
               f"bubbles: {b.get('count', 0)} gaps, {fmt_ns(total)} idle",
               "class", "time", "share", justify_right=(1, 2))
    if not total:
        t.add_row(Text(f"no gap over {fmt_ns(b.get('threshold_ns', 0))}", style="dim"), "", "")
    for cls, ns in sorted((b.get("by_class") or {}).items(), key=lambda kv: -int(kv[1])):
        if int(ns) == 0:
            continue
        t.add_row(Text(cls, style=CLASS_STYLE.get(cls, "")), fmt_ns(ns), fmt_pct(int(ns), total))
    causes = [(c, ns) for c, ns in (b.get("by_cause") or {}).items() if int(ns)]
    if causes:
        t.add_section()
        for c, ns in sorted(causes, key=lambda kv: -int(kv[1])):
            t.add_row(Text(f"  cause {c}", style="dim"), fmt_ns(ns), fmt_pct(int(ns), total))
    if b.get("sub_threshold_ns"):
        t.add_section()
        t.add_row(Text(f"  + {b.get('sub_threshold_count', 0)} gaps ≤ threshold (not bubbles)", style="dim"),
                  fmt_ns(b["sub_threshold_ns"]), "")
    by_stage = b.get("by_stage") or {}
    if by_stage:
        t.add_section()
        for stage, ns in sorted(by_stage.items(), key=lambda kv: -int(kv[1]))[:6]:
            if int(ns):
                t.add_row(_t(f"  {stage}", 60, "dim"), fmt_ns(ns), fmt_pct(int(ns), total))
    user = [(n, ns) for n, ns in (b.get("by_user_range") or {}).items() if int(ns)][:4]
    if user:   # where the unattributed time went: the trace's own ranges, which name no stage
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
    t = _table(f"steps: {n} per rank{ranks}, from {s.get('source', '?')} ({s.get('graph', 0)} graph replay, "
               f"{s.get('eager', 0)} eager)", "eager reason", "steps", justify_right=(1,))
    reasons = s.get("eager_reasons") or {}
    if not s.get("graph") and set(reasons) <= {"disabled"}:
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


def kernels_table(d: dict[str, Any], limit: int = 8) -> Table | None:
    ks = d.get("top_kernels") or []
    if not ks:
        return None
    t = _table("top kernels (share of kernel time)", "kernel", "calls", "time", "share",
               justify_right=(1, 2, 3))
    for k, name in zip(ks[:limit], distinct_clips([clean_text(k.get("name", "?"), 2000) for k in ks[:limit]], 48)):
        t.add_row(Text(name), str(k.get("count", "")), fmt_ns(k.get("total_ns")),
                  f"{100 * float(k.get('share') or 0):.0f}%")
    return t


def distinct_clips(names: list[str], width: int) -> list[str]:
    """Each name in ``width`` characters, keeping more of its end until no two clipped names
    collide (template kernels differ in their last arguments)."""
    for keep in range(0, width - 1, 4):
        out = [clip_text(n, width, keep_end=keep) for n in names]
        if len(set(out)) == len(set(names)):
            return out
    return [clip_text(n, width, keep_end=width // 2) for n in names]


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


def what_if_table(d: dict[str, Any], limit: int = 6) -> Table | None:
    """The predicted mean step time with each cause removed, largest saving first (``what_if``)."""
    rows = [w for w in d.get("what_if") or [] if int(w.get("saved_ns") or 0) > 0][:limit]
    if not rows:
        return None
    t = _table("what if: the mean step without each cause (predicted; device work as measured)", "cause",
               "class", "saved per step", "step before", "step after", "speedup", "assumes",
               justify_right=(2, 3, 4, 5))
    for w in rows:
        a = w.get("assumptions") or []
        t.add_row(_t(w.get("cause"), 40, CLASS_STYLE.get(str(w.get("class")), "")), _t(w.get("class"), 20),
                  fmt_ns(w.get("saved_ns")), fmt_ns(w.get("step_ns_before")), fmt_ns(w.get("step_ns_after")),
                  f"{float(w.get('speedup') or 1):.2f}x", _t(a[0] if a else "", 120))
    return t


def phases_table(d: dict[str, Any]) -> Table | None:
    """Prefill and decode apart: the mean step of each phase and its verdict (``phases``)."""
    rows = d.get("phases") or []
    if not rows:
        return None
    t = _table("prefill vs decode: the mean step of each phase", "phase", "steps", "step", "compute",
               "lost", "verdict", "largest losses per step", justify_right=(1, 2, 3, 4))
    for ph in rows:
        b = ph.get("mean_bubbles_ns") or {}
        top = ", ".join(f"{c} {fmt_ns(v)}" for c, v in sorted(b.items(), key=lambda kv: -int(kv[1]))[:3])
        verdict = str(ph.get("bottleneck"))
        t.add_row(_t(ph.get("phase"), 10), str(int(ph.get("steps") or 0)), fmt_ns(ph.get("mean_wall_ns")),
                  fmt_ns(ph.get("mean_compute_ns")), f"{float(ph.get('lost_pct') or 0):.0f}%",
                  _t(verdict, 20, CLASS_STYLE.get(verdict, "")), _t(top, 80))
    return t


def render_diagnosis(d: dict[str, Any], console: Console) -> None:
    console.print(capture_panel(d))
    console.print(verdict_panel(d))
    for part in (device_table(d), budget_table(d), phases_table(d), what_if_table(d), bubbles_table(d),
                 steps_table(d), comm_table(d), kernels_table(d), step_strip(d)):
        if part is None:
            continue
        title = getattr(part, "title_text", None)
        if title:
            console.print(Text(title, style="bold"))
        console.print(part)


def render_compare(before: dict[str, Any], after: dict[str, Any], rows: list[dict[str, Any]],
                   console: Console, regressions: list[str] | None = None,
                   warnings: tuple[str, ...] | list[str] = ()) -> None:
    """Side by side: figure, before, after, change. ``rows``: {figure, before, after, delta_pct};
    ``warnings``: why the captures may not be like for like (``DiagnosisDiff.warnings``)."""
    vb, va = before.get("verdict", {}), after.get("verdict", {})
    head = Text()
    head.append(f"before: {clean_text(vb.get('bottleneck', '?'), 20)}/{clean_text(vb.get('cause', '?'), 30)} "
                f"({float(vb.get('confidence', 0)):.0%})   ")
    head.append(f"after: {clean_text(va.get('bottleneck', '?'), 20)}/{clean_text(va.get('cause', '?'), 30)} "
                f"({float(va.get('confidence', 0)):.0%})")
    for w in warnings:
        head.append("\n! ", style="bold yellow")
        head.append(f"not like for like: {w}", style="yellow")
    console.print(Panel(head, title="compare", title_align="left", box=box.ROUNDED))
    t = _table("figures", "figure", "before", "after", "change", "", justify_right=(1, 2, 3))
    console.print(Text("figures", style="bold"))
    for r in rows:
        pct = r.get("delta_pct")
        moved = r.get("before") != r.get("after")
        word = ("" if not moved or r.get("better") == "neutral" else "worse" if r.get("worse") else "better")
        style = "" if pct is None or abs(pct) < 1 else ("red" if r.get("worse") else "green")
        t.add_row(str(r.get("figure")), fmt_figure(r.get("figure"), r.get("before")),
                  fmt_figure(r.get("figure"), r.get("after")),
                  Text("new" if pct is None and moved else "-" if pct is None else f"{pct:+.1f}%", style=style),
                  Text(word, style=style))
    console.print(t)
    for msg in regressions or []:
        console.print(Text(f"regression: {clean_text(msg, 300)}", style="bold red"))


def fmt_figure(name: object, value: object) -> str:
    """A compare figure with its unit: times for ``*_ns``, plain numbers otherwise."""
    if value is None:
        return "-"
    if str(name).endswith("_ns"):
        return fmt_ns(value)  # type: ignore[arg-type]
    return f"{value:g}" if isinstance(value, (int, float)) else clean_text(value, 40)

