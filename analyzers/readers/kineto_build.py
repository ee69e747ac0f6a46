"""A Kineto trace's columns (``Tables``) -> the Timeline's tables and metadata: one place for both
the whole read (``kineto.py``) and the spilled one (``spill/kineto_spill.py``).

    frames = Frames.of(header, rank, host_pid(api_pids))   # base time, rank, the host pid
    device = frames.device(t.dev); api = frames.api(t.api); ranges = frames.ranges(t.rng)
    meta = kineto_meta(path, header, frames, Facts.of(device, api), ...)

The metadata needs only ``Facts`` of the device and API tables (the devices used, kernel counts,
graph launches, spans), gathered from the whole tables or chunk by chunk.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.model.names import api_kind, hip_to_cuda, strip_api_suffix
from srtscope.analyzers.model.timeline import (
    GPU_DOMAIN,
    ApiKind,
    DeviceInfo,
    DeviceKind,
    SourceFormat,
    TimelineMeta,
    Traced,
    WarningCode,
    narrow_ids,
)
from srtscope.analyzers.readers.kineto_columns import DOMAINS, KINDS, _int
from srtscope.analyzers.readers.labels import split_coded_labels
from srtscope.analyzers.readers.stand_in import note_stand_ins

_LEGACY_CATS = {"Kernel", "Runtime", "Operator", "Memcpy", "Memset"}
KNOWN_SCHEMAS = {1}


@dataclass
class Tables:
    """A Kineto trace's device, API and range rows as int64 columns (``kineto_columns.COLUMNS``),
    times in ns before the base time: ``name`` codes into the distinct ``names``, a device's
    ``kind`` and a range's ``domain`` codes into ``KINDS`` / ``DOMAINS``."""

    dev: dict[str, Any]
    api: dict[str, Any]
    rng: dict[str, Any]


def categorical(codes: np.ndarray, values: list[str]) -> pd.Categorical:
    """``pd.Categorical`` of ``values[codes]``: its categories the values used, sorted."""
    used = np.bincount(codes, minlength=len(values)) > 0
    vals = np.asarray(values, dtype=object)
    cats = sorted(vals[used].tolist())
    pos = {c: i for i, c in enumerate(cats)}
    # NOTE: the codes in the narrowest type pandas keeps them in: no int64 copy of a column of millions
    small = np.int8 if len(cats) < 127 else np.int16 if len(cats) < 32767 else np.int32
    lut = np.fromiter((pos.get(v, -1) for v in values), small, len(values))
    # pandas-stubs wants an Index for categories; a list works at runtime (as labels.py)
    return pd.Categorical.from_codes(lut[codes], categories=cats)  # type: ignore[call-overload]


def host_pid(pids: np.ndarray) -> tuple[int, int]:
    """(the most common pid, earliest first where counts tie; distinct pids) of the API rows."""
    if not len(pids):
        return -1, 0
    uniq, first, counts = np.unique(pids, return_index=True, return_counts=True)
    return int(pids[first[counts == counts.max()].min()]), len(uniq)


