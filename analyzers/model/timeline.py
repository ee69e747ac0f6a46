"""The Timeline: the one input of every analysis.

Readers normalise every trace format into these tables — pandas DataFrames whose columns are
declared once here, integer nanoseconds on one clock. ``validate_*`` checks a reader's output on
ingestion and fills optional columns with their defaults.

Tables (one row per event):
- ``device``  : kernels, memcpy, memset on a GPU (or the CPU stand-in of a probe trace)
- ``api``     : host runtime/driver API calls (launches, syncs, copies, graph launches)
- ``ranges``  : NVTX ranges or probe spans, with parsed attributes
- ``counters``: sampled counters (NVML)

NOTE: correlation ids are unique per process only: join device and api rows on (pid, correlation).
NOTE: -1 stands for "unknown" in integer columns (graph_id, graph_node, correlation, stream, device).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from srtscope.analyzers.model.columns import isin, str_codes


class SourceFormat(str, Enum):
    NSYS_SQLITE = "nsys-sqlite"
    KINETO = "kineto"
    PROBE = "srtscope-probe"
    SYNTHETIC = "synthetic"


class DeviceKind(str, Enum):
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    CPU_FORWARD = "cpu_forward"  # probe traces: the worker's forward span standing in for the GPU
    GRAPH = "graph"              # one whole CUDA graph execution (nsys --cuda-graph-trace=graph)


class ApiKind(str, Enum):
    LAUNCH = "launch"              # cudaLaunchKernel, cuLaunchKernel, ...
    SYNC = "sync"                  # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize
    MEMCPY = "memcpy"              # cudaMemcpy*, cudaMemset*
    GRAPH_LAUNCH = "graph_launch"  # cudaGraphLaunch
    OTHER = "other"
    ALLOC = "alloc"                # cudaMalloc, cudaHostAlloc, cudaFree, cuMemAlloc, ...
    INIT = "init"                  # module loads, context creation, device/stream set-up
    OS_IO = "os_io"                # OS runtime (nsys OSRT_API): file and socket I/O
    OS_WAIT = "os_wait"            # OS runtime: poll, futex, condition waits, sleeps
    OS_OTHER = "os_other"          # OS runtime: anything else

    @property
    def is_os(self) -> bool:
        return self in (ApiKind.OS_IO, ApiKind.OS_WAIT, ApiKind.OS_OTHER)


class Traced(str, Enum):
    """What a capture recorded (metadata ``traced``)."""

    KERNELS = "kernels"
    MEMCPY = "memcpy"
    API = "api"
    NVTX = "nvtx"
    GRAPH_NODES = "graph_nodes"  # kernels inside CUDA graphs traced per node
    COUNTERS = "counters"


class WarningCode(str, Enum):
    """Capture-adequacy warnings: what the trace cannot tell, stated rather than hidden."""

    NO_KERNELS = "no_kernels"
    NO_API = "no_api"
    NO_NVTX = "no_nvtx"
    GRAPH_NOT_PER_NODE = "graph_not_per_node"
    WINDOW_CUT = "window_cut"
    MULTI_PROCESS = "multi_process"
    UNKNOWN_SCHEMA = "unknown_schema"
    LOW_NVTX_COVERAGE = "low_nvtx_coverage"
    CPU_STAND_IN = "cpu_stand_in"
    PARTIAL_RANKS = "partial_ranks"              # the job had more ranks than the files given
    LOW_DEVICE_COVERAGE = "low_device_coverage"  # the device was active in little of the capture
    COLD_START = "cold_start"                    # context creation, first allocations, module loads
    SINGLE_ITERATION = "single_iteration"        # one step or one pass: nothing to average over
    PYTHON_TRACING = "python_tracing"            # with_stack tracing inflates host time
    PROFILER_STOP = "profiler_stop"              # a trailing range held the profiler's own stop: cut
    OTHER = "other"
    CORRUPT = "corrupt"                          # a damaged file: some of what it held was lost
    ENDED_EARLY = "ended_early"                  # a probe stream without its exit flush (killed)


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str          # numpy/pandas dtype name; "object" for str/dict, "category" allowed for str
    required: bool = True
    default: Any = None
    doc: str = ""


def _c(name: str, dtype: str, required: bool = True, default: Any = None, doc: str = "") -> Column:
    return Column(name, dtype, required, default, doc)


DEVICE_COLUMNS: tuple[Column, ...] = (
    _c("start_ns", "int64", doc="start, ns"),
    _c("end_ns", "int64", doc="end, ns (>= start_ns)"),
    _c("kind", "object", doc="DeviceKind value"),
    _c("name", "object", doc="kernel name (demangled when known); memcpy kind for copies"),
    _c("device", "int64", False, -1, "GPU index (or rank's CPU stand-in)"),
    _c("stream", "int64", False, -1, "stream id"),
    _c("pid", "int64", False, -1, "process id"),
    _c("correlation", "int64", False, -1, "correlation id, unique per pid"),
    _c("graph_id", "int64", False, -1, "CUDA graph id when launched from a graph, else -1"),
    _c("graph_node", "int64", False, -1, "graph node id when traced per node, else -1"),
    _c("rank", "int64", False, 0, "distributed rank of the trace file"),
    _c("bytes", "int64", False, -1, "bytes moved or set by a memcpy/memset, -1 when unknown"),
)

API_COLUMNS: tuple[Column, ...] = (
    _c("start_ns", "int64"),
    _c("end_ns", "int64"),
    _c("pid", "int64", False, -1),
    _c("tid", "int64", False, -1),
    _c("name", "object", doc="API name without version suffix (cudaLaunchKernel, not _v7000)"),
    _c("kind", "object", doc="ApiKind value"),
    _c("correlation", "int64", False, -1),
    _c("rank", "int64", False, 0),
)

RANGE_COLUMNS: tuple[Column, ...] = (
    _c("start_ns", "int64"),
    _c("end_ns", "int64"),
    _c("pid", "int64", False, -1),
    _c("tid", "int64", False, -1),
    _c("name", "object", doc="range name without attributes ('sched.schedule')"),
    _c("domain", "object", False, "", "NVTX domain ('' = default domain)"),
    _c("attrs", "object", False, None, "dict of attributes (str keys) or None"),
    _c("depth", "int64", False, -1, "nesting depth on its thread when known"),
    _c("rank", "int64", False, 0),
)

COUNTER_COLUMNS: tuple[Column, ...] = (
    _c("t_ns", "int64"),
    _c("name", "object"),
    _c("value", "float64"),
    _c("device", "int64", False, 0),
    _c("rank", "int64", False, 0),
)

SCHEMAS: dict[str, tuple[Column, ...]] = {
    "device": DEVICE_COLUMNS, "api": API_COLUMNS, "ranges": RANGE_COLUMNS,
    "counters": COUNTER_COLUMNS,
}

#: Integer id columns (declared int64) that may be held as int32 when every value fits: ids and the
#: nesting depth, never times or byte counts. Readers of large files narrow them (``narrow_ids``), 4 bytes a row each;
#: code reading them must not compute ids or keys in their own dtype (cast to int64 first).
ID_COLUMNS = frozenset({"device", "stream", "pid", "tid", "correlation", "graph_id", "graph_node", "rank", "depth"})
#: test switch: "1" keeps every id column int64 (the layout before ``narrow_ids``; same results)
WIDE_IDS_ENV = "SRTSCOPE_WIDE_IDS"
_I32 = np.iinfo(np.int32)


_Cols = TypeVar("_Cols", bound="dict | None")


def narrow_ids(cols: _Cols) -> _Cols:
    """The int64 ``ID_COLUMNS`` of ``cols`` (name -> array, in place) as int32 where every value
    fits; the others untouched. Nothing changes with ``SRTSCOPE_WIDE_IDS=1``."""
    if cols is None or os.environ.get(WIDE_IDS_ENV) == "1":
        return cols
    for k in ID_COLUMNS & cols.keys():
        a = cols[k]
        if isinstance(a, np.ndarray) and a.dtype == np.int64 and (
                not len(a) or (_I32.min <= int(a.min()) and int(a.max()) <= _I32.max)):
            cols[k] = a.astype(np.int32)
    return cols


def id_dtype_ok(name: str, dtype: object) -> bool:
    """Whether ``dtype`` is a valid dtype of column ``name`` declared int64 (int32 for ids)."""
    return dtype == np.int64 or (name in ID_COLUMNS and dtype == np.int32)


class TimelineError(ValueError):
    """A table that does not follow its schema."""


def empty_table(table: str) -> pd.DataFrame:
    cols = SCHEMAS[table]
    return pd.DataFrame({c.name: pd.Series([], dtype=c.dtype) for c in cols})


def validate_table(df: pd.DataFrame | None, table: str, copy: bool = True) -> pd.DataFrame:
    """Check required columns, add optional ones with defaults, coerce dtypes, sort by start.

    Raises ``TimelineError`` naming the table and the missing columns or the bad rows.
    ``copy=False`` keeps the given column arrays as they are (one block each, no consolidating
    copy): for readers that hand over arrays nobody else holds.
    """
    cols = SCHEMAS[table]
    if df is None or (len(df) == 0 and len(df.columns) == 0):
        return empty_table(table)
    missing = [c.name for c in cols if c.required and c.name not in df.columns]
    if missing:
        raise TimelineError(f"{table} table is missing required column(s): {', '.join(missing)}")
    out = {}
    n = len(df)
    for c in cols:
        if c.name in df.columns:
            s = df[c.name]
            if c.dtype == "int64" and not id_dtype_ok(c.name, s.dtype):
                if s.isna().any():
                    s = s.fillna(c.default if c.default is not None else -1)
                s = s.astype(np.int64)
            elif c.dtype == "float64" and s.dtype != np.float64:
                s = s.astype(np.float64)
            out[c.name] = s.to_numpy() if not isinstance(s.dtype, pd.CategoricalDtype) else s.array
        else:
            if c.dtype == "object":
                out[c.name] = np.full(n, c.default, dtype=object)
            elif c.name in ID_COLUMNS and n and os.environ.get(WIDE_IDS_ENV) != "1":
                out[c.name] = np.full(n, c.default, dtype=np.int32)     # a default id: 4 bytes a row
            else:
                out[c.name] = np.full(n, c.default, dtype=c.dtype)
    res = pd.DataFrame(out, copy=copy)
    time_col = "t_ns" if table == "counters" else "start_ns"
    if table != "counters" and n:
        bad = res["end_ns"].to_numpy() < res["start_ns"].to_numpy()
        if bad.any():
            raise TimelineError(f"{table} table has {int(bad.sum())} row(s) with end_ns < start_ns")
    if n and not res[time_col].is_monotonic_increasing:
        res = res.sort_values(time_col, kind="stable").reset_index(drop=True)
    return res


@dataclass(frozen=True)
class DeviceInfo:
    id: int
    name: str = ""
    sm_count: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True)
class CaptureWarning:
    code: WarningCode
    message: str


@dataclass
class TimelineMeta:
    """What was read and what the capture did and did not record."""

    format: SourceFormat
    sources: list[str] = field(default_factory=list)
    tool_version: str = ""
    devices: list[DeviceInfo] = field(default_factory=list)
    ranks: list[int] = field(default_factory=lambda: [0])
    world_size: int = 1
    window_start_ns: int = 0
    window_end_ns: int = 0
    traced: set[Traced] = field(default_factory=set)
    warnings: list[CaptureWarning] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def warn(self, code: WarningCode, message: str) -> None:
        if not any(w.code == code and w.message == message for w in self.warnings):
            self.warnings.append(CaptureWarning(code, message))

    def has_warning(self, code: WarningCode) -> bool:
        return any(w.code == code for w in self.warnings)


GPU_DOMAIN = "kineto.gpu"
"""Range domain of host annotations projected onto a GPU stream (Kineto ``gpu_user_annotation``);
a name of its own, so that an app's NVTX domain called ``gpu`` is not mistaken for it."""

