"""Second look from a columnar cache: the tables a reader made of a trace, kept as Arrow IPC files.

    tl = cached_read(path, rank, lambda: read_nsys(path, rank))

Where: ``$SRTSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/srtscope``, else ``~/.cache/srtscope``; never
beside the trace, which is only ever opened for reading. One entry per (trace path, rank): a folder
holding srtscope's marker (``cache/cache_store.py``), ``meta.json`` (the key, the ``TimelineMeta``, the
column layout and an xxh3-128 digest of each table file; authenticated by the marker's MAC) and
``device`` / ``api`` / ``ranges`` / ``counters`` ``.arrow`` (Arrow IPC files, LZ4-compressed, one
record batch each).

Key (``cache_store.trace_key``): resolved path, size, ``mtime_ns``, ``ctime_ns``, inode, device, a
hash of all of the file's bytes, the rank asked for and ``READER_VERSION`` (bump it whenever a
reader's output changes). An entry whose key, layout, digests or MAC do not match is dropped and
rebuilt, never trusted; restored tables are checked against the Timeline's columns. Entries are
written to a temporary folder in the cache directory and renamed into place (atomic); the cache is
capped at ``$SRTSCOPE_CACHE_MAX_MB`` (default 2048 MiB), least recently used entries evicted first.
Traces under ``$SRTSCOPE_CACHE_MIN_BYTES`` (default 1 MiB) are not cached: their read is quicker
than importing pyarrow. A cache that cannot be written costs one warning per process, nothing else.

NOTE: categorical columns keep their categories (and the categories' dtype) and codes; object
columns of strings come back as object arrays of ``str``; other object columns (the ranges'
``attrs`` dicts) are stored as dictionary-encoded JSON and restored equal, rows that shared one dict
sharing it again. A column or meta value JSON cannot restore exactly makes the file uncacheable.
NOTE: restored numeric columns are read-only arrays (Arrow's buffers), as pandas' copy-on-write
already hands out read-only views.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.cache.cache_auth import open_regular
from srtscope.analyzers.cache.cache_store import (  # noqa: F401 - the store's names, for this module's users
    DEFAULT_MAX_MB,
    DEFAULT_MIN_BYTES,
    META,
    READER_VERSION,
    TMP_PREFIX,
    CacheStore,
    CacheWarning,
    TraceKey,
    cache_dir,
    cache_enabled_for,
    max_bytes,
    new_hash,
    trace_key,
    warn_once,
)
from srtscope.analyzers.model.timeline import (
    SCHEMAS,
    CaptureWarning,
    DeviceInfo,
    SourceFormat,
    Timeline,
    TimelineMeta,
    Traced,
    WarningCode,
    id_dtype_ok,
)

#: Layout of an entry (files, meta.json fields); bump when this module's format changes.
ENTRY_FORMAT = 1
#: Arrow IPC buffer compression of new entries: LZ4 makes them ~4.5x smaller than the raw columns (a
#: 1 GB export's tables: 270 MB instead of 1.2 GB) for ~0.5 s more per GB on a hit.
COMPRESSION: str | None = "lz4"
TABLES = ("device", "api", "ranges", "counters")


class _Uncacheable(Exception):
    """A value the cache cannot restore exactly: the file is read without the cache."""


# -- values <-> JSON, exactly ----------------------------------------------------------------------
def _enc(v: Any) -> Any:
    """A value as JSON that ``_dec`` turns back into an equal value of the same types."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v) if type(v) is int else _refuse(v)
    if isinstance(v, float):
        return float(v) if type(v) is float else _refuse(v)
    if isinstance(v, list):
        return {"l": [_enc(x) for x in v]}
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, (set, frozenset)) and all(isinstance(x, str) for x in v):
        return {"s": sorted(v), "f": isinstance(v, frozenset)}
    if type(v) is dict:
        return {"d": [[_enc(k), _enc(x)] for k, x in v.items()]}
    return _refuse(v)


