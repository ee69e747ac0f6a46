"""Nsight Systems SQLite export -> Timeline (schemas of nsys 2022.1 to 2026.2).

Opened strictly read-only (``mode=ro&immutable=1``): no journal, no index, nothing written beside
the user's file. Only the needed columns are selected; the big tables are scanned through ADBC into
Arrow record batches (C, GIL released: the device and the host tables on two cores), their
integer columns land in numpy arrays, names become categoricals over the few distinct StringIds.
The tables are read by ``_Reader``: the connection and the integer columns (``nsys_tables``), the
names (``nsys_strings``), the device side (``nsys_device``) and the host side (``nsys_host``).

NOTE: correlation ids are unique per process only; the Timeline keeps ``pid`` beside them.
NOTE: ``immutable=1`` ignores a ``-wal`` log or hot ``-journal`` beside the file: such a file is
refused (``sqlite_integrity.check_side_files``) rather than read stale or torn. Structure is
verified with ``PRAGMA quick_check`` (``sqlite_integrity.check_integrity``): always on files up to
``QUICK_CHECK_ALWAYS_BYTES``, on larger ones per small table always and in full when what was read
looks inconsistent: rows against rowids, pages no b-tree reaches (``btree_reach``).
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import (
    ApiKind,
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
from srtscope.analyzers.model.units import clip_text, fmt_ns
from srtscope.analyzers.readers.btree_reach import unreached
from srtscope.analyzers.readers.columnar import concat_sorted, rowid_bounds, sort_columns
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.nsys_device import DeviceTables
from srtscope.analyzers.readers.nsys_facts import TableFacts
from srtscope.analyzers.readers.nsys_host import HostTables
from srtscope.analyzers.readers.nsys_tables import connect_readonly
from srtscope.analyzers.readers.nsys_window import Facts, Window, crop_columns, window_facts
from srtscope.analyzers.readers.sqlite_integrity import check_integrity, check_side_files

KNOWN_SCHEMAS = frozenset({"2.9.1", "3.1.2", "3.1.7", "3.13.2", "3.16.1", "3.17.1", "3.20.2",
                           "3.24.14", "3.25.0"})

#: Files up to this size get a full ``PRAGMA quick_check`` before the read (it costs ~4 s per GB,
#: about a fifth of the read: larger files get it only when what was read looks inconsistent).
QUICK_CHECK_ALWAYS_BYTES = 16 << 20


class _Reader(DeviceTables, HostTables):
    """An export's tables (``nsys_tables``), names (``nsys_strings``), device side (``nsys_device``)
    and host side (``nsys_host``) on one connection."""


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
            where = f"a {fmt_ns(hi - lo)} window ({lo / 1e9:.3f} s to {hi / 1e9:.3f} s of the session)"
        except ValueError:
            where = f"the window {clip_text(derived, 80)!r}"
        meta.warn(WarningCode.WINDOW_CUT, f"the export was trimmed to {where}: "
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
        if lost := unreached(path, r.con):   # pages read as nothing: a silently partial table
            r.suspect.append(lost)
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
