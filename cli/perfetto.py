"""``diagnose --perfetto``: a Chrome-trace JSON (ui.perfetto.dev opens it) with every bubble as a
slice named after its dominant class — Perfetto colours slices by name, so each class keeps one
colour — plus the engine steps and, on request, the device activity itself.

Times (``ts``) are the source trace's own µs, so the file overlays the original capture opened beside
it: Kineto's ``ts`` (the Timeline's ns less the file's ``baseTimeNanoseconds``, per rank), nsys's ns
from the session's start / 1000, a probe trace's ``start_ns`` / 1000 (its ``chrome.rank*.json``).
``otherData.clock_offsets_ns`` gives, per rank, what was taken off: Timeline ns = ts x 1000 + offset.

Device activity (``--perfetto-kernels``) is streamed into the file in batches, never held as one
list, and capped at ``MAX_DEVICE_EVENTS`` (the earliest ones; ``otherData.device_events`` says how
many were written of how many; ``device_counts`` gives the same for the CLI's note).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from srtscope.analyzers.model.results import BUBBLE_CLASSES
from srtscope.analyzers.model.units import clean_text
from srtscope.cli.output import OutputError, write_via

# legacy trace-viewer colour names, for viewers that honour ``cname``
_CNAME = {"scheduler": "terrible", "prep": "bad", "kernel": "good", "sync": "yellow",
          "launch": "olive", "unattributed": "grey", "host": "black", "queued": "thread_state_runnable"}

#: device activities written at most (about 100 bytes of JSON each: ~100 MB); the earliest are kept
MAX_DEVICE_EVENTS = 1_000_000
BATCH = 50_000

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
        events += device_events(timeline, named, offsets=offsets)
    for pid in sorted({e["pid"] for e in events}):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"srtscope rank {pid}"}})
    return events


def device_events(timeline: Any, named: set[tuple[int, int]], cap: int | None = None,
                  offsets: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Every device activity (kernel, copy, memset; the first ``cap``) as a slice on its device's
    stream track (a list: for small timelines and tests; the file is written by ``_device_json``)."""
    cap = MAX_DEVICE_EVENTS if cap is None else cap
    offsets = clock_offsets(timeline) if offsets is None else offsets
    return [json.loads(x) for chunk in _device_json(timeline, offsets, named, cap) for x in chunk]


def _device_json(timeline: Any, offsets: dict[int, int], named: set[tuple[int, int]],
                 cap: int) -> Iterator[list[str]]:
    """The device activities as JSON texts, ``BATCH`` rows at a time (track names first), on the
    source's clock (``offsets``: per rank, ns taken off)."""
    dev = timeline.device
    n = min(len(dev), cap)
    if n == 0:
        return
    rank, device, stream = (dev[c].to_numpy()[:n] for c in ("rank", "device", "stream"))
    start, end = dev["start_ns"].to_numpy()[:n], dev["end_ns"].to_numpy()[:n]
    kind_codes, kinds = _codes(dev["kind"], n)
    name_codes, names = _codes(dev["name"], n)
    kind_txt = [json.dumps(str(k)) for k in kinds]
    name_txt = [json.dumps(escape_name(x)) for x in names]
    tid = 10_000 + device.astype(np.int64) * 1_000 + np.maximum(stream.astype(np.int64), 0) % 1_000
    tracks = []
    for r, d, st, t in sorted({(int(a), int(b), int(c), int(e)) for a, b, c, e in
                               zip(rank.tolist(), device.tolist(), stream.tolist(), tid.tolist())}):
        if (r, t) not in named:
            named.add((r, t))
            tracks.append(json.dumps({"ph": "M", "name": "thread_name", "pid": r, "tid": t,
                                      "args": {"name": f"gpu{d} stream {st}"}}))
    yield tracks
    for lo in range(0, n, BATCH):
        hi = min(n, lo + BATCH)
        ranks = rank[lo:hi].tolist()
        yield [f'{{"ph":"X","name":{name_txt[nc]},"cat":{kind_txt[kc]},"pid":{r},"tid":{t},'
               f'"ts":{(s - offsets.get(r, 0)) / 1e3!r},"dur":{(e - s) / 1e3!r}}}'
               for nc, kc, r, t, s, e in zip(name_codes[lo:hi].tolist(), kind_codes[lo:hi].tolist(),
                                             ranks, tid[lo:hi].tolist(),
                                             start[lo:hi].tolist(), end[lo:hi].tolist())]


