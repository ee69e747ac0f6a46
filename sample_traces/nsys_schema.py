"""Writer of Nsight Systems–schema SQLite files (the table layout of recent ``nsys export`` output).

Used to build labelled scenarios for tests and the large files of the reader benchmark. Times are
integer nanoseconds on one clock, as in real exports. Strings are interned into ``StringIds``.

    with NsysWriter("/tmp/x.sqlite", version="2025.3.1") as w:
        w.add_runtime(start, end, ["cudaLaunchKernel_v7000"] * n, pid=100, tid=101, correlation=corr)
        w.add_kernels(kstart, kend, names, device=0, stream=7, pid=100, correlation=corr)
        w.add_nvtx(rs, re, ["sched.schedule bs=32"] * m, pid=100, tid=101, domain="srtscope")

Activity tables are created on first use (lazy export, like nsys ≥ 2023), so a file without memset
rows has no ``CUPTI_ACTIVITY_KIND_MEMSET`` table. Thread/process ids are packed into ``globalTid`` /
``globalPid`` the way nsys does: ``(1 << 48) | pid << 24 | tid``.
NOTE: the writer keeps no rows in memory beyond the arrays of one ``add_*`` call.
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

HW_ID = 1 << 48

#: nsys release -> export schema version (from real exports; see SCHEMA_NOTES.md).
SCHEMA_VERSIONS: dict[str, str] = {
    "2022.1": "2.9.1", "2022.2": "2.9.1", "2023.1": "3.1.2", "2023.2": "3.1.7",
    "2024.5": "3.13.2", "2024.6": "3.16.1", "2025.1": "3.17.1", "2025.3": "3.20.2",
    "2026.1": "3.24.14", "2026.2": "3.25.0",
}

EVENT_CLASS_RUNTIME = 0
EVENT_CLASS_DRIVER = 1
NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 34, 59, 60, 75

_KERNEL_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "demangledName INTEGER NOT NULL",
    "shortName INTEGER NOT NULL", "mangledName INTEGER", "launchType INTEGER",
    "cacheConfig INTEGER", "registersPerThread INTEGER NOT NULL", "gridX INTEGER NOT NULL",
    "gridY INTEGER NOT NULL", "gridZ INTEGER NOT NULL", "blockX INTEGER NOT NULL",
    "blockY INTEGER NOT NULL", "blockZ INTEGER NOT NULL", "staticSharedMemory INTEGER NOT NULL",
    "dynamicSharedMemory INTEGER NOT NULL", "localMemoryPerThread INTEGER NOT NULL",
    "localMemoryTotal INTEGER NOT NULL", "gridId INTEGER NOT NULL",
    "sharedMemoryExecuted INTEGER", "graphNodeId INTEGER", "sharedMemoryLimitConfig INTEGER",
)
_RUNTIME_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "eventClass INTEGER NOT NULL",
    "globalTid INTEGER", "correlationId INTEGER", "nameId INTEGER NOT NULL",
    "returnValue INTEGER NOT NULL", "callchainId INTEGER",
)
_MEMCPY_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "bytes INTEGER NOT NULL",
    "copyKind INTEGER NOT NULL", "deprecatedSrcId INTEGER", "srcKind INTEGER", "dstKind INTEGER",
    "srcDeviceId INTEGER", "srcContextId INTEGER", "dstDeviceId INTEGER", "dstContextId INTEGER",
    "migrationCause INTEGER", "graphNodeId INTEGER", "virtualAddress INTEGER", "copyCount INTEGER",
)
_MEMSET_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "value INTEGER NOT NULL",
    "bytes INTEGER NOT NULL", "graphNodeId INTEGER", "memKind INTEGER",
)
_SYNC_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "deprecatedSyncType INTEGER",
    "syncType INTEGER NOT NULL", "eventId INTEGER NOT NULL", "eventSyncId INTEGER",
)
_GRAPH_TRACE_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "graphId INTEGER", "graphExecId INTEGER",
)
_NVTX_COLS = (
    "start INTEGER NOT NULL", "end INTEGER", "eventType INTEGER NOT NULL", "rangeId INTEGER",
    "category INTEGER", "color INTEGER", "text TEXT", "globalTid INTEGER", "endGlobalTid INTEGER",
    "textId INTEGER", "domainId INTEGER", "uint64Value INTEGER", "int64Value INTEGER",
    "doubleValue REAL", "uint32Value INTEGER", "int32Value INTEGER", "floatValue REAL",
    "jsonTextId INTEGER", "jsonText TEXT", "binaryData TEXT",
)
_OSRT_COLS = (
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "eventClass INTEGER NOT NULL",
    "globalTid INTEGER", "nameId INTEGER NOT NULL", "returnValue INTEGER NOT NULL",
    "nestingLevel INTEGER", "callchainId INTEGER",
)
EVENT_CLASS_OSRT = 27
SESSION_UTC_NS = 1_764_460_800_000_000_000      # 2025-11-30T00:00:00Z, the default session start
_GPU_COLS = (
    "vmId INTEGER NOT NULL", "id INTEGER NOT NULL", "name TEXT", "busLocation TEXT",
    "isDiscrete INTEGER", "l2CacheSize INTEGER", "totalMemory INTEGER", "memoryBandwidth INTEGER",
    "clockRate INTEGER", "smCount INTEGER", "pwGpuId INTEGER", "uuid TEXT", "luid INTEGER",
    "chipName TEXT", "cuDevice INTEGER", "computeMajor INTEGER", "computeMinor INTEGER",
)
_ENUM_EVENT_TYPE = [(33, "NVTX_CATEGORY", "NvtxCategory"), (34, "NVTX_MARK", "NvtxMark"),
                    (35, "NVTX_PUSH_RANGE", "NvtxPushRange"), (39, "NVTX_THREAD", "NvtxThread"),
                    (59, "NVTX_PUSHPOP_RANGE", "NvtxPushPopRange"),
                    (60, "NVTX_STARTEND_RANGE", "NvtxStartEndRange"),
                    (75, "NVTX_DOMAIN_CREATE", "NvtxDomainCreate"),
                    (76, "NVTX_DOMAIN_DESTROY", "NvtxDomainDestroy")]
_ENUM_EVENT_CLASS = [(0, "CUDA_RUNTIME", "CUDA runtime"), (1, "CUDA_DRIVER", "CUDA driver")]
_ENUM_MEMCPY = [(0, "UNKNOWN", "Unknown"), (1, "HTOD", "Host-to-Device"),
                (2, "DTOH", "Device-to-Host"), (8, "DTOD", "Device-to-Device"),
                (10, "PTOP", "Peer-to-Peer")]


def global_tid(pid: int | np.ndarray, tid: int | np.ndarray) -> np.ndarray:
    """Pack (pid, tid) the way nsys does; ``tid`` 0 gives the ``globalPid``."""
    return (np.int64(HW_ID) | (np.asarray(pid, np.int64) << 24) | np.asarray(tid, np.int64)).astype(np.int64)


def _col(value, n: int, name: str) -> np.ndarray:
    """Broadcast a scalar or check an array's length; returns an int64 array."""
    a = np.asarray(value if value is not None else -1)
    if a.ndim == 0:
        return np.full(n, int(a), dtype=np.int64)
    if len(a) != n:
        raise ValueError(f"{name}: length {len(a)} != {n}")
    return a.astype(np.int64)


