"""Tiny in-memory Timelines for the analysis tests: every event says which scenario it exists for."""
from __future__ import annotations

import pandas as pd

from srtscope.analyzers.model.names import api_kind
from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat, Timeline, TimelineMeta, Traced

US = 1000


def kernel(start_us: float, end_us: float, name: str = "gemm", *, corr: int = -1, stream: int = 7,
           device: int = 0, rank: int = 0, pid: int = 100, kind: str = DeviceKind.KERNEL.value,
           graph_id: int = -1) -> dict:
    return {"start_ns": int(start_us * US), "end_ns": int(end_us * US), "kind": kind, "name": name,
            "device": device, "stream": stream, "pid": pid, "correlation": corr, "graph_id": graph_id,
            "rank": rank}


def api(start_us: float, end_us: float, name: str = "cudaLaunchKernel", *, corr: int = -1, tid: int = 1,
        pid: int = 100, rank: int = 0) -> dict:
    return {"start_ns": int(start_us * US), "end_ns": int(end_us * US), "name": name,
            "kind": api_kind(name).value, "correlation": corr, "pid": pid, "tid": tid, "rank": rank}


def rng(start_us: float, end_us: float, name: str, *, tid: int = 1, pid: int = 100, rank: int = 0,
        domain: str = "srtscope", **attrs) -> dict:
    return {"start_ns": int(start_us * US), "end_ns": int(end_us * US), "name": name, "pid": pid,
            "tid": tid, "rank": rank, "domain": domain, "attrs": attrs or None}


def timeline(device=(), api_rows=(), ranges=(), fmt=SourceFormat.SYNTHETIC, ranks=(0,)) -> Timeline:
    meta = TimelineMeta(format=fmt, sources=["test"], ranks=list(ranks),
                        traced={Traced.KERNELS, Traced.API, Traced.NVTX})
    df = lambda rows: pd.DataFrame(list(rows)) if rows else None  # noqa: E731
    return Timeline.build(meta, device=df(device), api=df(api_rows), ranges=df(ranges))


def bubbles_of(tl: Timeline, threshold_ns: int) -> pd.DataFrame:
    """The bubbles of a whole read (one window of all time: ``bubbles.gaps_part``), with ``next_row``."""
    from srtscope.analyzers.analyses.bubbles import gaps_part
    from srtscope.analyzers.analyses.device_sets import DeviceSets
    from srtscope.analyzers.pipeline.window import ALL_TIME
    return gaps_part(DeviceSets(tl), ALL_TIME.lo_ns, ALL_TIME.hi_ns, threshold_ns)[0]


def communication(tl: Timeline, min_skew_ns: int = 10_000):
    """The communication figures of ``tl``'s diagnosis (``CommResult``)."""
    from srtscope.analyzers.diagnose import diagnose
    from srtscope.analyzers.model.params import DiagnoseParams
    return diagnose(tl, DiagnoseParams(min_skew_us=min_skew_ns / 1000)).comm
