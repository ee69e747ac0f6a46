"""PyTorch profiler (Kineto) Chrome-trace JSON -> Timeline; ``.json`` or gzip, current and 2021 schemas.

Mapping (``ph: "X"`` events):
- ``kernel``/``gpu_memcpy``/``gpu_memset`` (2021: ``Kernel``/``Memcpy``/``Memset``) -> device rows;
  device and stream from args (GPU events use pid = device, tid = stream, ``"stream 7"`` in 2021).
- ``cuda_runtime``/``cuda_driver`` (2021: ``Runtime``) -> api rows; ROCm ``hip*`` names mapped to CUDA.
- ``user_annotation`` -> ranges (domain ``""``); ``gpu_user_annotation`` -> ranges in domain
  ``GPU_DOMAIN`` (``"kineto.gpu"``) on (pid = device, tid = stream), the same annotations projected
  onto the GPU stream.
- ``cpu_op`` (2021: ``Operator``) -> ranges: in the default domain when the op name is a known
  stage alias (``probes.stages.resolve_stage``), else in ``OP_DOMAIN`` (framework operators, read
  by the host-activity model); ``python_function`` -> ranges in ``PYTHON_DOMAIN``.
Correlation is ``args.correlation`` on both sides (kernels of a ``cudaGraphLaunch`` carry the
launch's correlation); where it is missing, the ``ac2g`` (2021: ``async``) flow whose start/finish
sits on the event (same pid, tid, ts) supplies it. ``External id`` is not used: it can be stale.
Device rows take the host pid of the API calls so (pid, correlation) joins.
Times: µs -> integer ns, plus ``baseTimeNanoseconds`` when present.
"""
from __future__ import annotations

import gzip
import io
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.model.names import api_kind, hip_to_cuda, strip_api_suffix
from srtscope.analyzers.model.timeline import (
    GPU_DOMAIN,
    OP_DOMAIN,
    PYTHON_DOMAIN,
    ApiKind,
    DeviceInfo,
    DeviceKind,
    SourceFormat,
    Timeline,
    TimelineMeta,
    Traced,
    WarningCode,
)
from srtscope.analyzers.model.units import name_text
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.jsonstream import JsonStreamError, iter_trace, us_to_ns
from srtscope.analyzers.readers.kineto_columns import DOMAINS, KINDS, KinetoRows, objects
from srtscope.analyzers.readers.kineto_columns import _int as _int
from srtscope.analyzers.readers.kineto_stream import Fallback, event_batches
from srtscope.analyzers.readers.labels import split_coded_labels
from srtscope.analyzers.readers.stand_in import forward_stand_ins, note_stand_ins
from srtscope.probes.stages import resolve_stage

_DEVICE_CATS = {"kernel": DeviceKind.KERNEL, "Kernel": DeviceKind.KERNEL,
                "gpu_memcpy": DeviceKind.MEMCPY, "Memcpy": DeviceKind.MEMCPY,
                "gpu_memset": DeviceKind.MEMSET, "Memset": DeviceKind.MEMSET}
_API_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
_RANGE_CATS = {"user_annotation": "", "gpu_user_annotation": GPU_DOMAIN}
_OP_CATS = {"cpu_op", "Operator"}
_LEGACY_CATS = {"Kernel", "Runtime", "Operator", "Memcpy", "Memset"}
_FLOW_CATS = {"ac2g", "async"}
#: elements of traceEvents that are no event (not an object, or without ``ph``) tolerated before
#: the file is refused: a gzip bomb of ``0,`` ran for hours at ~1 µs per element, a real trace has none
MAX_NON_EVENTS = 1_000_000
KNOWN_SCHEMAS = {1}


class _Cols:
    """Column lists of one table, appended per event."""

    def __init__(self, *names: str) -> None:
        self.cols: dict[str, list] = {n: [] for n in names}

    def add(self, *values: Any) -> None:
        for col, v in zip(self.cols.values(), values):
            col.append(v)

    def __len__(self) -> int:
        return len(next(iter(self.cols.values())))


