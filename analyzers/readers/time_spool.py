"""One table's rows spilled to disk in start-time buckets (Arrow IPC files), read back in time order.

Rows come in any order, a chunk at a time (``add``); each chunk's rows go to the buckets their
start falls in, one file ("segment") per bucket touched, so memory holds one chunk. A bucket of
more than ``bucket_rows`` rows is split at its median start, and one of too many segments merged,
streaming one segment at a time. ``chunks`` then reads the buckets in time order (memory-mapped),
each sorted by (start, arrival order): the rows as a stable sort by start of everything added, in
pieces of at most ``bucket_rows`` rows (more only where more rows share one start).

NOTE: a bucket's segments hold its rows in arrival order (a chunk's rows keep their order, segments
are appended, a split or merge streams them in order): a stable sort by start within each bucket
is the stable sort of all rows, no sequence column needed.

Columns are numpy arrays (kept as given, except that the integer columns named in ``narrow`` are
written as int32 in each chunk whose values fit: about a third fewer bytes to write and read back
for ids; read back, a column is int32 only if every chunk's was) or categoricals (kept as int32 ids
into one label list per column; ``categories`` gives each column's categories as
``pandas.api.types.union_categoricals`` of the parts' categoricals would, in part order: see
``start_part``).

On disk a segment written from a chunk holds less than its columns (``_encode``): a column of one
value over the whole segment is kept as that value in the file's metadata, and ``end_ns`` as the
int32 duration where every row's fits; reading a segment gives its columns back as they were added.
Most of a kernel's columns (kind, device, stream, process, graph ids, bytes) are one value over a
chunk of one table: a device row takes about half the bytes to write and read back.
"""
from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.ipc as ipc  # type: ignore[import-untyped]

_I32 = np.iinfo(np.int32)
#: a bucket of more segments than this has its newest half merged into one (fewer, larger reads)
MAX_SEGMENTS = 16


@dataclass
class _Bucket:
    segments: list[Path] = field(default_factory=list)
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


#: schema metadata of an encoded segment: its columns' names and types, in order; its constant columns
_COLS, _CONST, _DUR = b"srtscope.cols", b"srtscope.const", b"srtscope.dur"


def _encode(table: pa.Table) -> pa.Table:
    """``table`` as a segment stores it: a column of one value (not ``start_ns``) left out, its value
    in the metadata (integer columns); ``end_ns`` as int32 ``end_ns - start_ns`` where every row's
    fits (``_decode`` undoes both). A table of no rows is kept as it is."""
    if not table.num_rows:
        return table
    cols = [[f.name, str(f.type)] for f in table.schema]
    const: dict[str, int] = {}
    keep: dict[str, pa.Array] = {}
    dur = False
    start = table.column("start_ns").to_numpy()
    for f in table.schema:
        a = table.column(f.name).to_numpy()
        if f.name != "start_ns" and pa.types.is_integer(f.type) and (a == a[0]).all():
            const[f.name] = int(a[0])
        elif f.name == "end_ns":
            d = a - start
            if d.min() >= 0 and d.max() <= _I32.max:
                keep[f.name], dur = pa.array(d.astype(np.int32)), True
            else:
                keep[f.name] = table.column(f.name)
        else:
            keep[f.name] = table.column(f.name)
    meta = {_COLS: json.dumps(cols), _CONST: json.dumps(const), _DUR: b"1" if dur else b"0"}
    return pa.table(keep).replace_schema_metadata(meta)


def _columns(table: pa.Table) -> tuple[list[tuple[str, np.dtype]], dict[str, np.ndarray | int]]:
    """A stored segment's (name, dtype) of every column as added, in order, and its columns: an
    array, or the int a constant column holds (``_encode``)."""
    meta = table.schema.metadata or {}
    if _COLS not in meta:
        return ([(f.name, np.dtype(f.type.to_pandas_dtype())) for f in table.schema],
                {f.name: table.column(f.name).to_numpy() for f in table.schema})
    const, dur = json.loads(meta[_CONST]), meta[_DUR] == b"1"
    names = [(n, np.dtype(pa.type_for_alias(t).to_pandas_dtype())) for n, t in json.loads(meta[_COLS])]
    out: dict[str, np.ndarray | int] = {}
    for name, _ in names:
        if name in const:
            out[name] = const[name]
        elif name == "end_ns" and dur:
            out[name] = table.column("start_ns").to_numpy() + table.column(name).to_numpy()
        else:
            out[name] = table.column(name).to_numpy()
    return names, out


def _decode(table: pa.Table) -> pa.Table:
    """A stored segment's table with its columns as they were added (``_encode``)."""
    if _COLS not in (table.schema.metadata or {}):
        return table
    names, cols = _columns(table)
    n = table.num_rows
    return pa.table({k: (np.full(n, cols[k], t) if isinstance(cols[k], int) else cols[k]) for k, t in names})


