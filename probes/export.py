"""Exporters: the versioned probe-trace format (one file per rank) and Chrome trace JSON.

Probe trace, format ``srtscope-probe`` version 1 — a JSON object (gzip when the path ends ``.gz``):

    {"format": "srtscope-probe", "version": 1,
     "meta":    {host, pid, rank, world_size, clock, wall_offset_ns, device, engine_config, ...},
     "strings": [name, ...],                         # span / counter names, interned
     "spans":   {"name": [str idx], "start_ns": [int], "end_ns": [int], "tid": [int],
                 "depth": [int], "attrs": [object | null]},
     "counters": {"name": [str idx], "t_ns": [int], "value": [float], "device": [int]}}

Columns are parallel arrays; times are integer nanoseconds on the recorder's clock. Writing is
atomic (temp file in the same folder, fsync, rename), so a crash leaves the last complete flush.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from srtscope.probes.recorder import Recorder

FORMAT = "srtscope-probe"
VERSION = 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        try:
            return value.item()
        except Exception:
            pass
    return str(value)


def probe_document(recorder: Recorder) -> dict[str, Any]:
    """The probe-trace document for everything the recorder holds now."""
    strings: list[str] = []
    index: dict[str, int] = {}

    def intern(s: str) -> int:
        i = index.get(s)
        if i is None:
            i = index[s] = len(strings)
            strings.append(s)
        return i

    raw = sorted(recorder.raw_spans(), key=lambda r: (r[1], r[4]))
    spans = {"name": [intern(r[0]) for r in raw], "start_ns": [r[1] for r in raw],
             "end_ns": [r[2] for r in raw], "tid": [r[3] for r in raw],
             "depth": [r[4] for r in raw], "attrs": [_jsonable(r[5]) if r[5] else None for r in raw]}
    rc = sorted(recorder.raw_counters(), key=lambda r: r[1])
    counters = {"name": [intern(r[0]) for r in rc], "t_ns": [r[1] for r in rc],
                "value": [r[2] for r in rc], "device": [r[3] for r in rc]}
    return {"format": FORMAT, "version": VERSION, "meta": _jsonable(recorder.metadata()),
            "strings": strings, "spans": spans, "counters": counters}


def merge_probe_documents(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One probe document of several processes of one host (one clock: CLOCK_MONOTONIC is
    system-wide, thread ids unique): spans and counters concatenated in time order, names
    re-interned; the first document's meta, with ``pids`` listing every process. For an engine
    whose scheduler and model runner live in different processes (a server's engine core and its
    workers): together they are one rank's steps."""
    strings: list[str] = []
    index: dict[str, int] = {}
    span_rows: list[tuple] = []
    counter_rows: list[tuple] = []
    for d in docs:
        names = [index.setdefault(n, len(index)) for n in d["strings"]]
        sp, co = d["spans"], d["counters"]
        span_rows += zip((names[i] for i in sp["name"]), sp["start_ns"], sp["end_ns"], sp["tid"],
                         sp["depth"], sp["attrs"])
        counter_rows += zip((names[i] for i in co["name"]), co["t_ns"], co["value"], co["device"])
    strings[:] = list(index)
    span_rows.sort(key=lambda r: (r[1], r[4]))
    counter_rows.sort(key=lambda r: r[1])
    spans = dict(zip(("name", "start_ns", "end_ns", "tid", "depth", "attrs"),
                     (list(c) for c in zip(*span_rows)) if span_rows else ([] for _ in range(6))))
    counters = dict(zip(("name", "t_ns", "value", "device"),
                        (list(c) for c in zip(*counter_rows)) if counter_rows else ([] for _ in range(4))))
    meta = dict(docs[0]["meta"]) if docs else {}
    meta["pids"] = [d["meta"].get("pid") for d in docs]
    return {"format": FORMAT, "version": VERSION, "meta": meta, "strings": strings, "spans": spans,
            "counters": counters}


def chrome_document(recorder: Recorder) -> dict[str, Any]:
    """Chrome trace JSON (Perfetto opens it): ``ph: "X"`` spans and ``ph: "C"`` counters, µs times."""
    pid = recorder.pid
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"srtscope rank {recorder.rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": recorder.rank}},
    ]
    for rec in recorder.spans():
        ev: dict[str, Any] = {"ph": "X", "name": rec.name, "cat": "srtscope", "pid": pid,
                              "tid": rec.tid, "ts": rec.start_ns / 1000.0,
                              "dur": rec.dur_ns / 1000.0}
        if rec.attrs:
            ev["args"] = _jsonable(rec.attrs)
        events.append(ev)
    for c in recorder.counters():
        events.append({"ph": "C", "name": f"{c.name}[gpu{c.device}]", "pid": pid, "tid": 0,
                       "ts": c.t_ns / 1000.0, "args": {"value": c.value}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"producer": "srtscope", "rank": recorder.rank}}


def atomic_write_json(path: str | os.PathLike, document: Any) -> Path:
    """Write JSON (gzip if ``.gz``) to a temp file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        data = json.dumps(document, separators=(",", ":")).encode()
        if path.name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=5)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_probe_trace(recorder: Recorder, path: str | os.PathLike) -> Path:
    return atomic_write_json(path, probe_document(recorder))


def write_chrome_trace(recorder: Recorder, path: str | os.PathLike) -> Path:
    return atomic_write_json(path, chrome_document(recorder))


def probe_trace_name(rank: int, stem: str = "probe") -> str:
    """The conventional per-rank file name: ``probe.rank0.json``."""
    return f"{stem}.rank{rank}.json"


class AutoFlusher:
    """Flushes a recorder's probe trace every ``interval_s`` from a daemon thread."""

    def __init__(self, recorder: Recorder, path: str | os.PathLike, interval_s: float = 2.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.recorder, self.path, self.interval_s = recorder, Path(path), interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="srtscope-flush", daemon=True)

    def start(self) -> AutoFlusher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            write_probe_trace(self.recorder, self.path)

    def stop(self, final_flush: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if final_flush:
            write_probe_trace(self.recorder, self.path)