def _refuse(v: Any) -> Any:
    raise _Uncacheable(f"value of type {type(v).__name__}")


def _dec(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    if "l" in v:
        return [_dec(x) for x in v["l"]]
    if "t" in v:
        return tuple(_dec(x) for x in v["t"])
    if "s" in v:
        return (frozenset if v["f"] else set)(v["s"])
    return {_dec(k): _dec(x) for k, x in v["d"]}


def _meta_json(m: TimelineMeta) -> dict:
    return {"format": m.format.value, "sources": m.sources, "tool_version": m.tool_version,
            "devices": [asdict(d) for d in m.devices], "ranks": _enc(m.ranks), "world_size": m.world_size,
            "window": [m.window_start_ns, m.window_end_ns], "traced": [t.value for t in m.traced],
            "warnings": [[w.code.value, w.message] for w in m.warnings], "extra": _enc(m.extra)}


def _meta_from(d: dict, path: Path) -> TimelineMeta:
    m = TimelineMeta(format=SourceFormat(d["format"]), sources=list(d["sources"]), tool_version=d["tool_version"],
                     devices=[DeviceInfo(**x) for x in d["devices"]], ranks=_dec(d["ranks"]),
                     world_size=int(d["world_size"]), window_start_ns=int(d["window"][0]),
                     window_end_ns=int(d["window"][1]), traced={Traced(t) for t in d["traced"]},
                     warnings=[CaptureWarning(WarningCode(c), msg) for c, msg in d["warnings"]],
                     extra=_dec(d["extra"]))
    if len(m.sources) == 1:
        m.sources = [str(path)]      # the path as given this time (readers record it so)
    return m


# -- tables <-> Arrow --------------------------------------------------------------------------------
def _to_arrow(df: pd.DataFrame) -> tuple[Any, list[dict]]:
    """(pyarrow Table, layout: per column how to restore it)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        raise _Uncacheable("index other than 0..n-1")
    arrays, layout = [], []
    for name in df.columns:
        s = df[name]
        dt = s.dtype
        if isinstance(dt, pd.CategoricalDtype):
            cats = dt.categories
            if not all(isinstance(c, str) for c in cats):
                raise _Uncacheable(f"column {name}: categories other than str")
            codes = np.asarray(s.array.codes)
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(list(cats), pa.string())))
            layout.append({"name": name, "kind": "cat", "ordered": bool(dt.ordered),
                           "cat_dtype": str(cats.dtype)})
        elif isinstance(dt, np.dtype) and dt.kind == "O":
            vals = s.to_numpy()
            if all(type(v) is str for v in vals):
                arrays.append(pa.array(vals, pa.string()))
                layout.append({"name": name, "kind": "str"})
            else:
                arrays.append(_json_column(vals))
                layout.append({"name": name, "kind": "json"})
        elif dt.kind in "iufb" and isinstance(dt, np.dtype):
            arrays.append(pa.array(s.to_numpy()))
            layout.append({"name": name, "kind": "num", "dtype": dt.str})
        else:
            raise _Uncacheable(f"column {name}: dtype {dt}")
    return pa.Table.from_arrays(arrays, names=[str(c) for c in df.columns]), layout


def _json_column(vals: np.ndarray) -> Any:
    """Object values -> dictionary-encoded JSON strings (each distinct object encoded once)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    seen: dict[int, int] = {}
    uniq: list[str] = []
    idx: dict[str, int] = {}
    codes = np.empty(len(vals), np.int32)
    for i, v in enumerate(vals):
        k = seen.get(id(v))
        if k is None:
            text = json.dumps(_enc(v), separators=(",", ":"))
            k = idx.setdefault(text, len(uniq))
            if k == len(uniq):
                uniq.append(text)
            seen[id(v)] = k
        codes[i] = k
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(uniq, pa.string()))


