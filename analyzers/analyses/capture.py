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

import numpy as np

from srtscope.analyzers import intervals as iv
from srtscope.analyzers.analyses.device_sets import DeviceSets
from srtscope.analyzers.columns import isin, str_codes
from srtscope.analyzers.host_activity import HostActivity
from srtscope.analyzers.results import BubbleResult, Coverage, DeviceResult, StepsResult
from srtscope.analyzers.timeline import CaptureWarning, DeviceKind, Timeline, WarningCode
from srtscope.analyzers.units import fmt_ns
from srtscope.analyzers.vocab import Cause, StepSource

LOW_DEVICE_SHARE = 0.2       # device busy under this share of the capture ...
ACTIVE_SHARE = 0.6           # ... and its active window under this share of it: low coverage
LOW_ACTIVE_SHARE = 0.3       # an active window under this share of the capture: low coverage however busy
COLD_SHARE = 0.1             # start-up calls over this share of the capture (or of bubble time)
COLD_MIN_WINDOW_SHARE = 0.02  # ... bubble time: only when it is this share of the active window too
MARKER_SOURCES = (StepSource.LOOP_STEP.value, StepSource.SGLANG.value, StepSource.PROFILER_STEP.value,
                  StepSource.VLLM.value)


@dataclass(frozen=True)
class CaptureFacts:
    """What capture adequacy reads from the trace's rows, ns (``capture_facts``)."""

    span: tuple[int, int]           # first start, last end over the device, API and range rows
    first: int | None               # first device activity (None: no device rows)
    last: int | None                # last device activity
    active: int                     # union over devices of their active windows
    startup: int                    # start-up calls' summed time
    in_window: int                  # ... inside [first, last]
    cpu_free: bool                  # no CPU stand-in rows
    kernel_counts: np.ndarray       # kernel rows per kernel name (names with any)


def capture_facts(tl: Timeline, model: HostActivity, sets: DeviceSets | None = None) -> CaptureFacts:
    dev = tl.device
    if len(dev):
        first, last = int(dev["start_ns"].min()), int(dev["end_ns"].max())
        sets = DeviceSets.of(tl, sets)
        lo_hi = np.array([sets.bounds(k) for k in sets.keys], dtype=np.int64)   # each device's active window
        active = iv.total(iv.union(lo_hi[:, 0], lo_hi[:, 1]))
    api = tl.api
    cold = model.cold_calls
    cs, ce = (api["start_ns"].to_numpy()[cold], api["end_ns"].to_numpy()[cold]) if len(api) else ((), ())
    startup = int((np.asarray(ce) - np.asarray(cs)).sum()) if len(api) else 0
    # start-up calls inside the device's active window: those are what the bubbles there wait on
    in_window = (int(np.clip(np.minimum(ce, last) - np.maximum(cs, first), 0, None).sum())
                 if len(api) and len(dev) else 0)
    kmask = isin(dev["kind"], [DeviceKind.KERNEL]) if len(dev) else np.zeros(0, bool)
    per_name = np.zeros(0, np.int64)
    if kmask.any():
        codes, _ = str_codes(dev["name"])
        per_name = np.bincount(codes[kmask])
        per_name = per_name[per_name > 0]
    return CaptureFacts(tl.span_ns, first if len(dev) else None, last if len(dev) else None,
                        active if len(dev) else 0, startup, in_window, _cpu_free(dev) if len(dev) else True,
                        per_name)


def capture_adequacy(tl: Timeline, model: HostActivity, device: DeviceResult, steps: StepsResult,
                     bubbles: BubbleResult, sets: DeviceSets | None = None,
                     facts: CaptureFacts | None = None) -> tuple[Coverage, list[CaptureWarning]]:
    """``sets``: the trace's device sets (built when None); ``facts``: ``capture_facts`` (read from
    ``tl`` when None: ``tl`` gives the metadata only when they are given)."""
    meta = tl.meta
    f = facts or capture_facts(tl, model, sets)
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


def _cpu_free(dev) -> bool:
    """Coverage is a GPU notion: CPU stand-in traces (the engine on a CPU) are not judged by it."""
    return not bool(isin(dev["kind"], [DeviceKind.CPU_FORWARD]).any())