def _open_text(path: Path) -> io.TextIOWrapper:
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    raw = gzip.open(path, "rb") if gz else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict")


def read_kineto(path: str | Path, rank: int = 0) -> Timeline:
    """Read one Kineto trace. ``rank`` is used when the trace has no ``distributedInfo.rank``.

    Batched (``kineto_stream`` + ``kineto_columns``); a file that path does not take as it expects
    is read again by the exact streaming reader (``jsonstream``), whose answer or error stands."""
    path = Path(path)
    try:
        return read_kineto_batched(path, rank)
    except Fallback:
        return _read_exact(path, rank)


def read_kineto_batched(path: Path, rank: int = 0) -> Timeline:
    """``read_kineto`` by the batched decoder alone: ``Fallback`` where it does not take the file."""
    header: dict[str, Any] = {}
    rows = KinetoRows(_DEVICE_CATS, _API_CATS, _RANGE_CATS, _OP_CATS, _FLOW_CATS,
                      lambda name: resolve_stage(name) is not None, MAX_NON_EVENTS)
    try:
        for batch in event_batches(path, header.__setitem__):
            rows.add(batch)
    except TypeError as exc:            # a member of a type no comparison takes: the exact reader says
        raise Fallback(str(exc)) from None
    rows.finish()
    if sum(rows.rows.values()) == 0:
        raise TraceError(path, f"Kineto trace holds no GPU, CUDA API or annotation events "
                               f"({rows.n_events} events)")
    tables = Tables(rows.table("dev"), rows.table("api"), rows.table("rng"))
    return _build(path, header, tables, rows.cats, rows.thread_names, rows.n_events, rank)