def _codes(col: Any, n: int) -> tuple[np.ndarray, list[Any]]:
    """(codes, distinct values) of the first ``n`` rows of a (categorical) column."""
    import pandas as pd

    cat = col.iloc[:n].array if isinstance(col.dtype, pd.CategoricalDtype) else pd.Categorical(col.iloc[:n])
    codes = np.asarray(cat.codes, dtype=np.int64)
    values = list(cat.categories) + [""]          # code -1 (a missing name): the empty name
    return np.where(codes < 0, len(values) - 1, codes), values


def escape_name(name: object) -> str:
    """A device activity's name as a Perfetto slice name (clean, at most 200 characters)."""
    return clean_text(name, 200)


def _other_data(diag: Any, offsets: dict[int, int]) -> dict[str, Any]:
    common = set(offsets.values())
    return {"producer": "srtscope diagnose",
            "clock_offset_ns": common.pop() if len(common) == 1 else 0,
            "clock_offsets_ns": {str(r): o for r, o in sorted(offsets.items())},
            "clock": "the source trace's own µs (Timeline ns = ts x 1000 + clock_offsets_ns "
                     "of the event's rank, the pid)",
            "verdict": diag.verdict.bottleneck, "cause": diag.verdict.cause}


def perfetto_doc(diag: Any, timeline: Any = None, kernels: bool = True) -> dict[str, Any]:
    """The whole Chrome-trace document in memory. ``timeline``: the source's clock (Kineto's base
    time) and, with ``kernels``, its device activity (capped)."""
    offsets = clock_offsets(timeline)
    return {"traceEvents": perfetto_events(diag, timeline, kernels, offsets), "displayTimeUnit": "ns",
            "otherData": _other_data(diag, offsets)}


def device_counts(timeline: Any, cap: int | None = None) -> tuple[int, int]:
    """(device activities ``write_perfetto`` writes of ``timeline``, of how many)."""
    total = len(timeline.device) if timeline is not None else 0
    return min(total, MAX_DEVICE_EVENTS if cap is None else cap), total


def write_perfetto(diag: Any, path: Path, timeline: Any = None, kernels: bool = True,
                   cap: int | None = None) -> Path:
    """Write through ``cli.output`` (regular files only, atomic, the user's umask); with ``kernels``
    the device activity is streamed in batches and capped (``device_counts``)."""
    cap = MAX_DEVICE_EVENTS if cap is None else cap
    offsets = clock_offsets(timeline)
    events = perfetto_events(diag, timeline, False, offsets)
    named = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    shown = timeline if kernels else None
    written, total = device_counts(shown, cap)
    other = _other_data(diag, offsets)
    if shown is not None:
        other["device_events"] = {"written": written, "total": total, "cap": cap}
    pids = {e["pid"] for e in events} | (set(np.unique(shown.device["rank"].to_numpy()[:cap]).tolist())
                                         if shown is not None and written else set())
    procs = [json.dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                         "args": {"name": f"srtscope rank {pid}"}}) for pid in sorted(pids)]
    base = [json.dumps(e, allow_nan=False) for e in events if not (e.get("ph") == "M" and
                                                                     e.get("name") == "process_name")]

    def produce(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
            fh.write('{"traceEvents":[')
            first = True
            chunks = _device_json(shown, offsets, named, cap) if shown is not None else iter(())
            for chunk in _chain(base, chunks, procs):
                if chunk:
                    fh.write(("" if first else ",") + ",".join(chunk))
                    first = False
            fh.write('],"displayTimeUnit":"ns","otherData":' + json.dumps(other, allow_nan=False) + "}\n")
            fh.flush()
            os.fsync(fh.fileno())

    try:
        return write_via(Path(path), produce)
    except ValueError as exc:
        if isinstance(exc, OutputError):
            raise
        raise OutputError(f"{path}: not written: {exc}") from None


def _chain(first: list[str], middle: Iterator[list[str]], last: list[str]) -> Iterator[list[str]]:
    yield first
    yield from middle
    yield last
