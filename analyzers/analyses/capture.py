"""Capture adequacy: how much of the capture the device was active, and what the trace cannot tell.

Warnings (``WarningCode``), so scripts can rely on the codes:
- ``partial_ranks``: the trace names a world size larger than the ranks given (skew, straggler: null);
- ``low_device_coverage``: the device's active window is under ``LOW_ACTIVE_SHARE`` of the capture,
  or it was busy in under ``LOW_DEVICE_SHARE`` of the capture and active in under ``ACTIVE_SHARE`` of
  it, with where the rest went (before the first device activity, after the last, start-up calls);
- ``cold_start``: allocation, set-up and first-use calls take ``COLD_SHARE`` of the device's active
  window, or a quarter of the bubble time when that is ``COLD_MIN_WINDOW_SHARE`` of the window;
- ``single_iteration``: one marked step per rank, or most kernel names ran once (one pass);
- ``python_tracing``: Python frames were recorded (``with_stack``), which inflates host time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from srtscope.analyzers.analyses.host_activity import HostActivity
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.columns import isin
from srtscope.analyzers.model.results import BubbleResult, CaptureInfo, Coverage, DeviceResult, StepsResult
from srtscope.analyzers.model.timeline import CaptureWarning, DeviceKind, TimelineMeta, WarningCode
from srtscope.analyzers.model.units import fmt_ns
from srtscope.analyzers.model.vocab import Cause, StepSource

LOW_DEVICE_SHARE = 0.2       # device busy under this share of the capture ...
ACTIVE_SHARE = 0.6           # ... and its active window under this share of it: low coverage
LOW_ACTIVE_SHARE = 0.3       # an active window under this share of the capture: low coverage however busy
COLD_SHARE = 0.1             # start-up calls over this share of the capture (or of bubble time)
COLD_MIN_WINDOW_SHARE = 0.02  # ... bubble time: only when it is this share of the active window too
MARKER_SOURCES = (StepSource.LOOP_STEP.value, StepSource.SGLANG.value, StepSource.ENGINE_FRAMES.value,
                  StepSource.PROFILER_STEP.value, StepSource.VLLM.value, StepSource.ITERATION.value)


@dataclass(frozen=True)
class CaptureFacts:
    """What capture adequacy reads from the trace's rows, ns (``facts_of``)."""

    span: tuple[int, int]           # first start, last end over the device, API and range rows
    first: int | None               # first device activity (None: no device rows)
    last: int | None                # last device activity
    active: int                     # union over devices of their active windows
    startup: int                    # start-up calls' summed time
    in_window: int                  # ... inside [first, last]
    cpu_free: bool                  # no CPU stand-in rows
    kernel_counts: np.ndarray       # kernel rows per kernel name (names with any)


def cold_part(api: pd.DataFrame, cold: np.ndarray, bounds: dict[tuple[int, int], tuple[int, int]], lo: int,
              hi: int) -> tuple[int, int]:
    """The start-up calls of ``api`` (``cold``: ``HostActivity.cold_calls``) starting in ``[lo, hi)``:
    (their summed time, their time inside the devices' active window, ``bounds``' span), ns."""
    if len(api) == 0 or not bounds:
        return 0, 0
    st = api["start_ns"].to_numpy()
    m = cold & (st >= lo) & (st < hi)
    cs, ce = st[m], api["end_ns"].to_numpy()[m]
    first = min(b[0] for b in bounds.values())
    last = max(b[1] for b in bounds.values())
    return int((ce - cs).sum()), int(np.clip(np.minimum(ce, last) - np.maximum(cs, first), 0, None).sum())


def facts_of(span: tuple[int, int], bounds: dict[tuple[int, int], tuple[int, int]], cold: list[tuple[int, int]],
             cpu_rows: bool, kernel_counts: np.ndarray) -> CaptureFacts:
    """The capture's facts from the windows' parts: ``span`` of all rows, each device's active window
    (``bounds``), the ``cold_part`` of each window, whether any CPU stand-in row was seen, and the
    kernel rows per name (``kernels.kernel_counts``)."""
    b = np.array(list(bounds.values()), dtype=np.int64).reshape(-1, 2)
    has = len(b) > 0
    return CaptureFacts(span, int(b[:, 0].min()) if has else None, int(b[:, 1].max()) if has else None,
                        iv.total(iv.union(b[:, 0], b[:, 1])) if has else 0,
                        sum(c[0] for c in cold), sum(c[1] for c in cold), not cpu_rows, kernel_counts)


