"""``diagnose --perfetto``: a Chrome-trace JSON (ui.perfetto.dev opens it) with every bubble as a
slice named after its dominant class — Perfetto colours slices by name, so each class keeps one
colour — plus the engine steps and, on request, the device activity itself.

Times (``ts``) are the source trace's own µs, so the file overlays the original capture opened beside
it: Kineto's ``ts`` (the Timeline's ns less the file's ``baseTimeNanoseconds``, per rank), nsys's ns
from the session's start / 1000, a probe trace's ``start_ns`` / 1000 (its ``chrome.rank*.json``).
``otherData.clock_offsets_ns`` gives, per rank, what was taken off: Timeline ns = ts x 1000 + offset.
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


def clock_offsets(timeline: Any) -> dict[int, int]:
    """Per rank, the ns to take off Timeline times to get back the source's own clock: a Kineto
    file's ``baseTimeNanoseconds``; 0 for nsys and probe traces (and without a Timeline)."""
    if timeline is None:
        return {}
    meta = timeline.meta
    if str(getattr(meta.format, "value", meta.format)) != "kineto":
        return {int(r): 0 for r in meta.ranks}
    common = int(meta.extra.get("kineto.base_time_ns") or 0)
    return {int(r): int(meta.extra.get(f"kineto.base_time_ns.rank{r}", common) or 0) for r in meta.ranks}


def perfetto_events(diag: Any, timeline: Any = None, kernels: bool = True,
                    offsets: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Bubbles and steps (and, with ``timeline`` and ``kernels``, its device activity) as trace
    events on the source's own clock (``offsets``: per rank, ns taken off; default ``clock_offsets``)."""
    bubbles = diag.bubbles.table
    steps = diag.steps.table
    offsets = clock_offsets(timeline) if offsets is None else offsets

    def us(rank: int, ns: int) -> float:
        return (int(ns) - offsets.get(int(rank), 0)) / 1e3

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
                           "ts": us(pid, row.start_ns), "dur": int(row.dur_ns) / 1e3,
                           "args": args})
    for row in steps.itertuples(index=False) if len(steps) else ():
        pid, tid = int(row.rank), 1
        if (pid, tid) not in named:
            named.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": "engine steps"}})
        label = " ".join(x for x in ("step", str(row.mode or ""), str(row.exec or "")) if x)
        events.append({"ph": "X", "name": label, "cat": "step",
                       "pid": pid, "tid": tid, "ts": us(pid, row.start_ns),
                       "dur": int(row.wall_ns) / 1e3,
                       "args": {"step": int(row.step), "bs": int(row.bs) if row.bs == row.bs else -1,
                                "reason": str(row.reason or "")}})
    if timeline is not None and kernels:
        events += device_events(timeline, us, named)
    for pid in sorted({e["pid"] for e in events}):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"srtscope rank {pid}"}})
    return events


def device_events(timeline: Any, us: Any, named: set[tuple[int, int]]) -> list[dict[str, Any]]:
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
                    "ts": us(int(rank), s), "dur": (int(e) - int(s)) / 1e3})
    return out


def perfetto_doc(diag: Any, timeline: Any = None, kernels: bool = True) -> dict[str, Any]:
    """The whole Chrome-trace document. ``timeline``: the source's clock (Kineto's base time) and,
    with ``kernels``, its device activity."""
    offsets = clock_offsets(timeline)
    common = set(offsets.values())
    return {"traceEvents": perfetto_events(diag, timeline, kernels, offsets), "displayTimeUnit": "ns",
            "otherData": {"producer": "srtscope diagnose",
                          "clock_offset_ns": common.pop() if len(common) == 1 else 0,
                          "clock_offsets_ns": {str(r): o for r, o in sorted(offsets.items())},
                          "clock": "the source trace's own µs (Timeline ns = ts x 1000 + clock_offsets_ns "
                                   "of the event's rank, the pid)",
                          "verdict": diag.verdict.bottleneck, "cause": diag.verdict.cause}}


def write_perfetto(diag: Any, path: Path, timeline: Any = None, kernels: bool = True) -> Path:
    """Write through ``cli.output`` (regular files only, atomic, the user's umask)."""
    return write_json(Path(path), perfetto_doc(diag, timeline, kernels), indent=None)
