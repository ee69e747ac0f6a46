"""Nsight Systems SQLite export -> Timeline (schemas of nsys 2022.1 to 2026.2).

Opened strictly read-only (``mode=ro&immutable=1``): no journal, no index, nothing written beside
the user's file. Only the needed columns are selected; the big tables are scanned through ADBC into
Arrow record batches (C, GIL released: the device and the host tables on two cores), their
integer columns land in numpy arrays, names become categoricals over the few distinct StringIds.

NOTE: ``globalTid`` packs ``hw << 48 | pid << 24 | tid``; GPU tables carry ``globalPid`` only.
NOTE: correlation ids are unique per process only; the Timeline keeps ``pid`` beside them.
NOTE: ``immutable=1`` ignores a ``-wal`` log or hot ``-journal`` beside the file: such a file is
refused (``sqlite_integrity.check_side_files``) rather than read stale or torn. Structure is
verified with ``PRAGMA quick_check`` (``sqlite_integrity.check_integrity``): always on files up to
``QUICK_CHECK_ALWAYS_BYTES``, on larger ones per small table always and in full when what was read
looks inconsistent.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.names import api_kind, os_kind, strip_api_suffix
from srtscope.analyzers.readers.columnar import (
    arrow_query,
    cat_from_codes,
    concat_sorted,
    connect_arrow,
    factorize,
    fetch_ints,
    nesting_depth,
    rowid_bounds,
    sort_columns,
)
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.labels import split_coded_labels
from srtscope.analyzers.readers.nsys_facts import TableFacts
from srtscope.analyzers.readers.nsys_window import Facts, Track, Window, crop_columns, window_facts
from srtscope.analyzers.readers.sqlite_integrity import check_integrity, check_side_files
from srtscope.analyzers.readers.sqlite_pages import PagedFile, open_pages
from srtscope.analyzers.timeline import (
    ApiKind,
    DeviceInfo,
    DeviceKind,
    SourceFormat,
    Timeline,
    TimelineError,
    TimelineMeta,
    Traced,
    WarningCode,
    narrow_ids,
    validate_table,
)
from srtscope.analyzers.units import MAX_NAME_CHARS, NAME_END_CHARS

KNOWN_SCHEMAS = frozenset({"2.9.1", "3.1.2", "3.1.7", "3.13.2", "3.16.1", "3.17.1", "3.20.2",
                           "3.24.14", "3.25.0"})
NVTX_PUSH_RANGE, NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 35, 59, 60, 75
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
_MASK24 = 0xFFFFFF
#: nsys's ENUM_CUDA_MEM_KIND (the same numbering in exports without that table)
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static"}


def _copy_label(copy_kind: int, src: int, dst: int) -> str:
    """``Memcpy HtoD (Pageable -> Device)`` (Kineto's spelling); the memory kinds only when known."""
    name = f"Memcpy {_COPY_KIND.get(copy_kind, str(copy_kind))}"
    if src in _MEM_KIND and dst in _MEM_KIND:
        name += f" ({_MEM_KIND[src]} -> {_MEM_KIND[dst]})"
    return name


def capped(expr: str) -> str:
    """SQL for ``expr`` (a text) cut to ``MAX_NAME_CHARS`` in SQLite (``units.name_text``'s cut), so
    that a huge string never reaches Python whole; NULL stays NULL."""
    keep = MAX_NAME_CHARS - NAME_END_CHARS - 1
    return (f"CASE WHEN length({expr}) > {MAX_NAME_CHARS} THEN substr({expr}, 1, {keep}) || '…' || "
            f"substr({expr}, -{NAME_END_CHARS}) ELSE {expr} END")


#: Files up to this size get a full ``PRAGMA quick_check`` before the read (it costs ~4 s per GB,
#: about a fifth of the read: larger files get it only when what was read looks inconsistent).
QUICK_CHECK_ALWAYS_BYTES = 16 << 20


def _kind_col(kind: DeviceKind, n: int) -> pd.Categorical:
    # pandas-stubs wants an Index for categories; a list works at runtime
    return pd.Categorical.from_codes(np.zeros(n, np.int8), categories=[kind.value])  # type: ignore[call-overload]


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only, immutable connection: SQLite neither locks nor writes anything next to the file."""
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    con.execute("PRAGMA query_only=1")
    return con





def _pid_of(i: int) -> Track:
    """The process id of a ``globalPid``/``globalTid`` column (``i``-th expression), per row."""
    return lambda c: (c[i] >> 24) & _MASK24


class _Reader:
    def __init__(self, path: Path, con: sqlite3.Connection, window: Window | None = None) -> None:
        self.path, self.con = path, con
        self.window = window        # a windowed read: the big tables' rows in it only
        self.tables = {r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type='table'")}
        self._strings: dict[int, str] | None = None
        self.missing_strings = 0    # rows whose StringIds id is not in StringIds
        self.named_rows = 0         # rows whose name was looked up in StringIds
        self.suspect: list[str] = []  # what looked inconsistent while reading (quick_check then)
        self._arrow: Any = None        # ADBC connection for the big scans, opened on first use
        self._pages: PagedFile | None | bool = False   # the big tables' pages (False: not opened yet)
        self._long_ids: set[int] | None = None
        # no table of the file can hold more rows than this (a row takes more than 8 bytes)
        self.max_rows = max(1, path.stat().st_size // 8)

    @property
    def arrow(self) -> Any:
        if self._arrow is None:
            self._arrow = connect_arrow(self.path)
        return self._arrow

    @property
    def pages(self) -> PagedFile | None:
        """The file opened for page reads (``sqlite_pages``); None where it cannot be."""
        if self._pages is False:
            self._pages = open_pages(self.path, self.con)
        return self._pages if isinstance(self._pages, PagedFile) else None

    def close(self) -> None:
        if isinstance(self._pages, PagedFile):
            self._pages.close()
        self._pages = None
        if self._arrow is not None:
            self._arrow.close()
            self._arrow = None

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.con.execute(f"PRAGMA table_info({table})")}

    def fetch(self, table: str, exprs: list[str], where: str = "",
              track: dict[str, Track] | None = None) -> list[np.ndarray]:
        """``fetch_ints``, noting a table whose row count is not its rowid span: nsys writes rowids
        1..n, so rows were lost or moved (a swapped page) -- or the export was edited. In a windowed
        read, the rows in the window only (start and end: the first two ``exprs``), ``track``'s
        values counted over the whole table (``Window.seen``)."""
        span: list[int] = []
        w = self.window
        keep = w.keep(table, track or {}) if w is not None else None
        out = fetch_ints(self.arrow, table, exprs, where, span=span, max_rows=self.max_rows, keep=keep,
                         expect_rows=w.expect_rows if w is not None else None, pages=self.pages)
        if span and span[2] - span[1] + 1 != span[0]:
            self.suspect.append(f"{span[0]} rows in {table} over rowids {span[1]}..{span[2]}")
        return out

    def count(self, table: str, where: str = "") -> int:
        return int(self.con.execute(f"SELECT COUNT(*) FROM {table} {where}").fetchone()[0])

    def long_string_ids(self) -> set[int]:
        """StringIds ids whose value is over ``4 * MAX_NAME_CHARS`` bytes, found without loading
        any value (``octet_length`` in the ADBC driver's SQLite reads the size only); empty where
        that cannot be asked (then ``capped`` cuts them in SQL, loading each once)."""
        if self._long_ids is None:
            self._long_ids = set()
            try:
                cur = self.arrow.cursor()
                try:
                    cur.execute(f"SELECT id FROM StringIds WHERE octet_length(value) > {4 * MAX_NAME_CHARS}")
                    self._long_ids = {int(r[0]) for r in cur.fetchall()}
                finally:
                    cur.close()
            except Exception:  # noqa: BLE001 - an old driver, a damaged table: the SQL cut remains
                pass
        return self._long_ids

    def long_string(self, sid: int) -> str:
        """The value of StringIds ``sid`` cut as ``capped`` cuts it, read through SQLite's blob I/O:
        its first and last bytes only, never the whole value."""
        row = self.con.execute("SELECT rowid FROM StringIds WHERE id = ?", (sid,)).fetchone()
        with self.con.blobopen("StringIds", "value", row[0], readonly=True) as blob:  # type: ignore[attr-defined,unused-ignore]
            size = len(blob)
            head = blob.read(4 * MAX_NAME_CHARS).decode("utf-8", errors="ignore")
            blob.seek(max(0, size - 4 * NAME_END_CHARS))
            tail = blob.read(4 * NAME_END_CHARS).decode("utf-8", errors="ignore")
        return head[:MAX_NAME_CHARS - NAME_END_CHARS - 1] + "…" + tail[-NAME_END_CHARS:]

    def strings(self, ids: np.ndarray) -> dict[int, str]:
        """StringIds values of ``ids`` (distinct ids only are looked up); values longer than
        ``MAX_NAME_CHARS`` cut (``capped``), the huge ones without loading them (``long_string``)."""
        want = np.unique(ids).tolist()
        out: dict[int, str] = {}
        huge = self.long_string_ids()
        if huge:
            for sid in [w for w in want if int(w) in huge]:
                try:
                    out[int(sid)] = self.long_string(int(sid))
                except (sqlite3.Error, TypeError, AttributeError):     # no blob I/O before Python 3.11
                    continue            # looked up below, cut in SQL
            want = [w for w in want if int(w) not in out]
        for i in range(0, len(want), 900):
            part = want[i:i + 900]
            q = f"SELECT id, {capped('value')} FROM StringIds WHERE id IN ({','.join('?' * len(part))})"
            try:
                rows = self.con.execute(q, part).fetchall()
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise
                raise sqlite3.DatabaseError("malformed values in StringIds: names that are not UTF-8") from None
            for sid, value in rows:
                if not isinstance(value, str):      # NULL, a blob: no name, and no category beside names
                    what = "NULL" if value is None else "binary" if isinstance(value, bytes) else type(value).__name__
                    raise sqlite3.DatabaseError(f"malformed values in StringIds: {what} where names belong")
                out[sid] = value
        return out

    def categorical(self, ids: np.ndarray, transform=None, table: str = "") -> pd.Categorical:
        """ids into StringIds -> categorical of (optionally transformed) strings. In a windowed
        read, the categories and the missing names are those of ``table``'s whole name column."""
        seen = self.window.seen.get(table) if self.window is not None else None
        if seen is not None:
            uniq = seen.values("name")
            inv = np.searchsorted(uniq, ids) if len(uniq) else np.zeros(len(ids), np.int64)
        else:
            inv, uniq = factorize(ids)
        lut = self.strings(uniq)
        vals = [lut.get(int(u), "") for u in uniq.tolist()]
        lost = [i for i, u in enumerate(uniq.tolist()) if int(u) not in lut]
        if seen is not None:
            self.named_rows += seen.rows
            self.missing_strings += sum(seen.count("name", int(uniq[i])) for i in lost)
        else:
            self.named_rows += len(ids)
            if lost:
                self.missing_strings += int(np.isin(inv, lost).sum())
        if transform is not None:
            vals = [transform(v) for v in vals]
        return cat_from_codes(inv, vals)

    def holds(self, table: str, part: dict | None) -> bool:
        """Whether ``table``'s part goes into the Timeline: it has rows (in a windowed read: the
        whole table has, so that an empty window keeps the whole read's columns and categories)."""
        if part is None:
            return False
        seen = self.window.seen.get(table) if self.window is not None else None
        return bool(seen.rows if seen is not None else len(part["start_ns"]))

    def graph_launch_rows(self, counts: dict[int, int]) -> int:
        """Rows of CUDA graph launches among API rows counted by name id (``counts``)."""
        lut = self.strings(np.asarray(list(counts), np.int64)) if counts else {}
        return sum(c for i, c in counts.items() if api_kind(strip_api_suffix(lut.get(i, ""))) is ApiKind.GRAPH_LAUNCH)

    def _labels_of(self, table: str, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes, distinct keys) of a label key column: in a windowed read, over the whole table's
        keys (``Window.seen``), so that the categories are those of the whole read."""
        seen = self.window.seen.get(table) if self.window is not None else None
        if seen is None:
            return factorize(key)
        uniq = seen.values("label")
        return (np.searchsorted(uniq, key) if len(uniq) else np.zeros(len(key), np.int64)), uniq

    def meta_kv(self) -> dict[str, str]:
        for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.has(t):
                return {str(k): str(v) for k, v in self.con.execute(f"SELECT name, value FROM {t}")}
        return {}

    def capture_kv(self) -> dict[str, str]:
        if not self.has("META_DATA_CAPTURE"):
            return {}
        return {str(k): str(v) for k, v in self.con.execute(
            "SELECT name, value FROM META_DATA_CAPTURE WHERE name NOT LIKE '%ENVIRONMENT%'")}

    # -- tables ------------------------------------------------------------------------------
    def kernels(self) -> dict | None:
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        if not self.has(t):
            return None
        cols = self.columns(t)
        name_col = "demangledName" if "demangledName" in cols else "shortName"
        gid = "COALESCE(graphId,-1)" if "graphId" in cols else "-1"
        gnode = "COALESCE(graphNodeId,-1)" if "graphNodeId" in cols else "-1"
        s, e, dev, strm, corr, gpid, name, g, node = self.fetch(
            t, ["start", "end", "deviceId", "streamId", "COALESCE(correlationId,-1)",
                "COALESCE(globalPid,0)", name_col, gid, gnode], track=_device_track(6, 8))
        names = self.categorical(name, table=t)
        del name
        return {"start_ns": s, "end_ns": e, "kind": _kind_col(DeviceKind.KERNEL, len(s)),
                "name": names, "device": dev, "stream": strm, "pid": (gpid >> 24) & _MASK24,
                "correlation": corr, "graph_id": g, "graph_node": node, "bytes": np.full(len(s), -1, np.int64)}

    def copies(self, table: str, kind: DeviceKind) -> dict | None:
        if not self.has(table):
            return None
        cols = self.columns(table)
        ck = "copyKind" if "copyKind" in cols and kind is DeviceKind.MEMCPY else "0"
        # the memory each side of a copy lives in (pageable host memory: an unpinned, synchronous copy)
        sk = "COALESCE(srcKind,-1)" if "srcKind" in cols and kind is DeviceKind.MEMCPY else "-1"
        dk = "COALESCE(dstKind,-1)" if "dstKind" in cols and kind is DeviceKind.MEMCPY else "-1"
        gnode = "COALESCE(graphNodeId,-1)" if "graphNodeId" in cols else "-1"
        nbytes = "COALESCE(bytes,-1)" if "bytes" in cols else "-1"
        s, e, dev, strm, corr, gpid, k, node, nb, src, dst = self.fetch(
            table, ["start", "end", "deviceId", "streamId", "COALESCE(correlationId,-1)",
                    "COALESCE(globalPid,0)", f"COALESCE({ck},0)", gnode, nbytes, sk, dk],
            track=_device_track(None, 7, lambda c: _copy_key(c[6], c[9], c[10])))
        inv, uniq = self._labels_of(table, _copy_key(k, src, dst))
        if kind is DeviceKind.MEMCPY:
            labels = [_copy_label(int(u) // 4096, int(u) // 64 % 64 - 1, int(u) % 64 - 1) for u in uniq.tolist()]
        else:
            labels = ["Memset"] * len(uniq)
        return {"start_ns": s, "end_ns": e, "kind": _kind_col(kind, len(s)),
                "name": cat_from_codes(inv, labels), "device": dev, "stream": strm,
                "pid": (gpid >> 24) & _MASK24, "correlation": corr,
                "graph_id": np.full(len(s), -1, np.int64), "graph_node": node, "bytes": nb}

    def graph_execs(self) -> dict | None:
        t = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
        if not self.has(t):
            return None
        cols = self.columns(t)
        gid = "COALESCE(graphId,-1)" if "graphId" in cols else "-1"
        s, e, dev, strm, corr, gpid, g = self.fetch(
            t, ["start", "end", "deviceId", "streamId", "COALESCE(correlationId,-1)",
                "COALESCE(globalPid,0)", gid], track=_device_track(None, None, lambda c: c[6]))
        inv, uniq = self._labels_of(t, g)
        return {"start_ns": s, "end_ns": e, "kind": _kind_col(DeviceKind.GRAPH, len(s)),
                "name": cat_from_codes(inv, [f"cudaGraph {u}" for u in uniq.tolist()]),
                "device": dev, "stream": strm, "pid": (gpid >> 24) & _MASK24,
                "correlation": corr, "graph_id": g, "graph_node": np.full(len(s), -1, np.int64),
                "bytes": np.full(len(s), -1, np.int64)}

    def api(self) -> dict | None:
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        if not self.has(t):
            return None
        # 0 = CUDA runtime, 1 = CUDA driver; 2022.2 adds a duplicate row per call with class 67.
        where = "eventClass IN (0, 1)" if "eventClass" in self.columns(t) else ""
        s, e, gtid, corr, name = self.fetch(
            t, ["start", "end", "COALESCE(globalTid,0)", "COALESCE(correlationId,-1)", "nameId"], where,
            track={"pid": _pid_of(2), "name": lambda c: c[4]})
        names = self.categorical(name, strip_api_suffix, table=t)
        del name
        kinds = _kinds(names, api_kind)
        return {"start_ns": s, "end_ns": e, "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24,
                "name": names, "kind": kinds, "correlation": corr}

    def osrt(self) -> dict | None:
        """OS runtime calls (``OSRT_API``) as API rows of kind os_io / os_wait / os_other."""
        t = "OSRT_API"
        if not self.has(t) or not self.count(t):
            return None
        s, e, gtid, name = self.fetch(t, ["start", "end", "COALESCE(globalTid,0)", "nameId"],
                                      track={"pid": _pid_of(2), "name": lambda c: c[3]})
        names = self.categorical(name, table=t)
        kinds = _kinds(names, lambda c: os_kind(str(c)))
        return {"start_ns": s, "end_ns": e, "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24,
                "name": names, "kind": kinds, "correlation": np.full(len(s), -1, np.int64)}

    def nvtx(self) -> tuple[dict | None, int]:
        """(ranges, number of marks). Marks (end NULL) are excluded from ranges."""
        t = "NVTX_EVENTS"
        if not self.has(t):
            return None, 0
        cols = self.columns(t)
        types = f"({NVTX_PUSH_RANGE}, {NVTX_PUSH_POP}, {NVTX_START_END})"
        where = f"WHERE n.eventType IN {types} AND n.end IS NOT NULL"
        dom_sql = "COALESCE(domainId,0)" if "domainId" in cols else "0"
        # NOTE: read whole in a windowed read too (it is small, and the nesting depths and the
        # steps are those of the whole table); cut to the window after
        s, e, etype, gtid, dom = fetch_ints(
            self.arrow, t, ["start", "end", "eventType", "COALESCE(globalTid,0)", dom_sql],
            where.replace("WHERE ", "").replace("n.", ""), max_rows=self.max_rows)
        has_tid = "textId" in cols
        label = capped("COALESCE(n.text, s.value, '')" if has_tid else "COALESCE(n.text, '')")
        label_sql = (f"{label} FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId" if has_tid
                     else f"{label} FROM NVTX_EVENTS n")
        codes, uniq = self._labels(f"SELECT {label_sql} {where} ORDER BY n.rowid", len(s))
        marks = self.count(t, "WHERE end IS NULL AND eventType = 34")
        pid, tid = (gtid >> 24) & _MASK24, gtid & _MASK24
        names, attrs = split_coded_labels(codes, uniq)
        del codes
        domains = self._domain_names(dom, pid)
        depth = nesting_depth(s, e, gtid, np.isin(etype, (NVTX_PUSH_RANGE, NVTX_PUSH_POP)))
        return {"start_ns": s, "end_ns": e, "pid": pid, "tid": tid, "name": names,
                "domain": domains, "attrs": attrs, "depth": depth}, marks

    def _labels(self, sql: str, n: int) -> tuple[np.ndarray, list[str]]:
        """The one text column of ``sql`` as (codes, distinct strings), dictionary-encoded in Arrow:
        no Python string per row. ``n``: the rows expected (else the table changed under us)."""
        codes: list[np.ndarray] = []
        uniq: list[str] = []
        index: dict[str, int] = {}
        for batch in arrow_query(self.arrow, sql, "NVTX_EVENTS"):
            col = batch.column(0)
            if col.null_count or str(col.type) not in ("string", "large_string"):
                raise sqlite3.DatabaseError(f"malformed values in NVTX_EVENTS: {col.type} labels")
            enc = col.dictionary_encode()
            remap = np.fromiter((index.setdefault(v, len(index)) for v in enc.dictionary.to_pylist()),
                                np.int64, len(enc.dictionary))
            codes.append(remap[enc.indices.to_numpy(zero_copy_only=False)])
        uniq = list(index)
        out = np.concatenate(codes) if codes else np.zeros(0, np.int64)
        if len(out) != n:
            raise sqlite3.DatabaseError("NVTX label count mismatch")
        return out, uniq

    def _domain_names(self, dom: np.ndarray, pid: np.ndarray) -> pd.Categorical:
        """domainId -> name from domain-create rows (per process, then any process)."""
        by_pid: dict[tuple[int, int], str] = {}
        by_id: dict[int, str] = {}
        if "textId" in self.columns("NVTX_EVENTS"):
            q = (f"SELECT COALESCE(n.globalTid,0), n.domainId, {capped('COALESCE(n.text, s.value)')} FROM "
                 "NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = ?")
        else:
            q = "SELECT COALESCE(globalTid,0), domainId, text FROM NVTX_EVENTS WHERE eventType = ?"
        for g, d, name in self.con.execute(q, (NVTX_DOMAIN_CREATE,)):
            if d is None or name is None:
                continue
            by_pid[((int(g) >> 24) & _MASK24, int(d))] = str(name)
            by_id.setdefault(int(d), str(name))
        # NOTE: (pid, domain) pairs hashed, not sorted: a row-wise np.unique of 2 M ranges took ~1 s
        pc, pu = pd.factorize(pid)
        dc, du = pd.factorize(dom)
        m = max(len(du), 1)
        inv, pairs = pd.factorize(pc.astype(np.int64) * m + dc)
        vals = []
        for k in pairs.tolist():
            p, d = int(pu[k // m]), int(du[k % m])
            vals.append("" if d == 0 else by_pid.get((p, d), by_id.get(d, f"domain{d}")))
        cats, codes = np.unique(np.asarray(vals, dtype=object), return_inverse=True)
        return pd.Categorical.from_codes(codes.reshape(-1)[inv] if len(dom) else
                                         np.zeros(0, np.int64), categories=cats.tolist())

    def devices(self, used: set[int]) -> tuple[list[DeviceInfo], int]:
        if not self.has("TARGET_INFO_GPU"):
            return [DeviceInfo(i) for i in sorted(used)], 0
        cols = self.columns("TARGET_INFO_GPU")
        sm = "smCount" if "smCount" in cols else "0"
        mem = "totalMemory" if "totalMemory" in cols else "0"
        rows = {int(i): DeviceInfo(int(i), str(nm or ""), int(s or 0), int(m or 0))
                for i, nm, s, m in self.con.execute(
                    f"SELECT id, name, {sm}, {mem} FROM TARGET_INFO_GPU")}
        picked = [rows.get(i, DeviceInfo(i)) for i in sorted(used)] if used else list(rows.values())
        if rows and (unknown := used - rows.keys()):
            self.suspect.append(f"device id(s) {sorted(unknown)[:4]} not in TARGET_INFO_GPU")
        return picked, len(rows)

    def thread_names(self, pids: set[int]) -> dict[str, str]:
        if not self.has("ThreadNames"):
            return {}
        rows = self.con.execute(f"SELECT t.globalTid, {capped('s.value')} FROM ThreadNames t "
                                "JOIN StringIds s ON s.id = t.nameId").fetchall()
        return {f"{(int(g) >> 24) & _MASK24}:{int(g) & _MASK24}": str(v)
                for g, v in rows if g is not None and ((int(g) >> 24) & _MASK24) in pids}


def _copy_key(kind: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One int per (copy kind, source memory, destination memory): a copy's label."""
    return kind.astype(np.int64) * 4096 + (src.astype(np.int64) + 1) * 64 + (dst.astype(np.int64) + 1)


def _device_track(name: int | None, node: int | None, label: Track | None = None) -> dict[str, Track]:
    """What a windowed read counts over a device table (start, end, deviceId, streamId,
    correlationId, globalPid first): processes, devices, the name column ``name`` or the label key
    ``label``, and the rows that are graph nodes (``node``: their node id column)."""
    out: dict[str, Track] = {"pid": _pid_of(5), "device": lambda c: c[2]}
    if name is not None:
        out["name"] = lambda c, i=name: c[i]    # type: ignore[misc]
    if label is not None:
        out["label"] = label
    if node is not None:
        out["node"] = lambda c, i=node: c[i] >= 0   # type: ignore[misc]
    return out


def _kinds(names: pd.Categorical, kind_of: Callable[[str], ApiKind]) -> pd.Categorical:
    """ApiKind per row of the categorical ``names``, mapped once per distinct name (codes to codes:
    no string per row)."""
    order = [k.value for k in ApiKind]
    lut = np.asarray([order.index(kind_of(c).value) for c in names.categories], dtype=np.int8)
    codes = lut[names.codes] if len(lut) else np.zeros(len(names), np.int8)
    return pd.Categorical.from_codes(codes, categories=order)  # type: ignore[call-overload]


def _read_host(path: Path, window: Window | None = None) -> tuple[dict | None, tuple[dict | None, int], _Reader]:
    """API and NVTX tables on their own connection (run in a worker thread), and the reader (for
    its notes: ``suspect``, ``missing_strings``, ``named_rows``). ``window``: a windowed read's."""
    con = connect_readonly(path)
    try:
        r = _Reader(path, con, window)
        try:
            api = concat_sorted([narrow_ids(p) for t, p in (("CUPTI_ACTIVITY_KIND_RUNTIME", r.api()),
                                                            ("OSRT_API", r.osrt())) if p is not None and r.holds(t, p)])
            ranges, marks = r.nvtx()
        finally:
            r.close()
        if window is not None:
            ranges = sort_columns(ranges)
            if ranges is not None and len(ranges["start_ns"]):
                window.ranges_rows = len(ranges["start_ns"])
                window.ranges_span = (int(ranges["start_ns"].min()), int(ranges["end_ns"].max()))
            return window.clip(api), (crop_columns(ranges, window.lo, window.hi), marks), r
        return api, (sort_columns(ranges), marks), r
    finally:
        con.close()



#: the big tables ``read_nsys`` scans in rowid chunks (for progress estimates)
SCANNED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def scan_estimate(path: str | Path) -> int:
    """Rowids ``read_nsys`` will scan (sum of rowid spans of the big tables; 0 when unknown)."""
    try:
        con = connect_readonly(Path(path))
    except Exception:  # noqa: BLE001 - the read itself reports a bad file
        return 0
    try:
        have = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        total = 0
        for t in SCANNED_TABLES:
            if t in have:
                lo, hi = rowid_bounds(con, t)
                if lo is not None and hi is not None:
                    total += int(hi) - int(lo) + 1
        return total
    except sqlite3.DatabaseError:
        return 0
    finally:
        con.close()


def read_nsys(path: str | Path, rank: int = 0, window: tuple[int, int] | None = None,
              expect_rows: int | None = None) -> Timeline:
    """Read one nsys SQLite export. ``rank`` is the rank of its first process (several processes
    in one file get consecutive ranks in pid order). ``window`` (lo, hi) ns: only the rows
    overlapping it, clipped to it, the metadata of the whole file: ``diagnose.crop`` of the whole
    read, in memory proportional to the window (``nsys_window.py``); ``expect_rows``: the rows a
    table's window is expected to hold (its arrays are allocated for that many first)."""
    path = Path(path)
    check_side_files(path)
    con = connect_readonly(path)
    try:
        checked = path.stat().st_size <= QUICK_CHECK_ALWAYS_BYTES
        if checked:
            check_integrity(path, con)
        reader = _Reader(path, con, None if window is None else Window(*window, expect_rows=expect_rows))
        try:
            return _read(path, reader, rank, checked)
        except (sqlite3.DatabaseError, ValueError, TimelineError) as exc:
            if not checked and not isinstance(exc, TraceError):
                check_integrity(path, con, why=str(exc))  # a damaged file says so rather than why
            raise
        finally:
            reader.close()
    finally:
        con.close()


#: small tables read whole: always checked (milliseconds) when the file is too big for a full check
_SMALL_TABLES = ("sqlite_master", "StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE",
                 "TARGET_INFO_GPU", "ANALYSIS_DETAILS", "TARGET_INFO_SESSION_START_TIME", "PROCESSES",
                 "ThreadNames")


def _scan_whole(path: Path, r: _Reader) -> ScannedTables:
    """The device tables through ``r`` and the host tables on a second connection, whole (or the
    rows of ``r.window``), with the facts the metadata is built from.

    NOTE: the API and NVTX tables are read in a thread: ADBC releases the GIL while SQLite steps
    and Arrow fills, so the device and the host scans overlap."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        host = pool.submit(_read_host, path, r.window)
        # id columns as int32 where they fit (timeline.narrow_ids) before the sort: ~0.4 GB less per GB
        parts = [narrow_ids(p) for t, p in (
            ("CUPTI_ACTIVITY_KIND_KERNEL", r.kernels()),
            ("CUPTI_ACTIVITY_KIND_MEMCPY", r.copies("CUPTI_ACTIVITY_KIND_MEMCPY", DeviceKind.MEMCPY)),
            ("CUPTI_ACTIVITY_KIND_MEMSET", r.copies("CUPTI_ACTIVITY_KIND_MEMSET", DeviceKind.MEMSET)),
            ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", r.graph_execs())) if p is not None and r.holds(t, p)]
        device = concat_sorted(parts)
        del parts
        if r.window is not None:
            device = r.window.clip(device)
        api, (ranges, marks), hr = host.result()
    r.missing_strings += hr.missing_strings
    r.named_rows += hr.named_rows
    r.suspect += hr.suspect
    f = _facts(device, api, ranges) if r.window is None else window_facts(
        r.window, r.window.ranges_rows, r.window.ranges_span, r.graph_launch_rows)
    return device, api, ranges, marks, f


#: (device columns, API columns, NVTX ranges, NVTX marks, the facts of the tables: ``Facts``, or
#: ``TableFacts`` with the device and API columns None where a scan kept them elsewhere)
ScannedTables = tuple[dict | None, dict | None, dict | None, int, "Facts | TableFacts"]


def _read(path: Path, r: _Reader, rank: int, checked: bool = False,
          scan: Callable[[Path, _Reader], ScannedTables] | None = None) -> Timeline:
    if "StringIds" not in r.tables:
        raise TraceError(path, "SQLite database, but not an Nsight Systems export "
                               "(no StringIds table)")
    meta_kv = r.meta_kv()
    capture = r.capture_kv()
    captured = ([str(v) for (v,) in r.con.execute(
        "SELECT value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE'")]
        if r.has("META_DATA_CAPTURE") else [])
    # the device and host tables, each whole or windowed (``_scan_whole``) unless ``scan`` reads
    # them otherwise (``nsys_spill``: into time buckets on disk, the columns None here)
    device, api, ranges, marks, f = (scan or _scan_whole)(path, r)
    if isinstance(f, TableFacts):
        f = f.as_facts(ranges)
    n_dev, n_api, n_rng = f.n_dev, f.n_api, f.n_rng
    if n_dev + n_api + n_rng == 0:
        raise TraceError(path, "nsys export holds no CUDA or NVTX events (empty trace)")

    # ranks go to processes with GPU activity (helper processes that only call the API, e.g. a
    # subprocess probing the driver, share the first rank)
    host_pids = f.api_pids
    pids = f.dev_pids if n_dev else host_pids
    for cols in (device, api, ranges):
        if cols is not None and (len(cols["start_ns"]) or r.window is not None):
            cols["rank"] = _ranks(cols["pid"], pids, rank)
    rank_of = {p: rank + i for i, p in enumerate(pids)}

    schema = meta_kv.get("EXPORT_SCHEMA_VERSION", "")
    meta = TimelineMeta(format=SourceFormat.NSYS_SQLITE, sources=[str(path)],
                        tool_version=meta_kv.get("EXPORT_PRODUCT_VERSION", ""),
                        ranks=sorted(set(rank_of.values())) or [rank],
                        world_size=max(len(pids), 1))
    used = f.devices
    meta.devices, gpus_on_host = r.devices(used)
    if r.has("ANALYSIS_DETAILS"):
        row = r.con.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        if row and row[0] is not None and row[1] is not None:
            lo, hi = int(row[0]), int(row[1])
            # NOTE: most exports time events from the session start (0), while ANALYSIS_DETAILS holds
            # the session's own clock: then the session is [0, duration]
            first = int(f.dev_first) if f.dev_first is not None else lo
            if n_dev and not lo <= first <= hi and 0 <= first <= hi - lo:
                lo, hi = 0, hi - lo
            meta.window_start_ns, meta.window_end_ns = lo, hi
            if f.dev_last is not None and (first < lo or f.dev_last > hi):
                r.suspect.append("device rows outside the session's bounds (ANALYSIS_DETAILS)")
    if r.has("TARGET_INFO_SESSION_START_TIME"):
        row = r.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and row[0]:
            meta.extra["nsys.utc_start_ns"] = int(row[0])
    if meta.window_end_ns <= meta.window_start_ns:      # no session bounds: span of the events
        meta.window_start_ns = int(min(a for a, _ in f.spans))
        meta.window_end_ns = int(max(b for _, b in f.spans))
    derived = meta_kv.get("DERIVED_WINDOW_NS")
    if derived:
        try:
            lo, hi = (int(x) for x in derived.split("-", 1))
            meta.window_start_ns, meta.window_end_ns = lo, hi
        except ValueError:
            pass
        meta.warn(WarningCode.WINDOW_CUT, f"the export was trimmed to the window {derived} ns: "
                  "work started before it (e.g. launches of its first kernels) is missing")
    n_kern = f.kinds.get(DeviceKind.KERNEL.value, 0)
    n_graph_exec = f.kinds.get(DeviceKind.GRAPH.value, 0)
    graph_mode = capture.get("CUDA_GRAPH_TRACE_OPTIONS:MODE", "")
    n_graph_launch = f.graph_launches
    n_node_kernels = f.node_rows
    meta.extra.update({
        "nsys.schema_version": schema, "nsys.meta_table": next(
            (t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if r.has(t)), ""),
        "nsys.graph_trace_mode": graph_mode, "nsys.capture_event_types": captured, "nsys.gpus_on_host": gpus_on_host,
        "nsys.nvtx_marks": marks, "nsys.thread_names": r.thread_names(set(pids) | set(host_pids)),
        "nsys.process_names": ({int(p): str(nm) for p, nm in r.con.execute(
            "SELECT pid, name FROM PROCESSES") if p in rank_of or p in host_pids}
            if r.has("PROCESSES") else {}),
        "nsys.sync_rows": r.count("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
        if r.has("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION") else 0,
    })
    if n_kern:
        meta.traced.add(Traced.KERNELS)
    if f.kinds.get(DeviceKind.MEMCPY.value, 0) + f.kinds.get(DeviceKind.MEMSET.value, 0):
        meta.traced.add(Traced.MEMCPY)
    if n_api:
        meta.traced.add(Traced.API)
    if n_rng:
        meta.traced.add(Traced.NVTX)
    if n_node_kernels:
        meta.traced.add(Traced.GRAPH_NODES)
    if not n_kern:
        meta.warn(WarningCode.NO_KERNELS, "no kernel rows: was CUDA tracing on (nsys -t cuda)?")
    if not n_api:
        meta.warn(WarningCode.NO_API, "no CUDA API rows: launches and syncs cannot be attributed")
    if not n_rng:
        if "NvtxEvents" in captured:
            meta.warn(WarningCode.NO_NVTX, "NVTX was traced but holds no ranges: the program "
                      "emitted none (enable the engine's NVTX ranges)")
        else:
            meta.warn(WarningCode.NO_NVTX, "no NVTX ranges: stages cannot be named (nsys -t nvtx "
                      "and an instrumented engine are needed)")
    if (n_graph_launch or n_graph_exec) and not n_node_kernels:
        meta.warn(WarningCode.GRAPH_NOT_PER_NODE,
                  f"{max(n_graph_launch, n_graph_exec)} CUDA graph launch(es) without per-node "
                  "kernels: capture with --cuda-graph-trace=node to see the kernels inside graphs")
    if len(pids) > 1:
        meta.warn(WarningCode.MULTI_PROCESS, f"{len(pids)} processes with GPU activity "
                  f"(pids {pids[:8]}); ranks assigned in pid order from {rank}")
    if schema not in KNOWN_SCHEMAS:
        meta.warn(WarningCode.UNKNOWN_SCHEMA, f"export schema version {schema or '(none)'} "
                  "was not seen in testing; columns are read by name and may be incomplete")
    known = meta.extra["nsys.process_names"]
    if r.has("PROCESSES") and known and (phantom := set(pids) - set(known)):
        r.suspect.append(f"pid(s) {sorted(phantom)[:4]} not in PROCESSES")
    if r.missing_strings:
        r.suspect.append(f"{r.missing_strings} row(s) name strings missing from StringIds")
    if not checked:
        check_integrity(path, r.con, tables=tuple(t for t in _SMALL_TABLES if t == "sqlite_master" or r.has(t)))
        if r.suspect:
            check_integrity(path, r.con, why="; ".join(r.suspect))
    if r.missing_strings:
        if 2 * r.missing_strings >= r.named_rows:
            raise TraceError(path, f"damaged export: {r.missing_strings} of {r.named_rows} rows name strings "
                                   "that are not in StringIds; re-export it from the .nsys-rep report")
        meta.warn(WarningCode.CORRUPT, f"{r.missing_strings} of {r.named_rows} rows name strings that are "
                  "not in StringIds (shown as empty names): the export is damaged")
    # NOTE: the same validation as Timeline.build, one table at a time, keeping the fetched arrays
    # as the frames' columns (no consolidating copy: ~1.8 s and ~0.5 GB less on a 1 GB export).
    device_df = _validated(device, "device")
    api_df = _validated(api, "api")
    ranges_df = _validated(ranges, "ranges")
    return Timeline(device_df, api_df, ranges_df, validate_table(None, "counters"), meta)


def _validated(cols: dict | None, table: str) -> pd.DataFrame:
    cols = narrow_ids(cols)
    df = validate_table(None if cols is None else pd.DataFrame(cols, copy=False), table, copy=False)
    if cols is not None:
        cols.clear()
    return df


def _facts(device: dict | None, api: dict | None, ranges: dict | None) -> Facts:
    """``Facts`` of a whole read, from its columns."""
    n_dev = 0 if device is None else len(device["start_ns"])
    n_api = 0 if api is None else len(api["start_ns"])
    kinds: dict[str, int] = {}
    if device is not None and n_dev:
        cat = device["kind"]
        counts = np.bincount(np.asarray(cat.codes), minlength=len(cat.categories))
        kinds = {str(k): int(c) for k, c in zip(cat.categories, counts.tolist())}
    return Facts(
        n_dev=n_dev, n_api=n_api, n_rng=0 if ranges is None else len(ranges["start_ns"]),
        dev_pids=sorted(set(pd.unique(device["pid"]).tolist())) if device is not None and n_dev else [],
        api_pids=sorted(set(pd.unique(api["pid"]).tolist())) if api is not None and n_api else [],
        devices=set(pd.unique(device["device"]).tolist()) if device is not None and n_dev else set(),
        dev_first=int(device["start_ns"].min()) if device is not None and n_dev else None,
        dev_last=int(device["end_ns"].max()) if device is not None and n_dev else None,
        kinds=kinds,
        graph_launches=int((api["kind"] == ApiKind.GRAPH_LAUNCH.value).sum()) if api is not None and n_api else 0,
        node_rows=int((device["graph_node"] >= 0).sum()) if device is not None and n_dev else 0,
        spans=[(int(c["start_ns"].min()), int(c["end_ns"].max())) for c in (device, api, ranges)
               if c is not None and len(c["start_ns"])])


def _ranks(pid: np.ndarray, pids: list[int], rank: int) -> np.ndarray:
    """rank + index of each row's pid among ``pids`` (sorted); ``rank`` for other pids."""
    if len(pids) <= 1:
        return np.full(len(pid), rank, np.int64)
    arr = np.asarray(pids, np.int64)
    pos = np.clip(np.searchsorted(arr, pid), 0, len(arr) - 1)
    return np.where(arr[pos] == pid, rank + pos, rank).astype(np.int64)


def read_ranges(path: str | Path, rank: int = 0, pids: list[int] | None = None) -> pd.DataFrame:
    """The NVTX ranges of an export alone (the Timeline's ``ranges`` table, as a whole read gives
    it), ranks given by ``pids`` (sorted: the processes with device rows, else every range's own
    rank). Reads the NVTX table only: the steps of a huge export are found before its big tables."""
    path = Path(path)
    check_side_files(path)
    con = connect_readonly(path)
    try:
        r = _Reader(path, con)
        try:
            ranges, _ = r.nvtx()
        finally:
            r.close()
    finally:
        con.close()
    ranges = sort_columns(ranges)
    if ranges is not None:
        ranges["rank"] = _ranks(ranges["pid"], sorted(pids or []), rank)
    return _validated(ranges, "ranges")
