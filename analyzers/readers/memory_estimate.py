"""The peak memory a whole-trace diagnosis of a file would need, from facts known before reading it.

    est = estimate(Path("big.sqlite"))      # MemoryEstimate; est.peak_bytes

nsys exports: the rowid spans of the tables the reader scans (``max(rowid) - min(rowid) + 1``, each
answered from the b-tree's edge, O(1): no scan) times a measured cost per row, plus the interpreter
with its libraries. Kineto and probe traces (JSON, read as a stream): their text size (a gzip file's
from its trailer) times a measured cost per byte, plus the same base. Conservative by construction
(each coefficient is the largest measured, plus a margin).

Calibration (2026-12-02, 06:35-06:50 UTC, 2 cores shared, python 3.11; peak RSS of one whole
``srtscope diagnose --json`` process, wait4; ``python -m benchmarks.memory_budget`` prints it again):

- nsys exports of ``gen_nsys.py``, 309 MB / 1006 MB / 3010 MB (5.54 M / 17.84 M / 52.28 M rows
  scanned): 771 / 1676 / 4241 MiB filling the table cache (the default), 659 / 1577 / 4253 MiB with
  ``--no-cache``. The first rows cost the most (the analyses' tables per step and per name grow to
  their size): 118 B each up to 5.5 M rows, 82 B each after, on a base of 180 MiB (the interpreter,
  numpy, pandas, pyarrow): estimates 802 / 1764 / 4457 MiB, 1.04 / 1.05 / 1.05x the peaks;
- the 7 real nsys exports (a few MB each): 147-168 MiB, estimates 180-184 MiB (1.10-1.23x);
- a windowed read (``nsys_window.py``) holds the window's rows and the whole NVTX table: the same
  costs per row (3010 MB export, ``--memory-budget 2GiB``: window estimated 1.8 GiB, peak 1724 MiB);
- Kineto JSON: ``gen_kineto.py`` with 400 k kernels (263 MiB of JSON, 26 MB gzip): 727 MiB, 2.25
  bytes per byte of JSON over a base of ~136 MiB; the 7 real Kineto traces (up to 35 MB of JSON):
  136-166 MiB. 150 MiB + 2.5 bytes per byte: 808 MiB (1.11x) on the large one, 1.1-1.5x on the
  small ones (where the base is all there is).
- Kineto JSON read in batches (2026-12-07, ``benchmarks/kineto_floor.py``): 323 / 1341 / 1393 MiB for
  267 MB / 1.83 GB / 1.87 GB of JSON with Python stacks, ~0.7 bytes per byte over the base; the
  coefficient is left at 2.5 (conservative) until kernel-heavy traces are measured again.
  NOTE: a gzip file's text size is its trailer's modulo 4 GiB: a 20 M-event trace of ~5.4 GB reads
  as 1.1 GB.
"""
from __future__ import annotations

import os
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path

from srtscope.analyzers.model.timeline import SourceFormat

MiB = 1 << 20
#: the process with its libraries and the analyses' fixed tables (bytes)
BASE_BYTES = 180 * MiB
#: nsys: bytes per scanned row for the first ``NSYS_SMALL_ROWS`` rows, and per row after them
NSYS_ROW_BYTES = 118
NSYS_BULK_ROW_BYTES = 82
NSYS_SMALL_ROWS = 5_500_000
#: Kineto / probe JSON: the process reading it (bytes), and bytes per byte of JSON text
JSON_BASE_BYTES = 150 * MiB
JSON_BYTE_BYTES = 2.5
#: the device and host tables a whole read holds (NVTX apart: a windowed read holds it whole)
WINDOWED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                   "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API")
NVTX_TABLE = "NVTX_EVENTS"


@dataclass(frozen=True)
class MemoryEstimate:
    """A file's estimated peak (bytes) for a whole diagnosis. nsys: ``rows`` per scanned table
    (rowid spans); a windowed read's peak is ``nsys_peak(nvtx rows + rows in the window)``."""

    path: str
    format: SourceFormat
    peak_bytes: int
    rows: dict[str, int]

    @property
    def windowable(self) -> bool:
        """Only nsys exports can be read by time window (their tables are scanned in SQL)."""
        return self.format is SourceFormat.NSYS_SQLITE

    @property
    def nvtx_rows(self) -> int:
        return self.rows.get(NVTX_TABLE, 0)

    @property
    def windowed_rows(self) -> int:
        """Rows of the tables a windowed read cuts to its window."""
        return sum(self.rows.get(t, 0) for t in WINDOWED_TABLES)


