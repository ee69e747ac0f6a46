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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import (
    GPU_DOMAIN,
    OP_DOMAIN,
    PYTHON_DOMAIN,
    DeviceKind,
    Timeline,
    WarningCode,
    validate_table,
)
from srtscope.analyzers.model.units import name_text
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.jsonstream import JsonStreamError, iter_trace, us_to_ns
from srtscope.analyzers.readers.kineto_build import Facts, Frames, Tables, host_pid, kineto_meta
from srtscope.analyzers.readers.kineto_columns import DOMAINS, KINDS, KinetoRows, objects
from srtscope.analyzers.readers.kineto_columns import _int as _int
from srtscope.analyzers.readers.kineto_stream import Fallback, event_batches
from srtscope.analyzers.readers.profiler_stop import cut_open_at_stop, stop_message
from srtscope.analyzers.readers.stand_in import forward_stand_ins
from srtscope.probes.stages import resolve_stage

_DEVICE_CATS = {"kernel": DeviceKind.KERNEL, "Kernel": DeviceKind.KERNEL,
                "gpu_memcpy": DeviceKind.MEMCPY, "Memcpy": DeviceKind.MEMCPY,
                "gpu_memset": DeviceKind.MEMSET, "Memset": DeviceKind.MEMSET}
_API_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
_RANGE_CATS = {"user_annotation": "", "gpu_user_annotation": GPU_DOMAIN}
_OP_CATS = {"cpu_op", "Operator"}
_FLOW_CATS = {"ac2g", "async"}
#: elements of traceEvents that are no event (not an object, or without ``ph``) tolerated before
#: the file is refused: a gzip bomb of ``0,`` ran for hours at ~1 µs per element, a real trace has none
MAX_NON_EVENTS = 1_000_000


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


def new_rows() -> KinetoRows:
    """The batched reader's rows, with this module's mapping of categories."""
    return KinetoRows(_DEVICE_CATS, _API_CATS, _RANGE_CATS, _OP_CATS, _FLOW_CATS,
                      lambda name: resolve_stage(name) is not None, MAX_NON_EVENTS)


def read_kineto_batched(path: Path, rank: int = 0) -> Timeline:
    """``read_kineto`` by the batched decoder alone: ``Fallback`` where it does not take the file."""
    header: dict[str, Any] = {}
    rows = new_rows()
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
    return _build(path, header, tables, rows.cats, rows.thread_names, rows.n_events, rank, rows.stop_ns)


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
    stop: list[Any] = []                                 # the profiler's Record Window End, µs
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
                    elif ph == "i" and ev.get("name") == "Record Window End" and "ts" in ev:
                        stop.append(ev["ts"])
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
    return _build(path, header, t, cats, thread_names, n_events, rank, stop_time(stop[-1]) if stop else None)


def stop_time(value: Any) -> int | None:
    """The profiler's ``Record Window End`` time, ns (without the trace's base time); None when it
    is no time."""
    try:
        return us_to_ns(value)
    except (OverflowError, TypeError, ValueError):
        return None


def cut_at_stop(ranges: pd.DataFrame | None, stop_ns: int | None,
                base_ns: int) -> tuple[pd.DataFrame | None, list[tuple[str, int]]]:
    """``ranges`` less the trailing ranges still open at the profiler's stop (``profiler_stop``),
    and those cut; ``stop_ns`` without the base time ``base_ns``."""
    if ranges is None or stop_ns is None:
        return ranges, []
    return cut_open_at_stop(ranges, stop_ns + base_ns)


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


def _build(path: Path, header: dict[str, Any], t: Tables, cats: Counter, thread_names: dict[str, str],
           n_events: int, rank: int, stop_ns: int | None = None) -> Timeline:
    """The Timeline of the read's tables; ``stop_ns``: the profiler's ``Record Window End`` (the
    trailing ranges still open then are cut, ``profiler_stop``)."""
    fr = Frames.of(header, rank, host_pid(np.asarray(t.api["pid"], np.int64)))
    device = fr.device(t.dev) if len(t.dev["start_ns"]) else None
    api_df = fr.api(t.api) if len(t.api["start_ns"]) else None
    ranges, cut = cut_at_stop(fr.ranges(t.rng) if len(t.rng["start_ns"]) else None, stop_ns, fr.base_ns)
    # a CPU run of an engine of ours, captured by torch.profiler: no device activity and no CUDA
    # calls. NOTE: with CUDA calls but no kernels, kernel tracing failed: no stand-ins then.
    stand = forward_stand_ins(ranges, fr.rank) if device is None and api_df is None else None
    if stand is not None and len(stand):
        device = stand
    else:
        stand = None
    meta = kineto_meta(path, header, fr, Facts.of(device, api_df), ranges, cats, thread_names, n_events, stand)
    if cut:
        meta.warn(WarningCode.PROFILER_STOP, stop_message(cut))
    # NOTE: ``Timeline.build`` without its copy: these tables' arrays are this read's alone
    return Timeline(validate_table(device, "device", copy=False), validate_table(api_df, "api", copy=False),
                    validate_table(ranges, "ranges", copy=False), validate_table(None, "counters"), meta)