OP_DOMAIN = "kineto.cpu_op"
"""Range domain of framework operators (Kineto ``cpu_op``: ``aten::addmm``, ``vllm::moe_forward``)."""

PYTHON_DOMAIN = "kineto.python"
"""Range domain of Python frames (Kineto ``python_function``, recorded with ``with_stack=True``)."""

#: domains that are not annotations a person or an engine opened: kept apart from ``host_ranges``
DERIVED_DOMAINS = (GPU_DOMAIN, OP_DOMAIN, PYTHON_DOMAIN)


@dataclass
class Timeline:
    """Validated tables + metadata. Build with ``Timeline.build`` to validate on ingestion."""

    device: pd.DataFrame
    api: pd.DataFrame
    ranges: pd.DataFrame
    counters: pd.DataFrame
    meta: TimelineMeta

    @classmethod
    def build(cls, meta: TimelineMeta, device: pd.DataFrame | None = None,
              api: pd.DataFrame | None = None, ranges: pd.DataFrame | None = None,
              counters: pd.DataFrame | None = None) -> Timeline:
        return cls(validate_table(device, "device"), validate_table(api, "api"),
                   validate_table(ranges, "ranges"), validate_table(counters, "counters"), meta)

    @cached_property
    def host_ranges(self) -> pd.DataFrame:
        """The annotations host threads opened (NVTX, record_function, stage ranges): ``ranges``
        without the ``DERIVED_DOMAINS`` (GPU projections, framework operators, Python frames).

        NOTE: every host-side analysis (stages, steps, attribution) reads these; the projections
        repeat host annotations on a GPU stream and would count each step twice, and operators and
        frames are read by the host-activity model (``analyses/host_activity.py``) as layers of their own.
        """
        rg = self.ranges
        derived = isin(rg["domain"], DERIVED_DOMAINS)     # by category where it is one: no object array
        return rg[~derived].reset_index(drop=True) if derived.any() else rg

    def domain_ranges(self, domain: str, names: Callable[[str], bool] | None = None) -> pd.DataFrame:
        """The ranges of one derived domain (``OP_DOMAIN``, ``PYTHON_DOMAIN``); with ``names``, only
        those whose name it accepts (asked once per distinct name). NOTE: a copy of the rows: ask
        for the few that are wanted, not millions of frames to pick from."""
        rg = self.ranges
        m = isin(rg["domain"], [domain]) if len(rg) else np.zeros(0, bool)
        if names is not None and m.any():
            codes, labels = str_codes(rg["name"])
            m = m & np.array([names(str(x)) for x in labels] + [False], dtype=bool)[codes]
        return rg[m].reset_index(drop=True) if m.any() else rg.iloc[:0]

    def domain_names(self, domain: str) -> list[str]:
        """The distinct names of one derived domain's ranges, sorted (no copy of its rows)."""
        rg = self.ranges
        m = isin(rg["domain"], [domain]) if len(rg) else np.zeros(0, bool)
        if not m.any():
            return []
        codes, labels = str_codes(rg["name"])
        return [str(x) for x in labels[np.unique(codes[m])]]

    @property
    def span_ns(self) -> tuple[int, int]:
        """(first start, last end) over all tables; (0, 0) when empty."""
        starts, ends = [], []
        for df in (self.device, self.api, self.ranges):
            if len(df):
                starts.append(int(df["start_ns"].min()))
                ends.append(int(df["end_ns"].max()))
        return (min(starts), max(ends)) if starts else (0, 0)


def merge_timelines(parts: list[Timeline]) -> Timeline:
    """Concatenate timelines of several files (e.g. one per rank) into one, re-sorted by time."""
    if not parts:
        raise TimelineError("no timelines to merge")
    if len(parts) == 1:
        return parts[0]
    first = parts[0].meta
    meta = TimelineMeta(format=first.format, tool_version=first.tool_version, ranks=[])
    for p in parts:
        m = p.meta
        meta.sources += m.sources
        meta.devices += [d for d in m.devices if d not in meta.devices]
        meta.ranks += [r for r in m.ranks if r not in meta.ranks]
        meta.traced |= m.traced
        meta.world_size = max(meta.world_size, m.world_size)
        for w in m.warnings:
            meta.warn(w.code, w.message)
        meta.extra.update(m.extra)
    meta.ranks = sorted({r for p in parts for r in p.meta.ranks})
    meta.window_start_ns = min(p.meta.window_start_ns for p in parts)
    meta.window_end_ns = max(p.meta.window_end_ns for p in parts)
    cat = lambda name: pd.concat([getattr(p, name) for p in parts], ignore_index=True)  # noqa: E731
    return Timeline.build(meta, cat("device"), cat("api"), cat("ranges"), cat("counters"))