@dataclass(frozen=True)
class Frames:
    """What turns a table's columns into its DataFrame: the base time (ns), the file's rank and the
    host pid device rows take (the most common among the API rows; -1 without them)."""

    base_ns: int
    rank: int
    world: int
    host_pid: int
    n_pids: int

    @classmethod
    def of(cls, header: dict[str, Any], rank: int, host: tuple[int, int]) -> Frames:
        """From the header (base time, ``distributedInfo``; ``rank`` where it has none) and ``host``:
        (``host_pid``, distinct pids) of the API rows."""
        base = header.get("baseTimeNanoseconds")
        dist = di if isinstance(di := header.get("distributedInfo"), dict) else {}
        pid, n = host
        return cls(_int(base, 0) if base is not None else 0,
                   _int(dist.get("rank"), rank) if "rank" in dist else rank,
                   _int(dist.get("world_size"), 1) if "world_size" in dist else 1, pid, n)

    def times(self, c: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """(the columns in ascending start, ties in file order: ``validate_table``'s stable sort,
        done here on int64 columns and codes, not on the DataFrame's categoricals and objects;
        start_ns, end_ns)."""
        # NOTE: in place (the read's own columns): no array of the table's length made here
        s, e = c.pop("start_ns"), c.pop("dur_ns")
        s += np.int64(self.base_ns)
        np.maximum(e, 0, out=e)
        e += s
        if len(s) > 1 and not (s[1:] >= s[:-1]).all():
            o = np.argsort(s, kind="stable")
            s, e = s[o], e[o]
            for k, v in list(c.items()):        # NOTE: in place, a column at a time: one column's copy held
                if isinstance(v, np.ndarray) and len(v) == len(o) and k not in ("start_ns", "dur_ns"):
                    c[k] = v[o]
                    del v
            del o
        return c, s, e

    def device(self, c: dict[str, Any]) -> pd.DataFrame:
        c, s, e = self.times(c)
        return pd.DataFrame({"start_ns": s, "end_ns": e, "kind": categorical(c["kind"], KINDS),
                             "name": categorical(c["name"], c["names"]), "device": c["device"],
                             "stream": c["stream"], "pid": self.host_pid,
                             "correlation": c["correlation"], "rank": self.rank, "bytes": c["bytes"]},
                            copy=False)

    def api(self, c: dict[str, Any]) -> pd.DataFrame:
        c, s, e = self.times(c)
        raw = categorical(c["name"], c["names"])
        mapped = np.asarray([strip_api_suffix(hip_to_cuda(n)) for n in raw.categories], dtype=object)
        kind_lut = np.asarray([api_kind(n).value for n in mapped], dtype=object)
        names = pd.Categorical(mapped[raw.codes])
        kinds = pd.Categorical(kind_lut[raw.codes], categories=[k.value for k in ApiKind])
        return pd.DataFrame({"start_ns": s, "end_ns": e, "pid": c["pid"], "tid": c["tid"],
                             "name": names, "kind": kinds, "correlation": c["correlation"], "rank": self.rank},
                            copy=False)

    def ranges(self, c: dict[str, Any]) -> pd.DataFrame:
        c, s, e = self.times(c)
        names, attrs = split_coded_labels(c["name"], c["names"])
        # NOTE: ids as int32 where they fit (``narrow_ids``): millions of Python frames, 4 bytes a column
        ids = narrow_ids({"pid": c["pid"], "tid": c["tid"], "rank": np.array([self.rank], np.int64)})
        return pd.DataFrame({"start_ns": s, "end_ns": e, "pid": ids["pid"], "tid": ids["tid"],
                             "name": names, "domain": categorical(c["domain"], DOMAINS),
                             "attrs": attrs, "rank": np.full(len(s), ids["rank"][0], ids["rank"].dtype)},
                            copy=False)


@dataclass
class Facts:
    """What the metadata reads of the device and API tables, whole or added chunk by chunk."""

    devices: set[int] = field(default_factory=set)
    kernels: int = 0
    copies: int = 0                     # device rows of other kinds than kernels
    api_rows: int = 0
    graph_corr: set[int] = field(default_factory=set)   # correlations of graph launches
    graph_launches: int = 0
    graph_kernels: int = 0
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)   # table -> (lowest start, highest end) ns

    @classmethod
    def of(cls, device: pd.DataFrame | None, api: pd.DataFrame | None) -> Facts:
        f = cls()
        if api is not None and len(api):
            f.add_api(api)
        if device is not None and len(device):
            f.add_device(device)
        return f

    def add_device(self, d: pd.DataFrame) -> None:
        self.devices.update(d["device"].unique().tolist())
        kern = (d["kind"] == DeviceKind.KERNEL.value).to_numpy()
        self.kernels += int(kern.sum())
        self.copies += int((~kern).sum())
        if self.graph_corr:
            self.graph_kernels += int((d["correlation"].isin(self.graph_corr).to_numpy() & kern).sum())
        self._span("device", d)

    def add_api(self, a: pd.DataFrame) -> None:
        self.api_rows += len(a)
        g = a.loc[a["kind"] == ApiKind.GRAPH_LAUNCH.value, "correlation"]
        self.graph_launches += len(g)
        self.graph_corr.update(g.tolist())
        self._span("api", a)

    def _span(self, table: str, df: pd.DataFrame) -> None:
        lo, hi = int(df["start_ns"].min()), int(df["end_ns"].max())
        a, b = self.spans.get(table, (lo, hi))
        self.spans[table] = (min(a, lo), max(b, hi))


