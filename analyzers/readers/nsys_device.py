"""The device side of an nsys export: kernels, memory copies and sets, CUDA graph executions
(``CUPTI_ACTIVITY_KIND_*``) as device columns, and the GPUs (``TARGET_INFO_GPU``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import DeviceInfo, DeviceKind
from srtscope.analyzers.readers.columnar import cat_from_codes, factorize
from srtscope.analyzers.readers.nsys_strings import NsysStrings
from srtscope.analyzers.readers.nsys_tables import _MASK24, _pid_of
from srtscope.analyzers.readers.nsys_window import Track

_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
#: nsys's ENUM_CUDA_MEM_KIND (the same numbering in exports without that table)
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static"}


def _copy_label(copy_kind: int, src: int, dst: int) -> str:
    """``Memcpy HtoD (Pageable -> Device)`` (Kineto's spelling); the memory kinds only when known."""
    name = f"Memcpy {_COPY_KIND.get(copy_kind, str(copy_kind))}"
    if src in _MEM_KIND and dst in _MEM_KIND:
        name += f" ({_MEM_KIND[src]} -> {_MEM_KIND[dst]})"
    return name


def _kind_col(kind: DeviceKind, n: int) -> pd.Categorical:
    # pandas-stubs wants an Index for categories; a list works at runtime
    return pd.Categorical.from_codes(np.zeros(n, np.int8), categories=[kind.value])  # type: ignore[call-overload]


class DeviceTables(NsysStrings):
    """The device tables as device columns (``Timeline.device``), and the GPUs."""

    def _labels_of(self, table: str, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes, distinct keys) of a label key column: in a windowed read, over the whole table's
        keys (``Window.seen``), so that the categories are those of the whole read."""
        seen = self.window.seen.get(table) if self.window is not None else None
        if seen is None:
            return factorize(key)
        uniq = seen.values("label")
        return (np.searchsorted(uniq, key) if len(uniq) else np.zeros(len(key), np.int64)), uniq

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
