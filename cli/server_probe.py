"""``srtscope capture --server URL --probe NAME``: the probe traces of a server started under
``srtscope capture --backend probe --instrument ENGINE -o NAME -- <server command>``, cut to the
time the server was profiled.

Such a server's every Python process (vLLM: the API server, the engine core where the scheduler
runs, the workers where the model runs) appends to ``NAME.pid<PID>.json.gz`` every 0.2 s
(``probes.capture_boot``, ``SRTSCOPE_PROBE_FLUSH_S``). Here: the files of the processes alive
during the capture (written at or after its start) are awaited until each holds the capture's end
(written after it), their probe streams read back (``probes.export.read_probe_stream``),
merged on the host's one clock, and their spans cut to [start, end] of the
capture (wall-clock ns, converted with each trace's ``wall_offset_ns``), into one trace
``NAME.server<EPOCH_S>.json.gz`` that ``diagnose`` reads: the scheduler's process and the model
runner's together, as a server's steps need.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srtscope.cli.output import file_mode
from srtscope.probes.capture_boot import flush_interval, process_trace_path
from srtscope.probes.export import atomic_write_json, merge_probe_documents, read_probe_stream

SETTLE_S = 0.5
#: a trace written this long before the capture's start is a live process's (a live one appends or
#: touches its trace every flush interval, 0.2 s by default; this leaves room for a loaded machine)
LIVE_S = 15.0


class ProbeError(Exception):
    """A one-line reason the server's probe traces could not be used."""


def probe_files(name: Path) -> list[Path]:
    """The per-process probe traces of capture ``name`` (``NAME.pid<N>.json.gz``)."""
    pattern = process_trace_path(name, 0).name.replace(".pid0.", ".pid*.", 1)
    return sorted(name.parent.glob(pattern))


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def await_flush(name: Path, start_s: float, end_s: float, deadline: float,
                sleep: Callable[[float], None] = time.sleep, interval_s: float | None = None) -> list[Path]:
    """The traces of ``name`` written at most ``LIVE_S`` before ``start_s`` (processes alive then),
    once each was written after ``end_s`` (epoch s) and one flush interval (``interval_s``, default
    this environment's ``SRTSCOPE_PROBE_FLUSH_S``, 0.2 s) and a second have passed since ``end_s``: a
    process whose first instrumented call came during the capture has written its first trace by
    then. ProbeError when there are none, or past ``deadline`` (a monotonic time) with the ones not
    flushed named."""
    settled_at = end_s + (flush_interval() if interval_s is None else interval_s) + 1.0
    while True:
        # NOTE: a live process wrote within its flush interval before the start (or will by the end)
        live = [p for p in probe_files(name) if _mtime(p) >= start_s - LIVE_S]
        late = [p for p in live if _mtime(p) <= end_s]
        if live and not late and time.time() >= settled_at:
            sleep(SETTLE_S)            # NOTE: a write is atomic (a rename), but let it land
            return live
        if time.monotonic() >= deadline:
            if not live:
                raise ProbeError(f"--probe {name}: no {process_trace_path(name, 0).name.replace('.pid0.', '.pid*.')} "
                                 f"written during the capture: start the server under srtscope capture --backend "
                                 f"probe --instrument ENGINE -o {name} -- ...")
            raise ProbeError(f"--probe {name}: {len(late)} of the {len(live)} process traces were not written "
                             f"again after the capture's end within the deadline ({late[0].name} and on); "
                             f"its processes write every SRTSCOPE_PROBE_FLUSH_S (0.2) s")
        sleep(SETTLE_S)


def cut(doc: dict[str, Any], lo_wall_ns: int, hi_wall_ns: int) -> dict[str, Any]:
    """``doc``'s spans that lie inside [lo, hi] (wall-clock ns; the trace's own clock is
    wall - ``meta.wall_offset_ns``) and its counters inside it."""
    off = int(doc.get("meta", {}).get("wall_offset_ns", 0))
    lo, hi = lo_wall_ns - off, hi_wall_ns - off
    sp, co = doc["spans"], doc["counters"]
    keep = [i for i, (s, e) in enumerate(zip(sp["start_ns"], sp["end_ns"])) if s >= lo and e <= hi]
    keep_c = [i for i, t in enumerate(co["t_ns"]) if lo <= t <= hi]
    return {**doc, "spans": {k: [v[i] for i in keep] for k, v in sp.items()},
            "counters": {k: [v[i] for i in keep_c] for k, v in co.items()}}


def server_probe_trace(name: Path, start_s: float, end_s: float, deadline: float,
                       sleep: Callable[[float], None] = time.sleep) -> tuple[Path, int, int]:
    """The capture window's probe trace of a server started under ``-o name``: (its path, the
    processes in it, the spans in it). ProbeError (one line) when it cannot be made."""
    files = await_flush(name, start_s, end_s, deadline, sleep)
    docs = []
    for p in files:
        try:
            # NOTE: a live process's stream: its chunks up to now, a write in progress dropped
            doc = read_probe_stream(p).doc
            docs.append(cut(doc, int(start_s * 1e9), int(end_s * 1e9)))
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            raise ProbeError(f"--probe {name}: {p.name} unreadable: {type(exc).__name__}: {exc}") from None
    docs = [d for d in docs if d["spans"]["start_ns"]]
    if not docs:
        raise ProbeError(f"--probe {name}: the server's processes recorded no instrumented call while it "
                         f"was profiled (was the load sent to this server?)")
    merged = merge_probe_documents(docs)
    out = name.with_name(f"{process_trace_path(name, 0).name.split('.pid0.')[0]}.server{int(end_s)}.json.gz")
    atomic_write_json(out, merged)
    try:
        os.chmod(out, file_mode())       # as every output: the umask's mode, not mkstemp's 0600
    except OSError:
        pass
    return out, len(docs), len(merged["spans"]["start_ns"])
