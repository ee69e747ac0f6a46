"""``diagnose --perfetto``: a Chrome-trace JSON (ui.perfetto.dev opens it) with every bubble as a
slice named after its dominant cause — Perfetto colours slices by name, so each cause keeps one
colour — plus the engine steps. Times are µs relative to the first event.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from srtscope.analyzers.results import BUBBLE_CLASSES

# legacy trace-viewer colour names, for viewers that honour ``cname``
_CNAME = {"scheduler": "terrible", "prep": "bad", "kernel": "good", "sync": "yellow",
          "launch": "olive", "unattributed": "grey"}


def perfetto_events(diag: Any) -> list[dict[str, Any]]:
    bubbles = diag.bubbles.table
    steps = diag.steps.table
    starts = [int(bubbles["start_ns"].min())] if len(bubbles) else []
    if len(steps):
        starts.append(int(steps["start_ns"].min()))
    t0 = min(starts) if starts else 0
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
            args["top_stage"] = str(row.top_stage or "")
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
        events.append({"ph": "X", "name": f"step {row.mode} {row.exec}", "cat": "step",
                       "pid": pid, "tid": tid, "ts": (int(row.start_ns) - t0) / 1e3,
                       "dur": int(row.wall_ns) / 1e3,
                       "args": {"step": int(row.step), "bs": int(row.bs) if row.bs == row.bs else -1,
                                "reason": str(row.reason or "")}})
    for pid in sorted({e["pid"] for e in events}):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"srtscope rank {pid}"}})
    return events


def write_perfetto(diag: Any, path: Path) -> Path:
    """Write atomically (temp file + rename)."""
    doc = {"traceEvents": perfetto_events(diag), "displayTimeUnit": "ns",
           "otherData": {"producer": "srtscope diagnose",
                         "verdict": diag.verdict.bottleneck}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)
    return path
