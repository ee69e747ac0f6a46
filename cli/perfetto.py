"""``diagnose --perfetto``: a Chrome-trace JSON (ui.perfetto.dev opens it) with every bubble as a
slice named after its dominant class — Perfetto colours slices by name, so each class keeps one
colour — plus the engine steps and, on request, the device activity itself.

Times are µs on the source trace's own clock, so the file overlays the original capture. Where that
clock's ns values are too large to stay exact as float µs (epoch-based Kineto clocks), whole seconds
are taken off and stated in ``otherData.clock_offset_ns``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from srtscope.analyzers.results import BUBBLE_CLASSES
from srtscope.analyzers.units import clean_text
from srtscope.cli.output import write_json

# legacy trace-viewer colour names, for viewers that honour ``cname``
_CNAME = {"scheduler": "terrible", "prep": "bad", "kernel": "good", "sync": "yellow",
          "launch": "olive", "unattributed": "grey", "host": "black", "queued": "thread_state_runnable"}


#: a float keeps integers up to 2**53 exactly: ns values below it survive ns / 1000 -> µs -> ns
EXACT_NS = 2 ** 53


def clock_offset(diag: Any) -> int:
    """ns taken off every time: 0 when the source clock stays exact, else whole seconds."""
    starts = [int(t["start_ns"].min()) for t in (diag.bubbles.table, diag.steps.table) if len(t)]
    lo = min(starts) if starts else 0
    return 0 if abs(lo) < EXACT_NS else (lo // 1_000_000_000) * 1_000_000_000


def perfetto_events(diag: Any, timeline: Any = None, t0: int | None = None) -> list[dict[str, Any]]:
    """Bubbles and steps (and, with ``timeline``, its device activity) as trace events."""
    bubbles = diag.bubbles.table
    steps = diag.steps.table
    t0 = clock_offset(diag) if t0 is None else t0
    events: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    if len(bubbles):
        parts = np.stack([bubbles[f"{c}_ns"].to_numpy() for c in BUBBLE_CLASSES], axis=1)
        top = parts.argmax(axis=1)
        for i, row in enumerate(bubbles.itertuples(index=False)):
            pid, tid = int(row.rank), 1_000 + int(row.device)
            if (pid, tid) not in named:
                named.add((pid, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"bubbles gpu{int(row.device)}"}})
            cause = BUBBLE_CLASSES[int(top[i])]
            args: dict[str, Any] = {f"{c}_us": round(float(parts[i, j]) / 1e3, 3)
                    for j, c in enumerate(BUBBLE_CLASSES) if parts[i, j]}
            args["top_stage"] = clean_text(row.top_stage or "", 200)
            events.append({"ph": "X", "name": f"bubble: {cause}", "cat": "bubble",
                           "cname": _CNAME[cause], "pid": pid, "tid": tid,
                           "ts": (int(row.start_ns) - t0) / 1e3, "dur": int(row.dur_ns) / 1e3,
                           "args": args})
    for row in steps.itertuples(index=False) if len(steps) else ():
        pid, tid = int(row.rank), 1
        if (pid, tid) not in named:
            named.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": "engine steps"}})
        label = " ".join(x for x in ("step", str(row.mode or ""), str(row.exec or "")) if x)
        events.append({"ph": "X", "name": label, "cat": "step",
                       "pid": pid, "tid": tid, "ts": (int(row.start_ns) - t0) / 1e3,
                       "dur": int(row.wall_ns) / 1e3,
                       "args": {"step": int(row.step), "bs": int(row.bs) if row.bs == row.bs else -1,
                                "reason": str(row.reason or "")}})
    if timeline is not None:
        events += device_events(timeline, t0, named)
    for pid in sorted({e["pid"] for e in events}):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"srtscope rank {pid}"}})
    return events


def device_events(timeline: Any, t0: int, named: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """Every device activity (kernel, copy, memset) as a slice on its device's stream track."""
    dev = timeline.device
    out: list[dict[str, Any]] = []
    if len(dev) == 0:
        return out
    cols = zip(dev["rank"].to_numpy(), dev["device"].to_numpy(), dev["stream"].to_numpy(),
               dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy(), dev["kind"].astype(str).to_numpy(),
               dev["name"].astype(str).to_numpy())
    for rank, device, stream, s, e, kind, name in cols:
        pid, tid = int(rank), 10_000 + int(device) * 1_000 + max(int(stream), 0) % 1_000
        if (pid, tid) not in named:
            named.add((pid, tid))
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": f"gpu{int(device)} stream {int(stream)}"}})
        out.append({"ph": "X", "name": clean_text(name, 200), "cat": str(kind), "pid": pid, "tid": tid,
                    "ts": (int(s) - t0) / 1e3, "dur": (int(e) - int(s)) / 1e3})
    return out


def perfetto_doc(diag: Any, timeline: Any = None) -> dict[str, Any]:
    """The whole Chrome-trace document. ``timeline``: also its device activity."""
    t0 = clock_offset(diag)
    return {"traceEvents": perfetto_events(diag, timeline, t0), "displayTimeUnit": "ns",
            "otherData": {"producer": "srtscope diagnose", "clock_offset_ns": t0,
                          "clock": "the source trace's own (ts + clock_offset_ns / 1000 = source µs)",
                          "verdict": diag.verdict.bottleneck, "cause": diag.verdict.cause}}


def write_perfetto(diag: Any, path: Path, timeline: Any = None) -> Path:
    """Write through ``cli.output`` (regular files only, atomic, the user's umask)."""
    return write_json(Path(path), perfetto_doc(diag, timeline), indent=None)