def kineto_meta(path: Path, header: dict[str, Any], fr: Frames, facts: Facts, ranges: pd.DataFrame | None,
                cats: Counter, thread_names: dict[str, str], n_events: int,
                stand_in: pd.DataFrame | None = None) -> TimelineMeta:
    """The Timeline's metadata: what the trace is, holds and lacks (warnings). ``stand_in``: the
    device rows when they are forward stand-ins (``stand_in.forward_stand_ins``)."""
    schema = header.get("schemaVersion")
    meta = TimelineMeta(format=SourceFormat.KINETO, sources=[str(path)], ranks=[fr.rank],
                        world_size=max(fr.world, 1))
    props = dp if isinstance(dp := header.get("deviceProperties"), list) else []
    by_id = {}
    for p in props:
        if isinstance(p, dict) and "id" in p:
            by_id[_int(p.get("id"))] = DeviceInfo(_int(p.get("id")), str(p.get("name", "")),
                                                  _int(p.get("numSms"), 0),
                                                  _int(p.get("totalGlobalMem"), 0))
    meta.devices = [by_id.get(i, DeviceInfo(i)) for i in sorted(facts.devices)]
    runtime_ver = header.get("cuda_runtime_version", header.get("hip_runtime_version"))
    meta.tool_version = f"kineto schema {schema}" + (f", runtime {runtime_ver}" if runtime_ver else "")
    spans = list(facts.spans.values())
    if ranges is not None and len(ranges):
        spans.append((ranges["start_ns"].min(), ranges["end_ns"].max()))
    meta.window_start_ns = int(min(a for a, _ in spans))
    meta.window_end_ns = int(max(b for _, b in spans))
    dist = di if isinstance(di := header.get("distributedInfo"), dict) else {}
    meta.extra.update({
        "kineto.schema_version": schema, "kineto.legacy_2021": bool(_LEGACY_CATS & set(cats)),
        "kineto.events": n_events, "kineto.categories": dict(cats),
        "kineto.thread_names": thread_names, "kineto.base_time_ns": fr.base_ns,
        # per rank too: a merge of several ranks' files keeps one ``kineto.base_time_ns`` only
        f"kineto.base_time_ns.rank{fr.rank}": fr.base_ns,
        "kineto.distributed": {k: v for k, v in dist.items() if k != "pg_config"},
        "kineto.graph_launches": facts.graph_launches, "kineto.graph_kernels": facts.graph_kernels,
        "kineto.rocm": "roctracer_version" in header or "hip_runtime_version" in header,
    })
    n_kern = facts.kernels
    if stand_in is not None:
        note_stand_ins(meta, stand_in)
    if n_kern:
        meta.traced.add(Traced.KERNELS)
    if stand_in is None and facts.copies:
        meta.traced.add(Traced.MEMCPY)
    if facts.api_rows:
        meta.traced.add(Traced.API)
    if ranges is not None:
        meta.traced.add(Traced.NVTX)
    if facts.graph_kernels:
        meta.traced.add(Traced.GRAPH_NODES)
    if not n_kern and stand_in is None:
        meta.warn(WarningCode.NO_KERNELS, "no kernel events (profiler without CUDA activities?)")
    if not facts.api_rows:
        meta.warn(WarningCode.NO_API, "no CUDA runtime events")
    # NOTE: the domain's categories are the domains used (``categorical``)
    if ranges is None or not {"", GPU_DOMAIN} & set(ranges["domain"].cat.categories.tolist()):
        meta.warn(WarningCode.NO_NVTX, "no user annotations (record_function) or stage ranges")
    if facts.graph_launches and not facts.graph_kernels:
        meta.warn(WarningCode.GRAPH_NOT_PER_NODE,
                  f"{facts.graph_launches} graph launch(es) but no kernel carries their correlation")
    if fr.n_pids > 1:
        meta.warn(WarningCode.MULTI_PROCESS, f"CUDA API calls from {fr.n_pids} processes; "
                  f"device rows attributed to pid {fr.host_pid}")
    if schema not in KNOWN_SCHEMAS:
        meta.warn(WarningCode.UNKNOWN_SCHEMA, f"Kineto schemaVersion {schema!r} not seen in testing")
    return meta