def _from_arrow(table: Any, layout: list[dict]) -> pd.DataFrame:
    import pyarrow as pa  # type: ignore[import-untyped]

    if [c["name"] for c in layout] != table.column_names:
        raise ValueError("columns differ from the layout")
    out: dict[str, Any] = {}
    for spec in layout:
        col = table.column(spec["name"])
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        kind = spec["kind"]
        if kind == "num":
            a = arr.to_numpy(zero_copy_only=False)
            if a.dtype.str != spec["dtype"]:
                raise ValueError(f"column {spec['name']}: dtype {a.dtype} instead of {spec['dtype']}")
            out[spec["name"]] = a
        elif kind == "cat":
            assert isinstance(arr, pa.DictionaryArray)
            cats = pd.Index(arr.dictionary.to_pylist(), dtype=spec["cat_dtype"])
            codes = arr.indices.to_numpy(zero_copy_only=False)
            out[spec["name"]] = pd.Categorical.from_codes(
                codes, dtype=pd.CategoricalDtype(cats, ordered=spec["ordered"]))
        elif kind == "str":
            a = np.empty(len(arr), dtype=object)
            a[:] = arr.to_pylist()
            out[spec["name"]] = a
        elif kind == "json":
            assert isinstance(arr, pa.DictionaryArray)
            objs = np.empty(len(arr.dictionary), dtype=object)
            objs[:] = [_dec(x) for x in json.loads("[" + ",".join(arr.dictionary.to_pylist()) + "]")]
            out[spec["name"]] = objs[arr.indices.to_numpy(zero_copy_only=False)] if len(arr) else \
                np.empty(0, dtype=object)
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    return pd.DataFrame(out, copy=False)


def _digest(data: Any) -> str:
    """xxh3-128 of a table file's bytes (the authenticated meta.json lists it: a swapped or damaged
    file does not match)."""
    h = new_hash()
    h.update(memoryview(data))      # type: ignore[attr-defined]
    return str(h.hexdigest())       # type: ignore[attr-defined]


def _map(path: Path) -> Any:
    """A pyarrow buffer over the regular file ``path`` (mapped; never opened blocking)."""
    import mmap

    import pyarrow as pa  # type: ignore[import-untyped]

    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size == 0:
            return pa.py_buffer(b"")
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _check_schema(table: str, df: pd.DataFrame) -> None:
    """The Timeline's required columns, with its integer columns as int64 (else ValueError)."""
    for c in SCHEMAS[table]:
        if c.name not in df.columns:
            if c.required:
                raise ValueError(f"{table}: column {c.name} missing")
            continue
        if c.dtype == "int64" and not id_dtype_ok(c.name, df[c.name].dtype):
            raise ValueError(f"{table}: column {c.name} is {df[c.name].dtype}, not int64")


