"""srtscope probe traces (format ``srtscope-probe`` v1, see ``probes/export.py``) -> Timeline.

Spans -> ranges (domain ``srtscope``, attrs kept). The worker's forward spans (``run.eager``,
``run.graph_replay``, ``comm.all_reduce``) are ALSO device rows of kind ``cpu_forward``: on a CPU
run they are the closest thing to device activity (warning ``cpu_stand_in``). Counters -> counters.
A probe stream (a process's periodic flushes, ``probes/export.py``) is its chunks merged; one that
lacks its exit flush (the process was killed) is read with warning ``ended_early``.
Read element by element (``jsonstream.iter_objects``), bounded whatever the inflated size: at most
``MAX_PROBE_ROWS`` spans or counters, ``MAX_PROBE_CHARS`` characters, ``MAX_PROBE_VALUE`` per value.
"""
from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import SourceFormat, Timeline, TimelineMeta, Traced, WarningCode
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.jsonstream import CutStreamError, JsonStreamError, iter_objects
from srtscope.analyzers.readers.stand_in import forward_stand_ins, note_stand_ins
from srtscope.probes.export import FORMAT, VERSION, merge_probe_documents, stream_note
from srtscope.probes.stages import DOMAIN

MAX_PROBE_ROWS = 1_000_000       # spans (or counters): a run records about six per engine step
MAX_PROBE_CHARS = 256 << 20      # the whole document, inflated (~70 characters per span)
MAX_PROBE_VALUE = 1 << 20        # one value: a name, a span's attrs, the meta object


class _UntilCut(io.RawIOBase):
    """A gzip file read up to where its data is cut or damaged, then a clean end of file (the
    error kept in ``cut``): what was read before a cut member is not lost with it."""

    def __init__(self, gz: gzip.GzipFile) -> None:
        self.gz = gz
        self.cut: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.cut is not None:
            return 0
        try:
            data = self.gz.read1(len(b))
        except (EOFError, OSError, zlib.error) as exc:
            self.cut = exc
            return 0
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.gz.close()
        super().close()


def _check(doc: Any, path: Path) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(path, f"not a {FORMAT} trace")
    if doc.get("version") != VERSION:
        raise TraceError(path, f"{FORMAT} version {doc.get('version')!r} is not supported "
                               f"(this reader knows version {VERSION})")
    return doc


def _load(path: Path) -> tuple[dict[str, Any], str]:
    """The document, and for a probe stream that did not end with its process's exit flush (see
    ``probes/export.py``) the one line saying so ("" otherwise). A stream's chunks are merged; a
    last chunk cut by a kill is dropped; damage before it, or in a plain document, is refused."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    raw: _UntilCut | io.BufferedReader = _UntilCut(gzip.open(path, "rb")) if gz else open(path, "rb")
    buffered = io.BufferedReader(raw) if isinstance(raw, _UntilCut) else raw
    docs: list[dict[str, Any]] = []
    cut = ""
    with io.TextIOWrapper(buffered, encoding="utf-8", errors="strict") as fh:
        try:
            for doc in iter_objects(fh, MAX_PROBE_ROWS, MAX_PROBE_CHARS, max_value=MAX_PROBE_VALUE):
                docs.append(_check(doc, path))
                if "chunk" not in docs[0] and len(docs) > 1:
                    raise JsonStreamError("trailing data after the top-level object")
        except JsonStreamError as exc:
            gz_cut = raw.cut if isinstance(raw, _UntilCut) else None
            if not docs or "chunk" not in docs[0] or not isinstance(exc, CutStreamError):
                if gz_cut is not None:
                    raise gz_cut from None         # a plain document cut: as any truncated file
                raise TraceError(path, f"not a valid {FORMAT} trace: {exc}") from None
            cut = str(gz_cut or exc)
        if isinstance(raw, _UntilCut) and raw.cut is not None and not cut:
            if not docs or "chunk" not in docs[0]:
                raise raw.cut
            cut = str(raw.cut)
    if not docs:
        raise TraceError(path, f"not a valid {FORMAT} trace: empty")
    if len(docs) == 1 and "chunk" not in docs[0]:
        return docs[0], ""
    doc = merge_probe_documents(docs) if len(docs) > 1 else docs[0]
    if sum(len(d["spans"].get("name", [])) for d in docs) > MAX_PROBE_ROWS:
        raise TraceError(path, f"{FORMAT} trace of over {MAX_PROBE_ROWS:,} spans, more than srtscope reads from "
                               "one (about six an engine step): capture a shorter run")
    note = stream_note(docs[0].get("meta", {}).get("pid", "?"), bool(docs[-1].get("final")), cut)
    return doc, note + (f" ({len(docs)} chunks kept)" if note else "")


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
    doc, ended = _load(path)
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
    merged_notes = meta_in.get("ended_early")        # a merged trace: its processes' own notes
    if isinstance(merged_notes, list) and merged_notes:
        ended = "; ".join([ended] * bool(ended) + [str(n) for n in merged_notes])
    if ended:
        meta.warn(WarningCode.ENDED_EARLY, ended)
    return Timeline.build(meta, device=device, ranges=ranges, counters=counters_df)