def nsys_peak(rows: float) -> int:
    """Peak bytes of a diagnosis that holds ``rows`` rows of an nsys export."""
    rows = max(0.0, rows)
    small = min(rows, NSYS_SMALL_ROWS)
    return int(BASE_BYTES + small * NSYS_ROW_BYTES + (rows - small) * NSYS_BULK_ROW_BYTES)


def nsys_rows_within(budget_bytes: int) -> int:
    """The most rows ``nsys_peak`` allows within ``budget_bytes`` (0 when not even the base fits)."""
    left = budget_bytes - BASE_BYTES
    if left <= 0:
        return 0
    if left <= NSYS_SMALL_ROWS * NSYS_ROW_BYTES:
        return int(left // NSYS_ROW_BYTES)
    return int(NSYS_SMALL_ROWS + (left - NSYS_SMALL_ROWS * NSYS_ROW_BYTES) // NSYS_BULK_ROW_BYTES)


def table_rows(path: Path) -> dict[str, int]:
    """Rowid span of each scanned table of an nsys export (O(1) each); absent tables left out."""
    from srtscope.analyzers.readers.columnar import rowid_bounds
    from srtscope.analyzers.readers.nsys_tables import connect_readonly

    con = connect_readonly(path)
    try:
        have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out: dict[str, int] = {}
        for t in (*WINDOWED_TABLES, NVTX_TABLE):
            if t in have:
                lo, hi = rowid_bounds(con, t)
                out[t] = 0 if lo is None or hi is None else max(0, hi - lo + 1)
        return out
    finally:
        con.close()


#: the most a trace's JSON compresses: a gzip file smaller than 2^32 / this cannot have wrapped the
#: uncompressed size its trailer holds (the trailer is that size modulo 2^32)
MAX_GZIP_RATIO = 64
#: compressed bytes inflated to measure a large gzip's ratio (~10 MB of text, ~10 ms)
RATIO_SAMPLE_BYTES = 1 << 20


def json_text_bytes(path: Path) -> int:
    """Bytes of JSON text in a trace file: its size, or for gzip the uncompressed size from the
    trailer (ISIZE, modulo 2^32), unwrapped (``unwrap_isize``) by the ratio of its first
    ``RATIO_SAMPLE_BYTES`` where the file is large enough to have wrapped it. NOTE: a gzip of several
    members (a probe stream appends one a flush) has only its last member's size in the trailer: a
    trailer under the file's size that cannot have wrapped is such a stream, sized by its ratio."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
        can_wrap = size * MAX_GZIP_RATIO > 1 << 32
        ratio = None
        if can_wrap or isize < size:
            fh.seek(0)
            head = fh.read(RATIO_SAMPLE_BYTES)
            ratio = _inflate_ratio(head, whole=len(head) == size)
    if isize < size and not can_wrap:
        return max(size, int(size * ratio)) if ratio else size
    return unwrap_isize(isize, size, ratio)


def unwrap_isize(isize: int, size: int, ratio: float | None) -> int:
    """The uncompressed size of a gzip file of ``size`` bytes whose trailer says ``isize`` (modulo
    2^32): at least ``size``, and with ``ratio`` (text bytes a compressed byte, sampled) the
    candidate ``isize + k * 2^32`` nearest ``size * ratio``."""
    while isize < size:
        isize += 1 << 32
    if ratio is not None and ratio > 0:
        k = round((size * ratio - isize) / (1 << 32))
        isize += max(0, k) << 32
    return isize


def _inflate_ratio(head: bytes, whole: bool = False) -> float | None:
    """Text bytes a compressed byte over the start of a gzip stream, across its members (None: too
    little to tell, unless ``head`` is the ``whole`` file)."""
    text = used = 0
    data = head
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text += len(d.decompress(data))
        except zlib.error:
            break
        used += len(data) - len(d.unconsumed_tail) - len(d.unused_data)
        if not d.eof:
            break
        data = d.unused_data
    return text / used if used >= 1 << 16 or (whole and used == len(head) and used) else None


def estimate(path: Path, fmt: SourceFormat) -> MemoryEstimate:
    """The peak memory a whole diagnosis of ``path`` (of format ``fmt``) would need. OSError or
    sqlite3.Error when the file cannot be looked at (the read then says why)."""
    if fmt is SourceFormat.NSYS_SQLITE:
        rows = table_rows(path)
        return MemoryEstimate(str(path), fmt, nsys_peak(sum(rows.values())), rows)
    return MemoryEstimate(str(path), fmt, int(JSON_BASE_BYTES + JSON_BYTE_BYTES * json_text_bytes(path)), {})


def estimate_quiet(path: Path, fmt: SourceFormat) -> MemoryEstimate | None:
    """``estimate``, or None when the file cannot be looked at (the read reports why)."""
    try:
        return estimate(path, fmt)
    except (OSError, sqlite3.Error, ValueError):
        return None
