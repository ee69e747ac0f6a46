"""Typed results of the analyses and the ``Diagnosis`` that holds them all (the verdict's own in
``model/verdicts.py``).

``Diagnosis.to_json()`` is the ``srtscope diagnose --json`` contract (docs/json_contract.md):
stable keys, every time an integer number of nanoseconds, fractions as floats in 0..1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from srtscope.analyzers.model.units import bound_strings
from srtscope.analyzers.model.verdicts import Verdict, WhatIf
from srtscope.analyzers.model.vocab import BUBBLE_CLASSES, StepExec

#: The classes a bubble's time is split into; they add up to the bubble exactly.


JSON_VERSION = 1


def _ns(x: Any) -> int:
    return int(x)


@dataclass(frozen=True)
class HistogramBin:
    lo_ns: int
    hi_ns: int | None   # None: open-ended last bin
    count: int
    total_ns: int

    def to_json(self) -> dict[str, Any]:
        return {"lo_ns": _ns(self.lo_ns), "hi_ns": None if self.hi_ns is None else _ns(self.hi_ns),
                "count": int(self.count), "total_ns": _ns(self.total_ns)}


@dataclass(frozen=True)
class BubbleResult:
    """Device idle time inside the active window, attributed to the host's activity.

    ``table``: one row per bubble (rank, device, start_ns, end_ns, dur_ns, pid, tid, one ``<class>_ns``
    column per class of ``BUBBLE_CLASSES``, top_stage). ``by_stream``: per (rank, device, stream).
    """

    count: int
    total_ns: int
    window_ns: int                       # summed active windows over devices
    busy_ns: int                         # summed device busy time (union of streams)
    by_class: dict[str, int]
    by_stage: dict[str, int]
    histogram: tuple[HistogramBin, ...]
    threshold_ns: int
    nvtx_coverage: float | None          # share of bubble time with any range open on the host thread
    table: pd.DataFrame
    by_device: pd.DataFrame
    by_stream: pd.DataFrame
    # unattributed time inside the trace's own non-stage ranges (innermost), largest first
    by_user_range: dict[str, int] = field(default_factory=dict)
    by_cause: dict[str, int] = field(default_factory=dict)   # bubble time per cause (adds up to total)
    sub_threshold_ns: int = 0            # idle time in gaps at or under the threshold (not bubbles)
    sub_threshold_count: int = 0

    def to_json(self, top: int = 20) -> dict[str, Any]:
        largest = self.table.nlargest(top, "dur_ns") if len(self.table) else self.table
        return {
            "count": int(self.count), "total_ns": _ns(self.total_ns),
            "window_ns": _ns(self.window_ns), "busy_ns": _ns(self.busy_ns),
            "idle_share": round(self.total_ns / self.window_ns, 4) if self.window_ns else 0.0,
            "threshold_ns": _ns(self.threshold_ns),
            "by_class": {c: _ns(self.by_class.get(c, 0)) for c in BUBBLE_CLASSES},
            "by_cause": {k: _ns(v) for k, v in self.by_cause.items()},
            "sub_threshold_ns": _ns(self.sub_threshold_ns), "sub_threshold_count": int(self.sub_threshold_count),
            "by_stage": {k: _ns(v) for k, v in self.by_stage.items()},
            "by_user_range": {k: _ns(v) for k, v in list(self.by_user_range.items())[:top]},
            "histogram": [b.to_json() for b in self.histogram],
            "nvtx_coverage": None if self.nvtx_coverage is None else round(self.nvtx_coverage, 4),
            "by_device": _records(self.by_device),
            "by_stream": _records(self.by_stream),
            "largest": _records(largest[["rank", "device", "start_ns", "dur_ns", "tid", "top_stage"]
                                        + [f"{c}_ns" for c in BUBBLE_CLASSES]]) if len(largest) else [],
        }


@dataclass(frozen=True)
class StepsResult:
    """Engine steps: ``table`` one row per step (see ``analyses.steps.STEP_COLUMNS``)."""

    source: str                          # a StepSource value
    table: pd.DataFrame
    eager_reasons: dict[str, int]

    @property
    def count(self) -> int:
        return len(self.table)

    @property
    def per_rank(self) -> dict[int, int]:
        """Steps per rank (steps are counted per rank; ``count`` sums them)."""
        if len(self.table) == 0:
            return {}
        return {int(cast(int, k)): int(v) for k, v in self.table.groupby("rank").size().items()}

    def n_exec(self, kind: StepExec) -> int:
        return int((self.table["exec"] == kind.value).sum()) if len(self.table) else 0

    def to_json(self, cap: int = 200) -> dict[str, Any]:
        cols = ["step", "rank", "start_ns", "wall_ns", "mode", "bs", "exec", "reason", "busy_ns",
                "launches", "graph_launches", "graph_kernels"]
        return {"count": self.count, "source": self.source,
                "per_rank": {str(k): v for k, v in self.per_rank.items()}, "graph": self.n_exec(StepExec.GRAPH),
                "eager": self.n_exec(StepExec.EAGER), "idle": self.n_exec(StepExec.IDLE),
                "eager_reasons": {k: int(v) for k, v in self.eager_reasons.items()},
                "per_step_cap": cap, "per_step": _records(self.table[cols].head(cap))
                if len(self.table) else []}


@dataclass(frozen=True)
class EagerResult:
    """Decode steps that ran eagerly while graphs were used elsewhere, and what that cost."""

    graph_steps: int
    eager_decode_steps: int
    reasons: dict[str, int]
    max_captured_bs: int | None
    eager_mean_wall_ns: int | None
    graph_mean_wall_ns: int | None
    eager_mean_launches: float | None
    graph_mean_launches: float | None
    extra_ns: int                        # summed wall time above the graph steps of similar size
    example_steps: tuple[int, ...]
    batch_sizes: tuple[int, ...] = ()    # distinct known batch sizes of the fallback steps

    def to_json(self) -> dict[str, Any]:
        opt = lambda v: None if v is None else int(v)  # noqa: E731
        optf = lambda v: None if v is None else round(float(v), 2)  # noqa: E731
        return {"graph_steps": self.graph_steps, "eager_decode_steps": self.eager_decode_steps,
                "reasons": dict(self.reasons), "max_captured_bs": opt(self.max_captured_bs),
                "eager_mean_wall_ns": opt(self.eager_mean_wall_ns),
                "graph_mean_wall_ns": opt(self.graph_mean_wall_ns),
                "eager_mean_launches": optf(self.eager_mean_launches),
                "graph_mean_launches": optf(self.graph_mean_launches),
                "extra_ns": _ns(self.extra_ns), "example_steps": list(self.example_steps),
                "batch_sizes": list(self.batch_sizes)}


@dataclass(frozen=True)
class CommResult:
    """Collective communication: total, exposed (not overlapped by compute), cross-rank skew."""

    total_ns: int
    exposed_ns: int
    skew_ns: int                          # summed arrival skew over matched collectives
    transfer_ns: int                      # summed shortest duration over matched collectives
    n_kernels: int
    participants: int
    straggler_rank: int | None
    straggler_device: int | None
    straggler_share: float | None         # share of collectives where the straggler arrived last
    straggler_host_stage: str | None      # what the straggler's host was doing just before
    straggler_device_busy: float | None   # share of that time its device was busy computing
    source: str                           # kernels | stand_in | ranges | none
    collectives: pd.DataFrame             # one row per matched collective
    partial: bool = False                 # only some ranks of the job: skew and straggler unknown
    #: per row of ``collectives``: the straggler's arrival minus the latest other participant's, ns
    #: (> 0 where it arrived last; empty when no straggler is named)
    straggler_offset_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def to_json(self, cap: int = 50) -> dict[str, Any]:
        top = self.collectives.nlargest(cap, "skew_ns") if len(self.collectives) else self.collectives
        if self.partial:
            return {"total_ns": _ns(self.total_ns), "exposed_ns": _ns(self.exposed_ns), "skew_ns": None,
                    "transfer_ns": _ns(self.transfer_ns), "kernels": self.n_kernels,
                    "participants": self.participants, "straggler_rank": None, "straggler_device": None,
                    "straggler_share": None, "straggler_host_stage": None, "straggler_device_busy": None,
                    "source": self.source, "partial": True, "collectives_cap": cap, "collectives": []}
        return {"total_ns": _ns(self.total_ns), "exposed_ns": _ns(self.exposed_ns),
                "skew_ns": _ns(self.skew_ns), "transfer_ns": _ns(self.transfer_ns),
                "kernels": self.n_kernels, "participants": self.participants,
                "straggler_rank": self.straggler_rank, "straggler_device": self.straggler_device,
                "straggler_share": None if self.straggler_share is None
                else round(self.straggler_share, 4),
                "straggler_host_stage": self.straggler_host_stage,
                "straggler_device_busy": None if self.straggler_device_busy is None
                else round(self.straggler_device_busy, 4), "source": self.source, "partial": False,
                "collectives_cap": cap, "collectives": _records(top)}


@dataclass(frozen=True)
class BudgetResult:
    """Step wall time = compute + exposed comm + bubbles by class + other (short gaps, idle edges)."""

    steps: int
    wall_ns: int
    compute_ns: int
    exposed_comm_ns: int
    bubbles_ns: dict[str, int]
    other_ns: int
    table: pd.DataFrame
    #: per row of ``table``: a warm-up step, left out of ``mean_step`` (``analyses.losses.warmup_mask``)
    warmup: Any = field(default=None, compare=False, repr=False)
    #: per cause: lost time per mean step, warm-up left out (``analyses.losses``: the what-if's accounting)
    lost_ns: dict[str, int] = field(default_factory=dict)

    def to_json(self, cap: int = 200) -> dict[str, Any]:
        bt = self.table
        warm = np.zeros(len(bt), bool) if self.warmup is None or len(self.warmup) != len(bt) \
            else np.asarray(self.warmup, bool)
        n = int((~warm).sum()) if len(bt) else self.steps
        if warm.any():
            steady = bt[~warm]
            tot = {"wall": int(steady["wall_ns"].sum()), "compute": int(steady["compute_ns"].sum()),
                   "comm": int(steady["exposed_comm_ns"].sum()),
                   "bubbles": int(sum(steady[f"{c}_ns"].sum() for c in BUBBLE_CLASSES)),
                   "other": int(steady["other_ns"].sum())}
        else:
            tot = {"wall": self.wall_ns, "compute": self.compute_ns, "comm": self.exposed_comm_ns,
                   "bubbles": sum(self.bubbles_ns.values()), "other": self.other_ns}
        mean = (lambda v: int(v // n)) if n else (lambda v: 0)
        return {"steps": self.steps, "warmup_steps": int(warm.sum()),
                "wall_ns": _ns(self.wall_ns), "compute_ns": _ns(self.compute_ns),
                "exposed_comm_ns": _ns(self.exposed_comm_ns),
                "bubbles_ns": {c: _ns(self.bubbles_ns.get(c, 0)) for c in BUBBLE_CLASSES},
                "other_ns": _ns(self.other_ns),
                "parts_ns": {"compute": _ns(self.compute_ns), "comm": _ns(self.exposed_comm_ns),
                             **{f"bubble.{c}": _ns(self.bubbles_ns.get(c, 0)) for c in BUBBLE_CLASSES},
                             "other": _ns(self.other_ns)},
                "mean_step": {"wall_ns": mean(tot["wall"]), "compute_ns": mean(tot["compute"]),
                              "exposed_comm_ns": mean(tot["comm"]), "bubbles_ns": mean(tot["bubbles"]),
                              "other_ns": mean(tot["other"]),
                              "lost_ns": {k: _ns(v) for k, v in self.lost_ns.items()}},
                "per_step_cap": cap, "per_step": _records(self.table.head(cap))}


@dataclass(frozen=True)
class CopyStat:
    """Copies of one direction: summed duration, count, bytes (-1 unknown), GB/s, pageable part."""

    ns: int
    count: int
    bytes: int
    gbps: float | None
    pageable_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"ns": _ns(self.ns), "count": int(self.count), "bytes": int(self.bytes),
                "gbps": self.gbps, "pageable_ns": _ns(self.pageable_ns)}


@dataclass(frozen=True)
class DeviceResult:
    """What device busy time was made of, summed over devices (parts may overlap each other)."""

    busy_ns: int
    kernel_ns: int                # compute kernels (collectives excluded)
    comm_ns: int                  # collective kernels
    memcpy_ns: int
    memset_ns: int
    exposed_memcpy_ns: int        # copy time with no kernel running on that device
    memcpy: dict[str, CopyStat]   # by direction: HtoD, DtoH, DtoD, PtoP, HtoH, other

    def to_json(self) -> dict[str, Any]:
        return {"busy_ns": _ns(self.busy_ns), "kernel_ns": _ns(self.kernel_ns), "comm_ns": _ns(self.comm_ns),
                "memcpy_ns": _ns(self.memcpy_ns), "memset_ns": _ns(self.memset_ns),
                "exposed_memcpy_ns": _ns(self.exposed_memcpy_ns),
                "memcpy": {k: v.to_json() for k, v in self.memcpy.items()}}


@dataclass(frozen=True)
class Coverage:
    """How much of the capture the device was active, and what the host did outside it."""

    capture_ns: int               # the capture's span (session bounds, or the trimmed window)
    device_active_ns: int         # union over devices of their active windows
    device_busy_share: float      # device busy / capture, summed over devices / devices
    before_first_ns: int          # capture start -> first device activity
    after_last_ns: int            # last device activity -> capture end
    startup_api_ns: int           # allocation, set-up and first-use calls anywhere in the capture

    def to_json(self) -> dict[str, Any]:
        return {"capture_ns": _ns(self.capture_ns), "device_active_ns": _ns(self.device_active_ns),
                "device_busy_share": round(self.device_busy_share, 4),
                "before_first_ns": _ns(self.before_first_ns), "after_last_ns": _ns(self.after_last_ns),
                "startup_api_ns": _ns(self.startup_api_ns)}


@dataclass(frozen=True)
class DeviceOverview:
    """One device's active window in ``OverviewResult.bins`` bins of ``bin_ns`` from ``start_ns``."""

    rank: int
    device: int
    start_ns: int
    bin_ns: int
    kernel_ns: list[int]                 # per bin: compute kernels (collectives excluded)
    memcpy_ns: list[int]                 # per bin: copies and memsets
    comm_ns: list[int]                   # per bin: collectives
    bubbles_ns: dict[str, list[int]]     # per class with any time: bubble time per bin
    steps_ns: list[int]                  # step starts on this rank inside the window

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "start_ns": _ns(self.start_ns),
                "bin_ns": _ns(self.bin_ns), "kernel_ns": self.kernel_ns, "memcpy_ns": self.memcpy_ns,
                "comm_ns": self.comm_ns, "bubbles_ns": dict(self.bubbles_ns), "steps_ns": self.steps_ns}


