"""One table's rows spilled to disk in start-time buckets, read back in time order.

Rows come in any order, a chunk at a time (``add``); each chunk's rows go to the buckets their
start falls in, one segment per bucket touched, so memory holds one chunk. A bucket of more than
``bucket_rows`` rows is split at its median start, and one of too many segments merged (a bucket's
rows in memory at a time, as ``chunks`` holds them). ``chunks`` then reads the buckets in time
order, each sorted by (start, arrival order): the rows as a stable sort by start of everything
added, in pieces of at most ``bucket_rows`` rows (more only where more rows share one start).

NOTE: a bucket's segments hold its rows in arrival order (a chunk's rows keep their order, segments
are appended, a split or merge keeps the order): a stable sort by start within each bucket is the
stable sort of all rows, no sequence column needed.

On disk: one file per spool, the segments in it at page-aligned offsets, each its columns' bytes
one after another, written in one call, past the page cache where the file system allows
(``spill_writes``). Where each segment is and how each of its columns is stored
is kept in memory (``_Segment``): a spool is private to its process and never read by another
program. A segment is memory-mapped to be read (its pages leave memory with it); the space a
split or merge frees is given back to the file system where it can punch a hole.
NOTE: one file, not a file per segment: creating and removing thousands of files cost a 10 GB
export's first look ~1 s of system time (ext4 looks for a free inode among those just removed).

Columns are numpy arrays, all of one set of names in every chunk: kept as given, except that the
integer columns named in ``narrow`` are int32 in each chunk whose values fit (read back, a column is
int32 only if every chunk's was), or categoricals (kept as int32 ids into one label list per
column; ``categories`` gives each column's categories as ``pandas.api.types.union_categoricals`` of
the parts' categoricals would, in part order: see ``start_part``).

Each integer column of a segment is stored in the fewest bytes its values need
(``packed_columns``): a generated export's device and API rows take ~10 bytes each (~88 as numpy
arrays).
"""
from __future__ import annotations

import math
import mmap
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.spill.packed_columns import Col, Packed, decode, pack
from srtscope.analyzers.spill.spill_writes import SpillWriter

_I32 = np.iinfo(np.int32)
#: a bucket of more segments than this has its newest half merged into one (fewer, larger reads)
MAX_SEGMENTS = 16
#: where segments start in the file: mmap's offsets are multiples of it
_ALIGN = mmap.ALLOCATIONGRANULARITY


@dataclass(frozen=True)
class _Segment:
    offset: int                 # bytes into the spool's file, a multiple of ``_ALIGN``
    size: int                   # bytes written (0: every column one value)
    rows: int
    cols: tuple[Col, ...]       # ``start_ns`` first

    @property
    def span(self) -> int:
        """Bytes the segment takes in the file, up to where the next one may start."""
        return self.size + (-self.size % _ALIGN)


@dataclass
class _Bucket:
    segments: list[_Segment] = field(default_factory=list)
    rows: int = 0
    smin: int | None = None     # lowest start, ns
    smax: int | None = None     # highest start, ns

    def note(self, starts: np.ndarray) -> None:
        lo, hi = int(starts.min()), int(starts.max())
        self.smin = lo if self.smin is None else min(self.smin, lo)
        self.smax = hi if self.smax is None else max(self.smax, hi)


@dataclass
class _PartCats:
    """The categories one part (source table) gave a categorical column, over its chunks."""
    first: list[str]
    seen: set[str]
    ordered: bool       # every chunk's categories were sorted (then the part's are sorted)

    def add(self, cats: list[str]) -> None:
        self.seen.update(cats)
        self.ordered = self.ordered and cats == sorted(cats)

    def categories(self) -> list[str]:
        if self.ordered:
            return sorted(self.seen)
        return self.first + sorted(self.seen - set(self.first))