def _read_exact(path: Path, rank: int) -> Timeline:
    """The streaming reader (``jsonstream``), event by event: every quirk and error as it was."""
    header: dict[str, Any] = {}
    dev = _Cols("start", "dur", "kind", "name", "device", "stream", "correlation", "bytes")
    api = _Cols("start", "dur", "pid", "tid", "name", "correlation")
    rng = _Cols("start", "dur", "pid", "tid", "name", "domain")
    cats: Counter[str] = Counter()
    thread_names: dict[str, str] = {}
    n_events = non_events = 0
    stage_ops: dict[str, bool] = {}
    flows: dict[tuple[str, Any, Any, int], int] = {}     # (ph, pid, tid, ts_ns) -> flow id
    unlinked: list[tuple[_Cols, int, tuple]] = []        # rows without args.correlation
    with _open_text(path) as fh:
        try:
            for ev in iter_trace(fh, header.__setitem__):
                n_events += 1
                if not isinstance(ev, dict) or "ph" not in ev:
                    non_events += 1
                    if non_events > MAX_NON_EVENTS:
                        raise TraceError(path, f"not a Kineto trace: traceEvents holds over {MAX_NON_EVENTS:,} "
                                               "elements that are not trace events (no object with 'ph')")
                    continue
                ph = ev.get("ph")
                if ph != "X":
                    if ph in ("s", "f") and ev.get("cat") in _FLOW_CATS and "id" in ev:
                        flows[(ph, ev.get("pid"), ev.get("tid"), us_to_ns(ev["ts"]))] = \
                            _int(ev["id"])
                    elif ph == "M" and ev.get("name") == "thread_name":
                        nm = (ev.get("args") or {}).get("name")
                        if nm:
                            thread_names[f"{ev.get('pid')}:{ev.get('tid')}"] = str(nm)
                    continue
                cat = ev.get("cat", "")
                cats[cat] += 1
                kind = _DEVICE_CATS.get(cat)
                if kind is not None:
                    args = ev.get("args") or {}
                    if "correlation" not in args:
                        unlinked.append((dev, len(dev), ("f", ev.get("pid"), ev.get("tid"),
                                                         us_to_ns(ev["ts"]))))
                    dev.add(ev["ts"], ev.get("dur", 0), kind.value, name_text(ev.get("name", "")),
                            _int(args.get("device", ev.get("pid"))),
                            _int(args.get("stream", ev.get("tid"))),
                            _int(args.get("correlation")), _int(args.get("bytes")))
                elif cat in _API_CATS:
                    args = ev.get("args") or {}
                    if "correlation" not in args:
                        unlinked.append((api, len(api), ("s", ev.get("pid"), ev.get("tid"),
                                                         us_to_ns(ev["ts"]))))
                    api.add(ev["ts"], ev.get("dur", 0), _int(ev.get("pid")), _int(ev.get("tid")),
                            name_text(ev.get("name", "")), _int(args.get("correlation")))
                elif cat in _RANGE_CATS:
                    rng.add(ev["ts"], ev.get("dur", 0), _int(ev.get("pid")), _int(ev.get("tid")),
                            name_text(ev.get("name", "")), _RANGE_CATS[cat])
                elif cat in _OP_CATS:
                    name = name_text(ev.get("name", ""))
                    keep = stage_ops.get(name)
                    if keep is None:
                        keep = stage_ops[name] = resolve_stage(name) is not None
                    rng.add(ev["ts"], ev.get("dur", 0), _int(ev.get("pid")),
                            _int(ev.get("tid")), name, "" if keep else OP_DOMAIN)
                elif cat == "python_function":
                    rng.add(ev["ts"], ev.get("dur", 0), _int(ev.get("pid")), _int(ev.get("tid")),
                            name_text(ev.get("name", "")), PYTHON_DOMAIN)
        except JsonStreamError as exc:
            raise TraceError(path, f"not a valid Kineto trace: {exc}") from None
        except KeyError as exc:
            raise TraceError(path, f"Kineto event without {exc.args[0]!r}") from None
    for cols, row, key in unlinked:
        cols.cols["correlation"][row] = flows.get(key, -1)
    if "traceEvents" not in header and n_events == 0 and "schemaVersion" not in header:
        raise TraceError(path, "JSON is not a trace: no traceEvents array")
    if len(dev) + len(api) + len(rng) == 0:
        raise TraceError(path, f"Kineto trace holds no GPU, CUDA API or annotation events "
                               f"({n_events} events)")
    t = Tables(_coded(dev, path, {"kind": KINDS}), _coded(api, path, {}), _coded(rng, path, {"domain": DOMAINS}))
    return _build(path, header, t, cats, thread_names, n_events, rank)


def _coded(cols: _Cols, path: Path, fixed: dict[str, list[str]]) -> dict[str, Any]:
    """One table's column lists as ``Tables`` holds them: times in ns, names coded, the ``fixed``
    columns as codes into their lists."""
    c = cols.cols
    out: dict[str, Any] = {"start_ns": _ns(c["start"], path), "dur_ns": _ns(c["dur"], path)}
    for k, v in c.items():
        if k in ("start", "dur"):
            continue
        if k == "name":
            codes, names = pd.factorize(objects(v), use_na_sentinel=False)
            out["name"], out["names"] = np.asarray(codes, np.int64), [str(x) for x in names]
        elif k in fixed:
            out[k] = np.fromiter((fixed[k].index(x) for x in v), np.int64, len(v))
        else:
            out[k] = np.asarray(v, np.int64)
    return out


def _ns(values: list, path: Path) -> np.ndarray:
    """µs values -> int64 ns (``TraceError`` for one out of range or not a number)."""
    try:
        return np.fromiter((us_to_ns(v) for v in values), np.int64, len(values))
    except (OverflowError, ValueError) as exc:
        raise TraceError(path, f"an event's time is out of range or not a number ({exc})") from None


@dataclass
class Tables:
    """A Kineto trace's device, API and range rows as int64 columns (``kineto_columns.COLUMNS``),
    times in ns before the base time: ``name`` codes into the distinct ``names``, a device's
    ``kind`` and a range's ``domain`` codes into ``KINDS`` / ``DOMAINS``."""

    dev: dict[str, Any]
    api: dict[str, Any]
    rng: dict[str, Any]


