"""srtscope probe traces (format ``srtscope-probe`` v1, see ``probes/export.py``) -> Timeline.

Spans -> ranges (domain ``srtscope``, attrs kept). The worker's forward spans (``run.eager``,
``run.graph_replay``, ``comm.all_reduce``) are ALSO device rows of kind ``cpu_forward``: on a CPU
run they are the closest thing to device activity (warning ``cpu_stand_in``). Counters -> counters.
Read element by element (``jsonstream.load_columns``), bounded whatever the inflated size: at most
``MAX_PROBE_ROWS`` spans or counters, ``MAX_PROBE_CHARS`` characters, ``MAX_PROBE_VALUE`` per value.
"""
from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import SourceFormat, Timeline, TimelineMeta, Traced, WarningCode
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.jsonstream import JsonStreamError, load_columns
from srtscope.analyzers.readers.stand_in import forward_stand_ins, note_stand_ins
from srtscope.probes.export import FORMAT, VERSION
from srtscope.probes.stages import DOMAIN

MAX_PROBE_ROWS = 1_000_000       # spans (or counters): a run records about six per engine step
MAX_PROBE_CHARS = 256 << 20      # the whole document, inflated (~70 characters per span)
MAX_PROBE_VALUE = 1 << 20        # one value: a name, a span's attrs, the meta object


def _load(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    raw = gzip.open(path, "rb") if gz else open(path, "rb")
    with io.TextIOWrapper(raw, encoding="utf-8", errors="strict") as fh:
        try:
            doc = load_columns(fh, MAX_PROBE_ROWS, MAX_PROBE_CHARS, max_value=MAX_PROBE_VALUE)
        except JsonStreamError as exc:
            raise TraceError(path, f"not a valid {FORMAT} trace: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(path, f"not a {FORMAT} trace")
    if doc.get("version") != VERSION:
        raise TraceError(path, f"{FORMAT} version {doc.get('version')!r} is not supported "
                               f"(this reader knows version {VERSION})")
    return doc


def _column(table: dict, key: str, n: int, path: Path) -> list | np.ndarray:
    col = table.get(key)
    if n == 0 and col is None:
        return []
    if not isinstance(col, (list, np.ndarray)) or len(col) != n:
        raise TraceError(path, f"probe trace column {key!r} is missing or not {n} long")
    return col


def read_probe(path: str | Path, rank: int | None = None) -> Timeline:
    """Read one probe trace; its rank comes from ``meta.rank`` (else ``rank``, else 0)."""
    path = Path(path)
    doc = _load(path)
    meta_in = m_in if isinstance(m_in := doc.get("meta"), dict) else {}
    strings = doc.get("strings")
    spans = sp if isinstance(sp := doc.get("spans"), dict) else {}
    counters = cn if isinstance(cn := doc.get("counters"), dict) else {}
    if not isinstance(strings, list):
        raise TraceError(path, "probe trace without a strings table")
    file_rank = int(meta_in.get("rank", rank if rank is not None else 0))
    pid = int(meta_in.get("pid", -1))
    strs = np.asarray([str(s) for s in strings] + [""], dtype=object)

    n = len(spans.get("name", []))
    name_idx = np.asarray(_column(spans, "name", n, path), dtype=np.int64)
    if n and (name_idx.min() < 0 or name_idx.max() >= len(strings)):
        raise TraceError(path, "probe trace span names point outside the strings table")
    start = np.asarray(_column(spans, "start_ns", n, path), dtype=np.int64)
    end = np.asarray(_column(spans, "end_ns", n, path), dtype=np.int64)
    if (end < start).any():
        raise TraceError(path, f"{int((end < start).sum())} span(s) end before they start")
    names = strs[name_idx]
    attrs = np.empty(n, dtype=object)
    attrs[:] = [a if isinstance(a, dict) and a else None for a in _column(spans, "attrs", n, path)]
    ranges = pd.DataFrame({"start_ns": start, "end_ns": end, "pid": pid,
                           "tid": np.asarray(_column(spans, "tid", n, path), dtype=np.int64),
                           "name": pd.Categorical(names), "domain": DOMAIN, "attrs": attrs,
                           "depth": np.asarray(_column(spans, "depth", n, path), dtype=np.int64),
                           "rank": file_rank})
    device = forward_stand_ins(ranges, file_rank)

    m = len(counters.get("name", []))
    cidx = np.asarray(_column(counters, "name", m, path), dtype=np.int64)
    if m and (cidx.min() < 0 or cidx.max() >= len(strings)):
        raise TraceError(path, "probe trace counter names point outside the strings table")
    counters_df = pd.DataFrame({
        "t_ns": np.asarray(_column(counters, "t_ns", m, path), dtype=np.int64),
        "name": pd.Categorical(strs[cidx]),
        "value": np.asarray(_column(counters, "value", m, path), dtype=np.float64),
        "device": np.asarray(_column(counters, "device", m, path), dtype=np.int64),
        "rank": file_rank})

    if n + m == 0:
        raise TraceError(path, "probe trace holds no spans and no counters (empty trace)")
    meta = TimelineMeta(format=SourceFormat.PROBE, sources=[str(path)],
                        tool_version=f"{FORMAT} v{VERSION}", ranks=[file_rank],
                        world_size=int(meta_in.get("world_size", 1)))
    t_c = counters_df["t_ns"].to_numpy()
    meta.window_start_ns = int(min(a.min() for a in (start, t_c) if len(a)))
    meta.window_end_ns = int(max(a.max() for a in (end, t_c) if len(a)))
    meta.extra.update({"probe.meta": meta_in, "probe.clock": meta_in.get("clock", "")})
    if n:
        meta.traced.add(Traced.NVTX)
    if len(device):
        note_stand_ins(meta, device)
    else:
        meta.warn(WarningCode.NO_KERNELS, "no forward spans (run.eager / run.graph_replay)")
    if m:
        meta.traced.add(Traced.COUNTERS)
    meta.warn(WarningCode.NO_API, "probe traces record no CUDA API calls")
    return Timeline.build(meta, device=device, ranges=ranges, counters=counters_df)