@dataclass(frozen=True)
class OverviewResult:
    bins: int
    devices: tuple[DeviceOverview, ...]

    def to_json(self) -> dict[str, Any]:
        return {"bins": self.bins, "devices": [d.to_json() for d in self.devices]}


@dataclass(frozen=True)
class CaptureInfo:
    format: str
    tool_version: str
    sources: tuple[str, ...]
    devices: tuple[dict[str, Any], ...]      # {"id", "name", "rank"} per device seen
    ranks: tuple[int, ...]
    window_ns: int
    traced: tuple[str, ...]
    warnings: tuple[dict[str, str], ...]
    world_size: int = 1
    coverage: Coverage | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "tool_version": self.tool_version, "sources": list(self.sources),
                "devices": [dict(d) for d in self.devices],
                "ranks": list(self.ranks), "world_size": int(self.world_size), "window_ns": _ns(self.window_ns),
                "traced": list(self.traced), "warnings": [dict(w) for w in self.warnings],
                "coverage": None if self.coverage is None else self.coverage.to_json()}


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    bubbles: BubbleResult
    steps: StepsResult
    eager: EagerResult
    comm: CommResult
    budget: BudgetResult
    top_kernels: pd.DataFrame            # name, count, total_ns, mean_ns, share
    capture: CaptureInfo
    params: dict[str, Any] = field(default_factory=dict)
    device: DeviceResult | None = None
    overview: OverviewResult | None = None
    what_if: tuple[WhatIf, ...] = ()      # largest saving first (analyses.whatif)
    top_ranges: pd.DataFrame | None = None  # name (instances as N), count, total_ns, mean_ns
    phases: tuple[Any, ...] = ()          # analyses.phases.PhaseBudget: prefill, decode (or none)

    def to_json(self) -> dict[str, Any]:
        steps = self.steps.to_json()
        bt = self.budget.table
        for rec, parts in zip(steps["per_step"], _step_parts(bt.head(len(steps["per_step"])))):
            rec["parts_ns"] = parts
        e = self.eager
        steps["fallback"] = {"steps": e.eager_decode_steps, "batch_sizes": list(e.batch_sizes),
                             "launches_per_step_eager": e.eager_mean_launches,
                             "launches_per_step_graph": e.graph_mean_launches}
        return bound_strings({"version": JSON_VERSION, "verdict": self.verdict.to_json(),
                "bubbles": self.bubbles.to_json(), "steps": steps,
                "eager": self.eager.to_json(), "comm": self.comm.to_json(),
                "budget": self.budget.to_json(), "top_kernels": _records(self.top_kernels),
                "device": None if self.device is None else self.device.to_json(),
                "overview": None if self.overview is None else self.overview.to_json(),
                "capture": self.capture.to_json(), "params": dict(self.params),
                "what_if": [w.to_json() for w in self.what_if],
                "top_ranges": [] if self.top_ranges is None else _records(self.top_ranges),
                "phases": [ph.to_json() for ph in self.phases]})  # type: ignore[return-value]


def _step_parts(bt: pd.DataFrame) -> list[dict[str, int]]:
    """Per budget row: busy (compute), comm, each bubble class and other — adding up to wall_ns."""
    cols = ["compute_ns", "exposed_comm_ns", *(f"{c}_ns" for c in BUBBLE_CLASSES), "other_ns"]
    keys = ["busy", "comm", *BUBBLE_CLASSES, "other"]
    return [dict(zip(keys, (int(v) for v in row))) for row in bt[cols].itertuples(index=False, name=None)]


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame -> JSON-safe records (numpy scalars to Python, NaN to None)."""
    out = []
    cols = list(df.columns)
    for row in df.itertuples(index=False, name=None):
        rec = {}
        for c, v in zip(cols, row):
            if hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and v != v:
                v = None
            if isinstance(v, float) and (c.endswith("_ns")):
                v = int(v)
            rec[c] = v
        out.append(rec)
    return out