def _categorical(codes: np.ndarray, values: list[str]) -> pd.Categorical:
    """``pd.Categorical`` of ``values[codes]``: its categories the values used, sorted."""
    used = np.bincount(codes, minlength=len(values)) > 0
    vals = np.asarray(values, dtype=object)
    cats = sorted(vals[used].tolist())
    pos = {c: i for i, c in enumerate(cats)}
    lut = np.fromiter((pos.get(v, -1) for v in values), np.int64, len(values))
    return pd.Categorical.from_codes(lut[codes], categories=cats)


def _host_pid(pids: np.ndarray) -> tuple[int, int]:
    """(the most common pid, earliest first where counts tie; distinct pids) of the API rows."""
    if not len(pids):
        return -1, 0
    uniq, first, counts = np.unique(pids, return_index=True, return_counts=True)
    return int(pids[first[counts == counts.max()].min()]), len(uniq)


def _build(path: Path, header: dict[str, Any], t: Tables, cats: Counter, thread_names: dict[str, str],
           n_events: int, rank: int) -> Timeline:
    base = header.get("baseTimeNanoseconds")
    base_ns = _int(base, 0) if base is not None else 0
    dist = di if isinstance(di := header.get("distributedInfo"), dict) else {}
    file_rank = _int(dist.get("rank"), rank) if "rank" in dist else rank
    world = _int(dist.get("world_size"), 1) if "world_size" in dist else 1

    api_pids = np.asarray(t.api["pid"], np.int64)
    host_pid, n_pids = _host_pid(api_pids)

    def times(c: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        s = c["start_ns"] + np.int64(base_ns)
        return s, s + np.maximum(c["dur_ns"], 0)

    device = api_df = ranges = None
    if len(t.dev["start_ns"]):
        s, e = times(t.dev)
        c = t.dev
        device = pd.DataFrame({"start_ns": s, "end_ns": e, "kind": _categorical(c["kind"], KINDS),
                               "name": _categorical(c["name"], c["names"]), "device": c["device"],
                               "stream": c["stream"], "pid": host_pid,
                               "correlation": c["correlation"], "rank": file_rank,
                               "bytes": c["bytes"]})
    if len(t.api["start_ns"]):
        s, e = times(t.api)
        c = t.api
        raw = _categorical(c["name"], c["names"])
        mapped = np.asarray([strip_api_suffix(hip_to_cuda(n)) for n in raw.categories], dtype=object)
        kind_lut = np.asarray([api_kind(n).value for n in mapped], dtype=object)
        names = pd.Categorical(mapped[raw.codes])
        kinds = pd.Categorical(kind_lut[raw.codes], categories=[k.value for k in ApiKind])
        api_df = pd.DataFrame({"start_ns": s, "end_ns": e, "pid": c["pid"], "tid": c["tid"],
                               "name": names, "kind": kinds, "correlation": c["correlation"],
                               "rank": file_rank})
    if len(t.rng["start_ns"]):
        s, e = times(t.rng)
        c = t.rng
        names, attrs = split_coded_labels(c["name"], c["names"])
        ranges = pd.DataFrame({"start_ns": s, "end_ns": e, "pid": c["pid"], "tid": c["tid"],
                               "name": names, "domain": _categorical(c["domain"], DOMAINS),
                               "attrs": attrs, "rank": file_rank})

    # a CPU run of an engine of ours, captured by torch.profiler: no device activity and no CUDA
    # calls. NOTE: with CUDA calls but no kernels, kernel tracing failed: no stand-ins then.
    stand_in = device is None and api_df is None and len(stand := forward_stand_ins(ranges, file_rank)) > 0
    if stand_in:
        device = stand
    schema = header.get("schemaVersion")
    meta = TimelineMeta(format=SourceFormat.KINETO, sources=[str(path)], ranks=[file_rank],
                        world_size=max(world, 1))
    props = dp if isinstance(dp := header.get("deviceProperties"), list) else []
    by_id = {}
    for p in props:
        if isinstance(p, dict) and "id" in p:
            by_id[_int(p.get("id"))] = DeviceInfo(_int(p.get("id")), str(p.get("name", "")),
                                                  _int(p.get("numSms"), 0),
                                                  _int(p.get("totalGlobalMem"), 0))
    used = sorted(set(device["device"].unique().tolist())) if device is not None else []
    meta.devices = [by_id.get(i, DeviceInfo(i)) for i in used]
    runtime_ver = header.get("cuda_runtime_version", header.get("hip_runtime_version"))
    meta.tool_version = f"kineto schema {schema}" + (f", runtime {runtime_ver}" if runtime_ver else "")
    spans = [(t["start_ns"].min(), t["end_ns"].max()) for t in (device, api_df, ranges)
             if t is not None and len(t)]
    meta.window_start_ns = int(min(a for a, _ in spans))
    meta.window_end_ns = int(max(b for _, b in spans))
    legacy = bool(_LEGACY_CATS & set(cats))
    n_kern = int((device["kind"] == DeviceKind.KERNEL.value).sum()) if device is not None else 0
    graph_corr = (api_df.loc[api_df["kind"] == ApiKind.GRAPH_LAUNCH.value, "correlation"]
                  if api_df is not None else pd.Series([], dtype=np.int64))
    graph_kernels = int((device["correlation"].isin(set(graph_corr.tolist()))
                         & (device["kind"] == DeviceKind.KERNEL.value)).sum()) \
        if device is not None and len(graph_corr) else 0
    meta.extra.update({
        "kineto.schema_version": schema, "kineto.legacy_2021": legacy,
        "kineto.events": n_events, "kineto.categories": dict(cats),
        "kineto.thread_names": thread_names, "kineto.base_time_ns": base_ns,
        # per rank too: a merge of several ranks' files keeps one ``kineto.base_time_ns`` only
        f"kineto.base_time_ns.rank{file_rank}": base_ns,
        "kineto.distributed": {k: v for k, v in dist.items() if k != "pg_config"},
        "kineto.graph_launches": int(len(graph_corr)), "kineto.graph_kernels": graph_kernels,
        "kineto.rocm": "roctracer_version" in header or "hip_runtime_version" in header,
    })
    if stand_in:
        note_stand_ins(meta, device)
    if n_kern:
        meta.traced.add(Traced.KERNELS)
    if not stand_in and device is not None and (device["kind"] != DeviceKind.KERNEL.value).any():
        meta.traced.add(Traced.MEMCPY)
    if api_df is not None:
        meta.traced.add(Traced.API)
    if ranges is not None:
        meta.traced.add(Traced.NVTX)
    if graph_kernels:
        meta.traced.add(Traced.GRAPH_NODES)
    if not n_kern and not stand_in:
        meta.warn(WarningCode.NO_KERNELS, "no kernel events (profiler without CUDA activities?)")
    if api_df is None:
        meta.warn(WarningCode.NO_API, "no CUDA runtime events")
    # NOTE: the domain's categories are the domains used (``_categorical``)
    if ranges is None or not {"", GPU_DOMAIN} & set(ranges["domain"].cat.categories.tolist()):
        meta.warn(WarningCode.NO_NVTX, "no user annotations (record_function) or stage ranges")
    if len(graph_corr) and not graph_kernels:
        meta.warn(WarningCode.GRAPH_NOT_PER_NODE,
                  f"{len(graph_corr)} graph launch(es) but no kernel carries their correlation")
    if n_pids > 1:
        meta.warn(WarningCode.MULTI_PROCESS, f"CUDA API calls from {n_pids} processes; "
                  f"device rows attributed to pid {host_pid}")
    if schema not in KNOWN_SCHEMAS:
        meta.warn(WarningCode.UNKNOWN_SCHEMA, f"Kineto schemaVersion {schema!r} not seen in testing")
    return Timeline.build(meta, device=device, api=api_df, ranges=ranges)