# -- the cache ---------------------------------------------------------------------------------------
class TimelineCache(CacheStore):
    """Timeline entries under ``root`` (see the module's docstring); ``cap`` in bytes."""

    KIND = "tables"

    def get(self, key: TraceKey, given: Path | None = None) -> Timeline | None:
        """The cached Timeline of ``key``; None (and the entry dropped) when missing, stale, damaged
        or not verified. ``given``: the trace's path as the caller spelled it (the Timeline's source)."""
        entry = self.root / key.entry_name
        meta = self.open_entry(key.entry_name, self.KIND)
        if meta is None:
            return None
        try:
            doc = json.loads(meta)
            if doc.get("entry_format") != ENTRY_FORMAT or doc.get("key") != asdict(key):
                self.drop(entry)   # stale: the trace, the reader or the format changed
                return None
            tl = self._load(entry, doc, given if given is not None else Path(key.path))
        except Exception:  # noqa: BLE001 - a damaged entry shows as any exception: dropped, not trusted
            self.drop(entry)
            return None
        try:
            os.utime(entry / META, follow_symlinks=False)   # least recently used: by meta's mtime
        except (OSError, NotImplementedError):
            pass
        return tl

    def _load(self, entry: Path, doc: dict, path: Path) -> Timeline:
        import pyarrow.ipc as ipc  # type: ignore[import-untyped]

        frames = {}
        for t in TABLES:
            spec = doc["tables"][t]
            data = _map(entry / f"{t}.arrow")
            if data.size != spec["bytes"] or _digest(data) != spec["digest"]:
                raise ValueError(f"{t}.arrow damaged")
            table = ipc.open_file(data).read_all()
            del data
            if table.num_rows != spec["rows"]:
                raise ValueError(f"{t}.arrow: row count")
            frames[t] = _from_arrow(table, spec["layout"])
            _check_schema(t, frames[t])
        return Timeline(frames["device"], frames["api"], frames["ranges"], frames["counters"],
                        _meta_from(doc["meta"], path))

    def put(self, key: TraceKey, tl: Timeline) -> None:
        """Store ``tl`` under ``key`` (atomically), then evict down to the cap. Never raises for the
        cache's own trouble (one warning per process); a Timeline it cannot restore exactly is skipped."""
        import pyarrow.ipc as ipc  # type: ignore[import-untyped]

        def write(folder: Path) -> None:
            doc: dict = {"entry_format": ENTRY_FORMAT, "key": asdict(key), "meta": _meta_json(tl.meta),
                         "tables": {}, "written": time.time()}
            opts = ipc.IpcWriteOptions(compression=COMPRESSION)
            for t in TABLES:
                table, layout = _to_arrow(getattr(tl, t))
                f = folder / f"{t}.arrow"
                with ipc.new_file(str(f), table.schema, options=opts) as w:
                    w.write_table(table, max_chunksize=max(table.num_rows, 1))
                data = _map(f)
                doc["tables"][t] = {"rows": table.num_rows, "layout": layout, "bytes": data.size,
                                    "digest": _digest(data)}
                del table, data
            (folder / META).write_text(json.dumps(doc, allow_nan=False))

        try:
            self.publish(key.entry_name, self.KIND, write)
        except _Uncacheable:
            return


def cached_read(path: Path, rank: int, read: Callable[[], Timeline]) -> Timeline:
    """``read()``'s Timeline of ``path``, from the cache when it holds a valid entry, else read and
    stored. Without pyarrow, or for a file that changes while it is read, just ``read()``."""
    try:
        import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return read()
    try:
        key = trace_key(path, rank)
    except OSError:
        return read()                       # the read reports what is wrong with the file
    cache = TimelineCache()
    tl = cache.get(key, path)
    if tl is not None:
        return tl
    tl = read()
    try:
        if not key.unchanged():
            return tl                       # the file changed while it was read: not kept
    except OSError:
        return tl
    if _DEFERRED[0] is None:
        cache.put(key, tl)
    else:
        t = threading.Thread(target=_put_quietly, args=(cache, key, tl), name="srtscope-cache-write")
        t.start()
        _DEFERRED[0].append(t)
    return tl


def _put_quietly(cache: TimelineCache, key: TraceKey, tl: Timeline) -> None:
    """``cache.put`` on a writer thread: whatever goes wrong there is the cache's trouble (one
    warning), never a traceback from the thread."""
    try:
        cache.put(key, tl)
    except Exception as exc:  # noqa: BLE001 - the answer does not depend on the entry
        warn_once(f"{type(exc).__name__}: {exc}")


#: entries being written in the background inside ``deferred_writes`` (None outside it)
_DEFERRED: list[list[threading.Thread] | None] = [None]


@contextmanager
def deferred_writes() -> Iterator[None]:
    """Inside the block, ``cached_read`` writes new entries on a thread of their own, while the
    caller goes on (e.g. with the analyses, which leave the second core idle); the block's end
    waits for them.

    NOTE: the writer only reads the Timeline's frames; the caller must not modify them meanwhile
    (the analyses never do)."""
    outer, _DEFERRED[0] = _DEFERRED[0], []
    try:
        yield
    finally:
        pending, _DEFERRED[0] = _DEFERRED[0], outer
        for t in pending or []:
            t.join()