def capture_adequacy(meta: TimelineMeta, model: HostActivity, device: DeviceResult, steps: StepsResult,
                     bubbles: BubbleResult, f: CaptureFacts) -> tuple[Coverage, list[CaptureWarning]]:
    """What the capture recorded and what it missed, from the trace's metadata and facts (``facts_of``)."""
    lo, hi = f.span
    c_lo = meta.window_start_ns if meta.window_end_ns > meta.window_start_ns else lo
    c_hi = meta.window_end_ns if meta.window_end_ns > meta.window_start_ns else hi
    n_dev = max(len(bubbles.by_device), 1)
    has_dev = f.first is not None and f.last is not None
    first = f.first if f.first is not None else c_lo
    last = f.last if f.last is not None else c_lo
    active, startup, in_window = f.active, f.startup, f.in_window
    # NOTE: session bounds that do not hold the device activity are widened to it (host rows can
    # carry stray timestamps; device rows are what the capture is about)
    c_lo, c_hi = min(c_lo, first), max(c_hi, last)
    capture = max(c_hi - c_lo, 0)
    share = device.busy_ns / (capture * n_dev) if capture else 0.0
    cov = Coverage(capture, active, share, max(first - c_lo, 0) if has_dev else 0,
                   max(c_hi - last, 0) if has_dev else 0, startup)
    out: list[CaptureWarning] = []
    if meta.world_size > len(set(meta.ranks)):
        out.append(CaptureWarning(WarningCode.PARTIAL_RANKS,
                                  f"the job had {meta.world_size} ranks, the trace holds {len(set(meta.ranks))} "
                                  f"({sorted(set(meta.ranks))}): cross-rank skew and the straggler cannot be told"))
    # NOTE: a device idle in its own active window is the verdict's subject, not a capture problem:
    # coverage is low when the active window itself is a small part of the capture
    if capture and has_dev and f.cpu_free and (active < LOW_ACTIVE_SHARE * capture or (
            share < LOW_DEVICE_SHARE and active < ACTIVE_SHARE * capture * n_dev)):
        out.append(CaptureWarning(WarningCode.LOW_DEVICE_COVERAGE,
                                  f"the device was busy {100 * share:.1f}% of the {fmt_ns(capture)} capture and "
                                  f"active (first to last activity) {100 * active / capture:.0f}% of it; "
                                  f"{fmt_ns(cov.before_first_ns)} before its first activity, "
                                  f"{fmt_ns(cov.after_last_ns)} after its last; start-up calls "
                                  f"{fmt_ns(startup)}"))
    cold_bubbles = bubbles.by_cause.get(Cause.COLD_START.value, 0)
    window = max(last - first, 0)
    if window and (in_window >= COLD_SHARE * window or
                   (bubbles.total_ns and cold_bubbles >= 0.25 * bubbles.total_ns
                    and cold_bubbles >= COLD_MIN_WINDOW_SHARE * window)):
        out.append(CaptureWarning(WarningCode.COLD_START,
                                  f"start-up inside the device's active window: allocation, set-up and "
                                  f"first-use calls {fmt_ns(in_window)} ({100 * in_window / window:.0f}% of it), "
                                  f"{fmt_ns(cold_bubbles)} of bubble time; warm up before capturing"))
    per_rank = steps.per_rank
    one_step = steps.source in MARKER_SOURCES and per_rank and max(per_rank.values()) <= 1
    # one pass: most kernel names ran once (an iterating program repeats each of them)
    n_kern = int(f.kernel_counts.sum())
    one_pass = bool(n_kern) and float(np.median(f.kernel_counts)) <= 1
    if one_step or one_pass:
        why = (f"one {steps.source} step per rank" if one_step
               else f"most of the {n_kern} kernels ran once (one pass)")
        out.append(CaptureWarning(WarningCode.SINGLE_ITERATION,
                                  f"{why}: figures are one sample, not a steady state"))
    if model.has_python_frames:
        out.append(CaptureWarning(WarningCode.PYTHON_TRACING,
                                  f"{len(model.frames)} Python frames recorded (with_stack): host time is "
                                  "inflated by the tracing itself"))
    return cov, out


def stand_in_part(dev: pd.DataFrame, lo: int, hi: int) -> bool:
    """Whether a CPU stand-in row of ``dev`` starts in ``[lo, hi)``. Coverage is a GPU notion: CPU
    stand-in traces (the engine on a CPU) are not judged by it."""
    if len(dev) == 0:
        return False
    st = dev["start_ns"].to_numpy()
    return bool(((st >= lo) & (st < hi) & isin(dev["kind"], [DeviceKind.CPU_FORWARD])).any())
def capture_info(m: TimelineMeta, keys: list[tuple[int, int]], span: tuple[int, int], coverage: Any) -> CaptureInfo:
    """What was captured: ``m`` (with the diagnosis's warnings), the (rank, device) ``keys`` with
    activity, sorted, and the span of all rows (the window where the metadata names none)."""
    names = {d.id: d.name for d in m.devices}
    devices = tuple({"id": d, "name": names.get(d, ""), "rank": r} for r, d in keys)
    lo, hi = span
    return CaptureInfo(format=m.format.value if hasattr(m.format, "value") else str(m.format),
                       tool_version=m.tool_version, sources=tuple(m.sources), devices=devices,
                       ranks=tuple(m.ranks), window_ns=int((m.window_end_ns - m.window_start_ns) or (hi - lo)),
                       traced=tuple(sorted(t.value for t in m.traced)),
                       warnings=tuple({"code": w.code.value, "message": w.message} for w in m.warnings),
                       world_size=int(m.world_size), coverage=coverage)