def _read(path: Path) -> pa.Table:
    """A segment, memory-mapped (its pages leave memory with the last array using them), its columns
    as they were added."""
    return _decode(_stored(path))


def _stored(path: Path) -> pa.Table:
    """A segment as stored (``_encode``), memory-mapped."""
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


class TimeSpool:
    """Rows of one table in start-time buckets under ``folder`` (files named ``prefix-<token>-*.arrow``,
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
        self._n_files = 0
        self._schema: pa.Schema | None = None
        self.files: set[Path] = set()        # every file written and not yet removed

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
        table = self._fit_schema(pa.table(arrays))
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
                bk.segments.append(self._write(table.slice(pos, m)))
                bk.note(start[pos:pos + m])
            else:
                take = order[pos:pos + m]
                bk.segments.append(self._write(table.take(pa.array(take))))
                bk.note(start[take])
            pos += m
            bk.rows += m
            touched.append(b)
        for b in reversed(touched):       # from the end: a split shifts the buckets after it
            self._fit(b)

    def _fit_schema(self, table: pa.Table) -> pa.Table:
        """``table`` in the spool's column types (a ``narrow`` column keeps its own width), the
        spool's schema widened where this chunk's narrow column is wider."""
        if self._schema is None:
            self._schema = table.schema
            return table
        own = {f.name: f.type for f in table.schema}
        want = pa.schema([pa.field(f.name, own[f.name]) if f.name in self.narrow and f.name in own else f
                          for f in self._schema])
        for f in want:
            if f.name in self.narrow and f.type != self._schema.field(f.name).type:
                self._schema = self._schema.set(self._schema.get_field_index(f.name), pa.field(f.name, pa.int64()))
        return table if table.schema.equals(want) else table.cast(want)

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

    def _write(self, table: pa.Table | None, batches: Iterator[pa.RecordBatch] | None = None) -> Path:
        path = self.folder / f"{self.prefix}-{self._n_files:07d}.arrow"
        self._n_files += 1
        self.files.add(path)
        assert self._schema is not None
        if table is not None:
            table = _encode(table)
        schema = table.schema if table is not None else self._schema
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, schema) as w:
            if table is not None:
                w.write_table(table)
            for batch in batches or ():     # segments of one bucket may differ in narrow widths
                w.write_batch(batch if batch.schema.equals(schema) else batch.cast(schema))
        return path

    def _drop(self, paths: list[Path]) -> None:
        for p in paths:
            p.unlink(missing_ok=True)
            self.files.discard(p)

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
            merged = self._write(None, (batch for p in old for batch in _read(p).to_batches()))
            bk.segments = bk.segments[:-len(old)] + [merged]
            self._drop(old)

    def _split(self, b: int) -> None:
        bk = self.buckets[b]
        starts = np.concatenate([_ints(_stored(p), "start_ns") for p in bk.segments])
        mid = int(np.partition(starts, len(starts) // 2)[len(starts) // 2])
        cut = mid if mid > int(starts.min()) else mid + 1        # left: start < cut (never empty)
        left, right = _Bucket(rows=int((starts < cut).sum())), _Bucket()
        right.rows = len(starts) - left.rows
        left.note(starts[starts < cut])
        right.note(starts[starts >= cut])
        del starts

        def side(keep_left: bool) -> Iterator[pa.RecordBatch]:
            for p in bk.segments:
                t = _read(p)
                mask = _ints(t, "start_ns") < cut
                yield from t.filter(pa.array(mask if keep_left else ~mask)).to_batches()

        left.segments = [self._write(None, side(True))]
        right.segments = [self._write(None, side(False))]
        self._drop(bk.segments)
        self.buckets[b:b + 1] = [left, right]
        self.bounds.insert(b, cut)

    # -- reading -----------------------------------------------------------------------------
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
        Each call reads the files again."""
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
        segs = [_columns(_stored(p)) for p in bk.segments]
        starts = [np.asarray(cols["start_ns"]) for _, cols in segs]    # never left out
        lens = [len(x) for x in starts]
        start = np.concatenate(starts)
        del starts
        # the segments hold the bucket's rows in arrival order: a stable sort resolves ties by it
        order = None if (np.diff(start) >= 0).all() else np.argsort(start, kind="stable")
        out = {"start_ns": start if order is None else start[order]}
        del start
        assert self._schema is not None
        for name in self._schema.names:
            if name in out:
                continue
            parts = [cols[name] for _, cols in segs]
            typ = np.result_type(*[dict(names)[name] for names, _ in segs])
            if all(isinstance(v, int) for v in parts) and len(set(parts)) == 1:
                out[name] = np.full(bk.rows, parts[0], typ)     # one value: no gather
                continue
            col = np.concatenate([np.full(m, v, typ) if isinstance(v, int) else v for v, m in zip(parts, lens)])
            out[name] = col if order is None else col[order]
        return out

    def remove(self) -> None:
        """Delete every file this spool wrote (nothing else in its folder)."""
        self._drop(sorted(self.files))
        self.buckets, self.bounds = [], []


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