def _nullable(a: np.ndarray) -> list:
    """int64 array with -1 for NULL -> list with None."""
    out = a.tolist()
    if (a < 0).any():
        out = [None if v < 0 else v for v in out]
    return out


class NsysWriter:
    """Write an nsys-schema SQLite export. ``version`` is the nsys release (``"2025.3.1"``).

    Versions before 2024.5 get ``EXPORT_META_DATA`` instead of ``META_DATA_EXPORT``; 2026.x kernel
    tables carry ``graphId`` (also added on any version when ``graph_id`` is passed).
    """

    def __init__(self, path: str | os.PathLike, version: str = "2025.3.1",
                 schema_version: str | None = None, capture_start_ns: int | None = None,
                 capture_end_ns: int | None = None, session_utc_ns: int = SESSION_UTC_NS) -> None:
        """``capture_start_ns`` / ``capture_end_ns`` widen the session bounds (``ANALYSIS_DETAILS``)
        beyond the events; ``session_utc_ns`` is the session's wall-clock start
        (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``)."""
        self.path = Path(path)
        if self.path.exists():
            self.path.unlink()
        self.version = version
        major = ".".join(version.split(".")[:2])
        self.schema_version = schema_version or SCHEMA_VERSIONS.get(major, "3.20.2")
        self._year = float(major) if major.replace(".", "").isdigit() else 2025.3
        self.con = sqlite3.connect(str(self.path))
        self.con.execute("PRAGMA journal_mode=OFF")
        self.con.execute("PRAGMA synchronous=OFF")
        self._strings: dict[str, int] = {}
        self._tables: set[str] = set()
        self._domains: dict[tuple[int, str], int] = {}
        self._processes: dict[int, str] = {}
        self._threads: dict[tuple[int, int], str] = {}
        self._meta_export: dict[str, str] = {}
        self._meta_capture: list[tuple[str, str]] = []
        self._t_min: int | None = capture_start_ns
        self._t_max: int | None = capture_end_ns
        self.session_utc_ns = int(session_utc_ns)
        self._grid = 0
        self._graph_id_col = self._year >= 2026.1
        self._create("StringIds", ("id INTEGER NOT NULL PRIMARY KEY", "value TEXT NOT NULL"))
        if self._year >= 2023.1:
            for name, rows in (("ENUM_NSYS_EVENT_TYPE", _ENUM_EVENT_TYPE),
                               ("ENUM_NSYS_EVENT_CLASS", _ENUM_EVENT_CLASS),
                               ("ENUM_CUDA_MEMCPY_OPER", _ENUM_MEMCPY)):
                self._create(name, ("id INTEGER NOT NULL PRIMARY KEY", "name TEXT", "label TEXT"))
                self.con.executemany(f"INSERT INTO {name} VALUES (?,?,?)", rows)

    # -- helpers -----------------------------------------------------------------------------
    def __enter__(self) -> NsysWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self, table: str, cols: Sequence[str]) -> None:
        if table not in self._tables:
            self.con.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
            self._tables.add(table)

    def intern(self, names: Iterable[str]) -> np.ndarray:
        """StringIds ids of ``names`` (array), adding new strings."""
        arr = np.asarray(names, dtype=object)
        uniq, inv = np.unique(arr.astype(str), return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int64)
        new = []
        for i, s in enumerate(uniq.tolist()):
            sid = self._strings.get(s)
            if sid is None:
                sid = self._strings[s] = len(self._strings)
                new.append((sid, s))
            ids[i] = sid
        if new:
            self.con.executemany("INSERT INTO StringIds VALUES (?,?)", new)
        return ids[inv.reshape(-1)]

    def _times(self, start_ns, end_ns, name: str) -> tuple[np.ndarray, np.ndarray]:
        s = np.asarray(start_ns, dtype=np.int64)
        e = _col(end_ns, len(s), f"{name} end_ns")
        if s.ndim != 1:
            raise ValueError(f"{name}: start_ns must be 1-D")
        closed = e >= 0
        if (e[closed] < s[closed]).any():
            raise ValueError(f"{name}: end_ns < start_ns")
        if len(s):
            lo, hi = int(s.min()), int(max(e.max(), s.max()))
            self._t_min = lo if self._t_min is None else min(self._t_min, lo)
            self._t_max = hi if self._t_max is None else max(self._t_max, hi)
        return s, e

    def _note_pid(self, pid) -> None:
        for p in np.unique(np.asarray(pid, dtype=np.int64)).tolist():
            self._processes.setdefault(int(p), "python")

    # -- public API --------------------------------------------------------------------------
    def add_gpu(self, id: int = 0, name: str = "NVIDIA H100 80GB HBM3", sm_count: int = 132,
                total_memory: int = 85_520_809_984, clock_rate_hz: int = 1_980_000_000,
                memory_bandwidth: int = 3_352_320_000_000, compute: tuple[int, int] = (9, 0)) -> None:
        self._create("TARGET_INFO_GPU", _GPU_COLS)
        self.con.execute(f"INSERT INTO TARGET_INFO_GPU VALUES ({','.join('?' * len(_GPU_COLS))})",
                         (HW_ID, id, name, f"0000:{id:02x}:00.0", 1, 52_428_800, total_memory,
                          memory_bandwidth, clock_rate_hz, sm_count, 0, f"uuid-{id}", 0, "GH100",
                          id, compute[0], compute[1]))

    def add_process(self, pid: int, name: str) -> None:
        self._processes[int(pid)] = name

    def add_thread(self, pid: int, tid: int, name: str) -> None:
        self._threads[(int(pid), int(tid))] = name

    def set_export_meta(self, name: str, value: str) -> None:
        """An extra META_DATA_EXPORT key, e.g. ``DERIVED_WINDOW_NS``."""
        self._meta_export[name] = str(value)

    def add_capture_meta(self, name: str, value: str) -> None:
        """A META_DATA_CAPTURE row, e.g. ``("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Graph")``."""
        self._meta_capture.append((name, str(value)))

    def add_kernels(self, start_ns, end_ns, names, device=0, stream=7, pid=1000, tid=None,
                    correlation=None, graph_id=None, graph_node=None, short_names=None) -> None:
        """Kernel rows. ``tid`` is accepted for symmetry but GPU tables carry only ``globalPid``."""
        s, e = self._times(start_ns, end_ns, "add_kernels")
        n = len(s)
        name_ids = self.intern(names) if n else np.zeros(0, np.int64)
        short_ids = self.intern(short_names) if short_names is not None else name_ids
        corr = _col(correlation, n, "correlation")
        gpid = global_tid(_col(pid, n, "pid"), 0)
        self._note_pid(pid)
        grid_id = np.arange(self._grid, self._grid + n, dtype=np.int64)
        self._grid += n
        gnode = _col(graph_node, n, "graph_node")
        cols = list(_KERNEL_COLS)
        use_gid = self._graph_id_col or graph_id is not None
        if use_gid and "graphId INTEGER" not in cols:
            cols.append("graphId INTEGER")
        if "CUPTI_ACTIVITY_KIND_KERNEL" in self._tables:
            have = {r[1] for r in self.con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
            if use_gid and "graphId" not in have:
                self.con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL ADD COLUMN graphId INTEGER")
        self._create("CUPTI_ACTIVITY_KIND_KERNEL", cols)
        dev, strm = _col(device, n, "device"), _col(stream, n, "stream")
        z = [0] * n
        rows = zip(s.tolist(), e.tolist(), dev.tolist(), [1] * n, [None] * n, strm.tolist(),
                   _nullable(corr), gpid.tolist(), name_ids.tolist(), short_ids.tolist(),
                   name_ids.tolist(), [1] * n, [0] * n, [32] * n, [128] * n, [1] * n, [1] * n,
                   [256] * n, [1] * n, [1] * n, z, z, z, z, grid_id.tolist(), z, _nullable(gnode),
                   z)
        names_sql = ("start,end,deviceId,contextId,greenContextId,streamId,correlationId,globalPid,"
                     "demangledName,shortName,mangledName,launchType,cacheConfig,registersPerThread,"
                     "gridX,gridY,gridZ,blockX,blockY,blockZ,staticSharedMemory,dynamicSharedMemory,"
                     "localMemoryPerThread,localMemoryTotal,gridId,sharedMemoryExecuted,graphNodeId,"
                     "sharedMemoryLimitConfig")
        if use_gid:
            gid = _col(graph_id, n, "graph_id")
            rows = (r + (g,) for r, g in zip(rows, _nullable(gid)))
            names_sql += ",graphId"
        k = names_sql.count(",") + 1
        self.con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({names_sql}) "
                             f"VALUES ({','.join('?' * k)})", rows)

    def add_runtime(self, start_ns, end_ns, names, pid=1000, tid=1000, correlation=None,
                    event_class=None) -> None:
        """CUDA runtime/driver API rows. ``event_class`` defaults to 1 (driver) for ``cu*`` names
        that are not ``cuda*``, else 0 (runtime)."""
        s, e = self._times(start_ns, end_ns, "add_runtime")
        n = len(s)
        arr = np.asarray(names, dtype=object)
        name_ids = self.intern(arr) if n else np.zeros(0, np.int64)
        if event_class is None:
            uniq, inv = np.unique(arr.astype(str), return_inverse=True)
            cls = np.array([EVENT_CLASS_DRIVER if u.startswith("cu") and not u.startswith("cuda")
                            else EVENT_CLASS_RUNTIME for u in uniq.tolist()], np.int64)
            ec = cls[inv.reshape(-1)] if n else np.zeros(0, np.int64)
        else:
            ec = _col(event_class, n, "event_class")
        gtid = global_tid(_col(pid, n, "pid"), _col(tid, n, "tid"))
        self._note_pid(pid)
        self._create("CUPTI_ACTIVITY_KIND_RUNTIME", _RUNTIME_COLS)
        rows = zip(s.tolist(), e.tolist(), ec.tolist(), gtid.tolist(),
                   _nullable(_col(correlation, n, "correlation")), name_ids.tolist(), [0] * n,
                   [None] * n)
        self.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)", rows)

    def _domain_id(self, pid: int, tid: int, domain: str | None, t_ns: int) -> int:
        if not domain:
            return 0
        key = (pid, domain)
        did = self._domains.get(key)
        if did is None:
            did = self._domains[key] = len(self._domains) + 1
            self._create("NVTX_EVENTS", _NVTX_COLS)
            self.con.execute("INSERT INTO NVTX_EVENTS (start,end,eventType,text,globalTid,domainId) "
                             "VALUES (?,?,?,?,?,?)",
                             (t_ns, None, NVTX_DOMAIN_CREATE, domain,
                              int(global_tid(pid, tid)), did))
        return did

    def add_nvtx(self, start_ns, end_ns, texts, pid=1000, tid=1000, domain: str | None = None,
                 event_type: int = NVTX_PUSH_POP, registered: bool = False) -> None:
        """NVTX rows on one (pid, tid) [arrays allowed]. ``domain`` other than None/"" emits a
        domain-create row (type 75) once per process. ``registered`` stores the text through
        ``textId`` (as registered strings are) instead of ``text``. ``event_type`` 34 (mark)
        writes ``end`` NULL; 60 (start/end) also sets ``rangeId`` and ``endGlobalTid``."""
        if event_type == NVTX_MARK:
            end_ns = start_ns  # marks are instants: end is written NULL
        s, e = self._times(start_ns, end_ns, "add_nvtx")
        n = len(s)
        pids, tids = _col(pid, n, "pid"), _col(tid, n, "tid")
        self._note_pid(pid)
        if n == 0:
            return
        did = self._domain_id(int(pids[0]), int(tids[0]), domain, int(s.min()) - 1)
        self._create("NVTX_EVENTS", _NVTX_COLS)
        gtid = global_tid(pids, tids).tolist()
        txt = [str(t) for t in np.asarray(texts, dtype=object).tolist()]
        if len(txt) != n:
            raise ValueError(f"add_nvtx: {len(txt)} texts for {n} rows")
        text_col, id_col = (([None] * n, self.intern(txt).tolist()) if registered
                            else (txt, [None] * n))
        end = [None] * n if event_type == NVTX_MARK else e.tolist()
        range_id = list(range(1, n + 1)) if event_type == NVTX_START_END else [None] * n
        end_gtid = gtid if event_type == NVTX_START_END else [None] * n
        rows = zip(s.tolist(), end, [event_type] * n, range_id, text_col, gtid, end_gtid, id_col,
                   [did] * n)
        self.con.executemany("INSERT INTO NVTX_EVENTS (start,end,eventType,rangeId,text,globalTid,"
                             "endGlobalTid,textId,domainId) VALUES (?,?,?,?,?,?,?,?,?)", rows)

    def add_osrt(self, start_ns, end_ns, names, pid=1000, tid=1000) -> None:
        """OS runtime calls (``OSRT_API``, ``--trace=osrt``) on (pid, tid): ``write``, ``fsync``, ..."""
        s, e = self._times(start_ns, end_ns, "add_osrt")
        n = len(s)
        name_ids = self.intern(names) if n else np.zeros(0, np.int64)
        if len(name_ids) != n:
            raise ValueError(f"add_osrt: {len(name_ids)} names for {n} rows")
        gtid = global_tid(_col(pid, n, "pid"), _col(tid, n, "tid"))
        self._note_pid(pid)
        self._create("OSRT_API", _OSRT_COLS)
        rows = zip(s.tolist(), e.tolist(), [EVENT_CLASS_OSRT] * n, gtid.tolist(), name_ids.tolist(),
                   [0] * n, [0] * n, [None] * n)
        self.con.executemany("INSERT INTO OSRT_API VALUES (?,?,?,?,?,?,?,?)", rows)

    def add_memcpy(self, start_ns, end_ns, bytes=0, copy_kind=1, device=0, stream=7, pid=1000,
                   correlation=None) -> None:
        """Memcpy rows; ``copy_kind`` 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP."""
        s, e = self._times(start_ns, end_ns, "add_memcpy")
        n = len(s)
        self._note_pid(pid)
        self._create("CUPTI_ACTIVITY_KIND_MEMCPY", _MEMCPY_COLS)
        N = [None] * n
        rows = zip(s.tolist(), e.tolist(), _col(device, n, "device").tolist(), [1] * n, N,
                   _col(stream, n, "stream").tolist(), _nullable(_col(correlation, n, "corr")),
                   global_tid(_col(pid, n, "pid"), 0).tolist(), _col(bytes, n, "bytes").tolist(),
                   _col(copy_kind, n, "copy_kind").tolist(), N, N, N, N, N, N, N, N, N, N, [1] * n)
        self.con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES "
                             f"({','.join('?' * len(_MEMCPY_COLS))})", rows)

    def add_memset(self, start_ns, end_ns, bytes=0, device=0, stream=7, pid=1000,
                   correlation=None) -> None:
        s, e = self._times(start_ns, end_ns, "add_memset")
        n = len(s)
        self._note_pid(pid)
        self._create("CUPTI_ACTIVITY_KIND_MEMSET", _MEMSET_COLS)
        rows = zip(s.tolist(), e.tolist(), _col(device, n, "device").tolist(), [1] * n, [None] * n,
                   _col(stream, n, "stream").tolist(), _nullable(_col(correlation, n, "corr")),
                   global_tid(_col(pid, n, "pid"), 0).tolist(), [0] * n,
                   _col(bytes, n, "bytes").tolist(), [None] * n, [2] * n)
        self.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES "
                             f"({','.join('?' * len(_MEMSET_COLS))})", rows)

    def add_sync(self, start_ns, end_ns, sync_type=3, device=0, stream=7, pid=1000,
                 correlation=None) -> None:
        """SYNCHRONIZATION rows: 1 event sync, 2 stream wait event, 3 stream sync, 4 context sync."""
        s, e = self._times(start_ns, end_ns, "add_sync")
        n = len(s)
        self._note_pid(pid)
        self._create("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", _SYNC_COLS)
        st = _col(sync_type, n, "sync_type").tolist()
        rows = zip(s.tolist(), e.tolist(), _col(device, n, "device").tolist(), [1] * n, [None] * n,
                   _col(stream, n, "stream").tolist(), _nullable(_col(correlation, n, "corr")),
                   global_tid(_col(pid, n, "pid"), 0).tolist(), st, st, [0] * n, [None] * n)
        self.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES "
                             f"({','.join('?' * len(_SYNC_COLS))})", rows)

    def add_graph_trace(self, start_ns, end_ns, graph_id, device=0, stream=7, pid=1000,
                        correlation=None) -> None:
        """Whole-graph executions (``--cuda-graph-trace=graph``): one row per graph launch."""
        s, e = self._times(start_ns, end_ns, "add_graph_trace")
        n = len(s)
        self._note_pid(pid)
        self._create("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", _GRAPH_TRACE_COLS)
        gid = _col(graph_id, n, "graph_id").tolist()
        rows = zip(s.tolist(), e.tolist(), _col(device, n, "device").tolist(), [1] * n, [None] * n,
                   _col(stream, n, "stream").tolist(), _nullable(_col(correlation, n, "corr")),
                   global_tid(_col(pid, n, "pid"), 0).tolist(), gid, gid)
        self.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES "
                             f"({','.join('?' * len(_GRAPH_TRACE_COLS))})", rows)

    def flush(self) -> None:
        """Commit what was added so far (the file size then reflects it)."""
        if self.con is not None:
            self.con.commit()

    def close(self) -> Path:
        """Write metadata, session bounds, process and thread tables; commit and close."""
        if self.con is None:
            return self.path
        con = self.con
        meta_table = "META_DATA_EXPORT" if self._year >= 2024.5 else "EXPORT_META_DATA"
        self._create(meta_table, ("name TEXT NOT NULL", "value TEXT"))
        sv = self.schema_version.split(".") + ["0", "0"]
        meta = {"EXPORT_PRODUCT_NAME": "NVIDIA Nsight Systems",
                "EXPORT_PRODUCT_VERSION": self.version,
                "EXPORT_SCHEMA_VERSION": self.schema_version,
                "EXPORT_SCHEMA_VERSION_MAJOR": sv[0], "EXPORT_SCHEMA_VERSION_MINOR": sv[1],
                "EXPORT_SCHEMA_VERSION_MICRO": sv[2], "EXPORT_LAZY": "true",
                **self._meta_export}
        con.executemany(f"INSERT INTO {meta_table} VALUES (?,?)", list(meta.items()))
        if self._year >= 2024.5:
            self._create("META_DATA_CAPTURE", ("name TEXT NOT NULL", "value TEXT"))
            con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?,?)", self._meta_capture)
        t0 = self._t_min if self._t_min is not None else 0
        t1 = self._t_max if self._t_max is not None else t0
        self._create("ANALYSIS_DETAILS", ("globalVid INTEGER NOT NULL", "duration INTEGER NOT NULL",
                                          "startTime INTEGER NOT NULL", "stopTime INTEGER NOT NULL"))
        con.execute("INSERT INTO ANALYSIS_DETAILS VALUES (?,?,?,?)", (HW_ID, t1 - t0, t0, t1))
        self._create("TARGET_INFO_SESSION_START_TIME",
                     ("utcEpochNs INTEGER", "utcTime TEXT", "localTime TEXT"))
        utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.session_utc_ns // 1_000_000_000))
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?,?,?)",
                    (self.session_utc_ns, utc, utc))
        self._create("PROCESSES", ("globalPid INTEGER", "pid INTEGER", "name TEXT"))
        con.executemany("INSERT INTO PROCESSES VALUES (?,?,?)",
                        [(int(global_tid(p, 0)), p, nm) for p, nm in self._processes.items()])
        self._create("ThreadNames", ("nameId INTEGER NOT NULL", "priority INTEGER",
                                     "globalTid INTEGER"))
        if self._threads:
            ids = self.intern(list(self._threads.values()))
            con.executemany("INSERT INTO ThreadNames VALUES (?,?,?)",
                            [(int(i), 20, int(global_tid(p, t)))
                             for i, (p, t) in zip(ids.tolist(), self._threads)])
        con.commit()
        con.close()
        self.con = None
        return self.path