class TimeSpool:
    """Rows of one table in start-time buckets in one file under ``folder`` (``prefix-<token>.spool``,
    the token this spool's own: spools sharing a folder never touch each other's files).

    ``bucket_rows``: the most rows a bucket holds (unless they share one start); ``expect_rows`` and
    ``hint_ns`` (lowest, highest start expected): the first buckets' edges, about half full each.
    """

    def __init__(self, folder: Path, prefix: str, bucket_rows: int, expect_rows: int = 0,
                 hint_ns: tuple[int, int] | None = None, narrow: frozenset[str] = frozenset()) -> None:
        if bucket_rows < 1:
            raise ValueError(f"bucket_rows must be >= 1, got {bucket_rows}")
        self.folder, self.bucket_rows = folder, bucket_rows
        self.prefix = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.path = folder / f"{self.prefix}.spool"
        self.expect_rows, self.hint_ns = expect_rows, hint_ns
        self.narrow = narrow
        self.bounds: list[int] = []          # bucket i holds starts in [bounds[i-1], bounds[i])
        self.buckets: list[_Bucket] = []
        self.rows = 0
        self.bad_rows = 0                    # rows whose end is before their start
        self.id_range: dict[str, tuple[int, int]] = {}   # int column -> (min, max)
        self._labels: dict[str, dict[str, int]] = {}     # categorical column -> label -> id
        self._parts: dict[str, list[_PartCats]] = {}
        self._part = -1
        self._types: dict[str, np.dtype] = {}            # column -> type of its first chunk
        self._fd: int | None = None
        self._writer: SpillWriter | None = None
        self._end = 0                        # where the next segment goes in the file
        self.files: set[Path] = set()        # the file, once written and until removed

    # -- writing -----------------------------------------------------------------------------
    def start_part(self) -> None:
        """The chunks added next come from the next source table (its categories unite after the
        previous tables', as ``union_categoricals`` orders them)."""
        self._part += 1

    def add(self, cols: dict[str, Any]) -> None:
        """A chunk: name -> numpy array or categorical, all of one length, ``start_ns`` among them."""
        start = np.asarray(cols["start_ns"], np.int64)
        n = len(start)
        if not n:
            return
        arrays: dict[str, np.ndarray] = {}
        for k, v in cols.items():
            if isinstance(v, pd.Categorical):
                arrays[k] = self._codes(k, v)
            else:
                a = np.asarray(v)
                if a.dtype.kind == "i":
                    lo, hi = int(a.min()), int(a.max())
                    old = self.id_range.get(k)
                    self.id_range[k] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
                    if k in self.narrow and a.dtype != np.int32 and _I32.min <= lo and hi <= _I32.max:
                        a = a.astype(np.int32)
                arrays[k] = a
        self.rows += n
        if "end_ns" in arrays:
            self.bad_rows += int((arrays["end_ns"] < start).sum())
        arrays = self._fit_types({"start_ns": arrays["start_ns"], **arrays})
        if not self.buckets:
            self._first_buckets(start)
        which = np.searchsorted(np.asarray(self.bounds, np.int64), start, side="right")
        # rows mostly come in time order: then each bucket's rows are one slice (no copy)
        order = None if (np.diff(which) >= 0).all() else np.argsort(which, kind="stable")
        counts = np.bincount(which, minlength=len(self.buckets))
        pos = 0
        touched = []
        for b in np.flatnonzero(counts).tolist():
            m = int(counts[b])
            bk = self.buckets[b]
            if order is None:
                part = {k: v[pos:pos + m] for k, v in arrays.items()}
            else:
                take = order[pos:pos + m]
                part = {k: v[take] for k, v in arrays.items()}
            bk.segments.append(self._write(part))
            bk.note(part["start_ns"])
            pos += m
            bk.rows += m
            touched.append(b)
        for b in reversed(touched):       # from the end: a split shifts the buckets after it
            self._fit(b)

    def _fit_types(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` in the first chunk's column types (a ``narrow`` column keeps its own width);
        ValueError for other columns or a value its column's type cannot hold."""
        if not self._types:
            if any(a.dtype.hasobject for a in arrays.values()):
                raise ValueError("a spooled column holds numbers, not objects")
            self._types = {k: a.dtype for k, a in arrays.items()}
            return arrays
        if arrays.keys() != self._types.keys():
            raise ValueError(f"a chunk's columns {sorted(arrays)} are not the spool's {sorted(self._types)}")
        out = {}
        for k, a in arrays.items():
            want = self._types[k]
            if a.dtype != want and not (k in self.narrow and a.dtype.kind == "i"):
                b = a.astype(want)
                if not (b == a).all():
                    raise ValueError(f"column {k!r}: {a.dtype} values that {want} cannot hold")
                a = b
            out[k] = a
        return out

    def _codes(self, col: str, cat: pd.Categorical) -> np.ndarray:
        labels = self._labels.setdefault(col, {})
        cats = [str(c) for c in cat.categories.tolist()]
        ids = np.fromiter((labels.setdefault(c, len(labels)) for c in cats), np.int32, len(cats))
        parts, part = self._parts.setdefault(col, []), max(self._part, 0)
        while len(parts) <= part:
            parts.append(_PartCats([], set(), True))
        rec = parts[part]
        if not rec.seen:
            rec.first = cats
        rec.add(cats)
        codes = np.asarray(cat.codes)
        return ids[codes] if len(ids) else np.zeros(len(codes), np.int32)

    def _first_buckets(self, start: np.ndarray) -> None:
        lo, hi = int(start.min()), int(start.max())
        if self.hint_ns is not None:
            lo, hi = min(lo, self.hint_ns[0]), max(hi, self.hint_ns[1])
        n = min(4096, max(1, math.ceil(2 * max(self.expect_rows, len(start)) / self.bucket_rows)))
        edges = np.unique(np.linspace(lo, hi, n + 1)[1:-1].astype(np.int64)) if hi > lo else np.zeros(0, np.int64)
        self.bounds = edges.tolist()
        self.buckets = [_Bucket() for _ in range(len(self.bounds) + 1)]

    def _write(self, cols: dict[str, np.ndarray]) -> _Segment:
        """``cols`` (``start_ns`` among them, one length) as a new segment at the file's end."""
        start = cols["start_ns"]
        descs: list[Col] = []
        bufs: list[Any] = []
        size = 0
        for name in ("start_ns", *(k for k in cols if k != "start_ns")):
            a, dur = cols[name], False
            if name == "end_ns" and a.dtype == start.dtype == np.int64:
                d = a - start
                if d.min() >= 0:
                    a, dur = d, True
            p = pack(a) if a.dtype.kind in "iu" else Packed(0, a.dtype, a)
            if p.stored is None or p.values is None:
                descs.append(Col(name, cols[name].dtype, p.base, None, dur=dur, steps=p.steps, step=p.step))
                continue
            if size % 8:                    # each column's values aligned for reading in place
                bufs.append(bytes(8 - size % 8))
                size += 8 - size % 8
            descs.append(Col(name, cols[name].dtype, p.base, p.stored, size, dur, p.steps, p.step))
            bufs.append(np.ascontiguousarray(p.values))
            size += p.values.nbytes
        seg = _Segment(self._end, size, len(start), tuple(descs))
        if size:
            self._out().write(bufs, seg.offset)
        self._end += seg.span
        return seg

    def _out(self) -> SpillWriter:
        self._file()
        if self._writer is None:
            raise ValueError(f"the spill {self.path} was removed")
        return self._writer

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            self.files.add(self.path)
            self._writer = SpillWriter(self.path, self._fd)
        return self._fd

    def _free(self, segs: list[_Segment]) -> None:
        """The file's space under ``segs`` given back (a hole punched, where the system can)."""
        for s in segs:
            if s.size and self._fd is not None:
                _punch(self._fd, s.offset, s.span)

    def _fit(self, b: int) -> None:
        """Split bucket ``b`` while it holds too many rows of more than one start; merge its
        segments when too many."""
        bk = self.buckets[b]
        if bk.rows > self.bucket_rows and bk.smin is not None and bk.smin != bk.smax:
            self._split(b)
            self._fit(b + 1)
            self._fit(b)
        elif len(bk.segments) > MAX_SEGMENTS:
            # the newest half merged (rows spread thin over many buckets, e.g. a later table's):
            # a row is rewritten about log(segments) times, never once per merge
            old = bk.segments[-(MAX_SEGMENTS // 2):]
            merged = self._write(self._load(old))
            bk.segments = bk.segments[:-len(old)] + [merged]
            self._free(old)

    def _split(self, b: int) -> None:
        bk = self.buckets[b]
        cols = self._load(bk.segments)
        starts = cols["start_ns"]
        mid = int(np.partition(starts, len(starts) // 2)[len(starts) // 2])
        cut = mid if mid > int(starts.min()) else mid + 1        # left: start < cut (never empty)
        left = starts < cut
        sides = []
        for mask in (left, ~left):
            part = {k: v[mask] for k, v in cols.items()}
            side = _Bucket([self._write(part)], len(part["start_ns"]))
            side.note(part["start_ns"])
            sides.append(side)
        self._free(bk.segments)
        self.buckets[b:b + 1] = sides
        self.bounds.insert(b, cut)

    # -- reading -----------------------------------------------------------------------------
    def _load(self, segs: list[_Segment]) -> dict[str, np.ndarray]:
        """The rows of ``segs`` in their order, each column in the widest type its segments had."""
        rows = sum(s.rows for s in segs)
        types: dict[str, list[np.dtype]] = {}
        for s in segs:
            for c in s.cols:
                types.setdefault(c.name, []).append(c.dtype)
        out = {k: np.empty(rows, np.result_type(*t)) for k, t in types.items()}
        pos = 0
        for s in segs:
            view = mmap.mmap(self._file(), s.size, access=mmap.ACCESS_READ, offset=s.offset) if s.size else None
            for c in s.cols:                # start_ns first: a duration adds it
                decode(c, view, out[c.name][pos:pos + s.rows], out["start_ns"][pos:pos + s.rows])
            del view                        # unmapped: no array refers to it
            pos += s.rows
        return out

    def categories(self, col: str) -> list[str]:
        """Categories of a categorical column: each part's (sorted where its chunks' were), united
        in part order; ``codes`` of ``chunks`` index ``labels(col)``, remap with ``lookup``."""
        out: dict[str, None] = {}
        for rec in self._parts.get(col, []):
            if rec.seen:
                out.update(dict.fromkeys(rec.categories()))
        return list(out)

    def lookup(self, col: str, categories: list[str]) -> np.ndarray:
        """Label id of ``col`` -> its position in ``categories`` (int32)."""
        pos = {c: i for i, c in enumerate(categories)}
        labels = self._labels.get(col, {})
        lut = np.zeros(len(labels), np.int32)
        for lab, i in labels.items():
            lut[i] = pos[lab]
        return lut

    def chunks(self) -> Iterator[dict[str, np.ndarray]]:
        """The rows, sorted by (start, order of ``add``), in pieces of at most ``bucket_rows`` rows
        (more where one start holds more), as name -> array (categoricals as label ids).
        Each call reads the file again."""
        pending: list[dict[str, np.ndarray]] = []
        n_pending = 0
        cap = self.bucket_rows
        for bk in self.buckets:
            if not bk.rows:
                continue
            cols = self._sorted(bk)
            n = bk.rows
            if n_pending + n <= cap:
                pending.append(cols)
                n_pending += n
                continue
            if pending:
                yield _concat(pending)
                pending, n_pending = [], 0
            s, pos = cols["start_ns"], 0
            while n - pos > cap:
                cut = int(np.searchsorted(s, s[pos + cap], side="left"))
                if cut <= pos:                      # one start holds more than ``cap`` rows
                    cut = int(np.searchsorted(s, s[pos], side="right"))
                yield {k: v[pos:cut] for k, v in cols.items()}
                pos = cut
            if pos < n:
                pending.append({k: v[pos:] for k, v in cols.items()})
                n_pending = n - pos
        if pending:
            yield _concat(pending)

    def _sorted(self, bk: _Bucket) -> dict[str, np.ndarray]:
        cols = self._load(bk.segments)
        start = cols["start_ns"]
        # the segments hold the bucket's rows in arrival order: a stable sort resolves ties by it
        if (np.diff(start) >= 0).all():
            return cols
        order = np.argsort(start, kind="stable")
        one = {c.name for c in bk.segments[0].cols if c.stored is None and not c.dur and not c.steps
               and all(d.stored is None and not d.dur and not d.steps and d.base == c.base
                       for s in bk.segments for d in s.cols if d.name == c.name)}
        for k in list(cols):
            if k not in one:                # a column of one value needs no gather
                cols[k] = cols[k][order]
        return cols

    def remove(self) -> None:
        """Delete the file this spool wrote (nothing else in its folder). Every step is tried (the
        descriptors closed, the file unlinked) whatever an earlier one raised; then the first
        ``OSError`` is raised."""
        writer, fd, files = self._writer, self._fd, sorted(self.files)
        self._writer, self._fd = None, None
        self.files.clear()
        self.buckets, self.bounds = [], []
        first: OSError | None = None
        steps: list[Callable[[], object]] = [writer.close] if writer is not None else []
        if fd is not None:
            steps.append(partial(os.close, fd))
        steps += [partial(p.unlink, missing_ok=True) for p in files]
        for step in steps:
            try:
                step()
            except OSError as exc:
                first = first or exc
        if first is not None:
            raise first


_FALLOCATE: list[Any] = []


def _punch(fd: int, offset: int, length: int) -> None:
    """A hole punched in ``fd`` over ``length`` bytes at ``offset`` (Linux ``fallocate``; nothing
    where it is missing or the file system refuses: the space then waits for the file's removal)."""
    if not _FALLOCATE:
        fn = None
        if sys.platform.startswith("linux"):
            import ctypes
            try:
                fn = ctypes.CDLL(None, use_errno=True).fallocate
                fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            except (OSError, AttributeError):
                fn = None
        _FALLOCATE.append(fn)
    if _FALLOCATE[0] is not None:
        _FALLOCATE[0](fd, 0x02 | 0x01, offset, length)      # FALLOC_FL_PUNCH_HOLE | KEEP_SIZE


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
