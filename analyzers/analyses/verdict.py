"""Verdict: a bottleneck class and the cause beneath it, with a confidence, the evidence, the
capture's caveats and what to do next.

Lost time, per cause (``vocab.Cause``), adds up from:
- bubble time, by the cause the host-activity model gave each piece (``bubbles.by_cause``);
- gaps at or under the bubble threshold (many tiny gaps between serially launched kernels):
  ``launch_bound``, or ``eager_fallback`` for the share of steps that fell back to eager — but the
  gaps inside a replayed CUDA graph, which are the device's own (``compute``: no launch to cut);
- exposed communication (plus, where collectives are only host ranges, their arrival skew):
  ``exposed_comm``, less a named straggler's lead over the next-latest rank, which is ``straggler``;
- copy time with no kernel running (``device.exposed_memcpy_ns``): ``memcpy``;
- step time outside the device's active window, by the host cause it is attributed to (the same
  edges the what-if gives back: ``losses.StepLosses.edges``; only when those steps hold the
  device's work, ``StepLosses.predictable``).
The cause named is the one whose fix gives most by the what-if (``_worth_fixing``: when its steps
cover at least ``WHATIF_RANK_SHARE`` of the device's active window), else the largest cause of the largest class;
the headline quotes that cause's own share of lost time (the class's total after it when larger),
and says why when the largest loss is not the cause named.
A class's score is the sum of its causes; scheduler or prep can only score with their own evidence
(stage ranges, engine frames) — nothing is blamed by default, and host time nothing explains is
``host`` / ``host_unattributed``, said as such.

Healthy: the steps' idle device time (bubbles, tiny gaps, and the steps' host time before the
device's first or after its last activity: a step holds all of its time) and each of exposed
communication and exposed copies under ``healthy_pct`` of the active window and those edges, the
warm-up steps' time left out as it is of the mean step: ``kernel`` / ``compute``. No dominant
bottleneck (``dominance.no_dominant``), also ``kernel`` / ``compute`` and healthy: the steps hold
most of the lost time, and the largest cause loses under ``dominance.DOMINANT_STEP_SHARE`` of the
mean step and under ``DOMINANT_RATIO`` x the next cause, or it is the engine's scheduling, batch
preparation or hand-off under ``STAGE_STEP_SHARE`` of the typical (median) step, lost steadily step after step
(``dominance.steady``) — a clean engine spends that on its stages every step, which names no
bottleneck; an intermittent stall of the same mean is a fault.
A what-if saving under ``NEGLIGIBLE_STEP_SHARE`` of the mean step never names its cause over one
that lost more.

confidence = dominance of the top class x (0.4 + 0.6 x evidenced share of lost time)
             x capture adequacy (0.85 per adequacy warning, floor 0.4); healthy: 0.7..1 x adequacy;
             no dominant bottleneck: 0.5..0.8 x adequacy, by the margin the rule held by;
             at most 0.5 for ``host_unattributed``, at most ``CAP_THIN`` for a single iteration or a
             low-coverage capture.
"""
from __future__ import annotations

from typing import cast

import pandas as pd

from srtscope.analyzers.analyses.advice import advice_for
from srtscope.analyzers.analyses.attribution import PYTHON_LABEL
from srtscope.analyzers.analyses.comm import lateness
from srtscope.analyzers.analyses.dominance import no_dominant
from srtscope.analyzers.analyses.io_frames import IoWork
from srtscope.analyzers.analyses.losses import WARMUP_FACTOR, StepLosses
from srtscope.analyzers.model.results import BubbleResult, CommResult, Coverage, DeviceResult, EagerResult, StepsResult
from srtscope.analyzers.model.timeline import SourceFormat, TimelineMeta, WarningCode
from srtscope.analyzers.model.units import clip_text, fmt_ns, plural
from srtscope.analyzers.model.verdicts import Advice, Finding, Verdict, WhatIf
from srtscope.analyzers.model.verdicts import Bottleneck as BottleneckName
from srtscope.analyzers.model.vocab import Bottleneck, Cause, World

_ADEQUACY = (WarningCode.NO_NVTX, WarningCode.GRAPH_NOT_PER_NODE, WarningCode.LOW_NVTX_COVERAGE,
             WarningCode.WINDOW_CUT, WarningCode.NO_API, WarningCode.UNKNOWN_SCHEMA, WarningCode.NO_KERNELS,
             WarningCode.PARTIAL_RANKS, WarningCode.COLD_START, WarningCode.PYTHON_TRACING,
             WarningCode.CORRUPT)
_THIN = (WarningCode.SINGLE_ITERATION, WarningCode.LOW_DEVICE_COVERAGE)
LOW_COVERAGE = 0.5
CAP_THIN = 0.6


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b else 0.0


#: a caveat about bubble time fires only when the bubbles hold at least this share of the window
CAVEAT_WINDOW_SHARE = 0.02


def caveats(meta: TimelineMeta, bubbles: BubbleResult, steps_source: str,
            losses: StepLosses | None = None) -> tuple[list[str], int]:
    """(caveat lines, number of adequacy problems)."""
    out = [f"{w.code.value}: {w.message}" for w in meta.warnings]
    problems = sum(1 for w in meta.warnings if w.code in _ADEQUACY)
    if bubbles.nvtx_coverage is not None and bubbles.total_ns and bubbles.nvtx_coverage < LOW_COVERAGE \
            and not meta.has_warning(WarningCode.LOW_NVTX_COVERAGE):
        # NOTE: the ranges are the trace's own kind: NVTX in an nsys export, user annotations
        # (record_function) in a Kineto trace, srtscope's stage ranges in a probe trace
        ranges = {SourceFormat.KINETO: "user annotations (record_function)",
                  SourceFormat.PROBE: "srtscope's stage ranges"}.get(meta.format, "NVTX ranges")
        out.append(f"low_nvtx_coverage: {ranges} cover {100 * bubbles.nvtx_coverage:.0f}% of the "
                   "launching thread's time during bubbles")
        problems += 1
    una = bubbles.by_class.get("unattributed", 0)
    if bubbles.total_ns and una > 0.25 * bubbles.total_ns and una >= CAVEAT_WINDOW_SHARE * bubbles.window_ns:
        out.append(f"unattributed: {_pct(una, bubbles.total_ns):.0f}% of bubble time has no range, operator, "
                   "frame or telling CUDA/OS call on the launching thread")
    if steps_source == "none":
        out.append("no_steps: no engine steps found (no step markers, no API calls)")
    if losses is not None and losses.warmup.any():
        n = int(losses.warmup.sum())
        first = "the first step" if n == 1 else f"the first {n} steps"
        out.append(f"warmup_steps: {first}, over {WARMUP_FACTOR:g}x the median step, left out of the mean step "
                   "and the what-if as warm-up (a slowness that recurs later is a cause, never warm-up)")
    return out, problems


def lost_by_cause(bubbles: BubbleResult, comm: CommResult, device: DeviceResult | None,
                  fallback_small_ns: int, partial_ranks: bool,
                  edges_ns: dict[str, int] | None = None, graphed_ns: int = 0) -> dict[str, int]:
    """Lost time per cause (ns), every source of lost time included; zero causes left out.

    ``fallback_small_ns``: the gaps under the bubble threshold inside eager-fallback steps (the
    fallback's); ``graphed_ns``: those inside replayed CUDA graphs (the device's own: ``compute``);
    the rest of the short gaps are launch-bound; ``edges_ns``: per host cause, step time outside the
    device's active window (``losses.StepLosses.edges``)."""
    out = {c.value: 0 for c in Cause}
    for c, ns in bubbles.by_cause.items():
        out[c] += int(ns)
    for c, ns in (edges_ns or {}).items():
        out[c] += int(ns)
    small = int(bubbles.sub_threshold_ns)
    graphed = min(max(int(graphed_ns), 0), small)
    fb = min(max(int(fallback_small_ns), 0), small - graphed)
    out[Cause.COMPUTE.value] += graphed
    out[Cause.EAGER_FALLBACK.value] += fb
    out[Cause.LAUNCH_BOUND.value] += small - fb - graphed
    skew = comm.skew_ns if comm.source == "ranges" else 0
    comm_lost = comm.exposed_ns + skew
    straggler = 0
    if not partial_ranks and (comm.straggler_rank is not None or comm.straggler_device is not None):
        # the collectives waited for it alone for its lead over the next-latest participant; the rest
        # of the skew (others late) stays exposed communication
        straggler = min(int(lateness(comm.straggler_offset_ns)[0].sum()), comm_lost)
    out[Cause.STRAGGLER.value] += straggler
    out[Cause.EXPOSED_COMM.value] += comm_lost - straggler
    if device is not None:
        out[Cause.MEMCPY.value] += int(device.exposed_memcpy_ns)
    return {k: v for k, v in out.items() if v > 0}


#: the what-if ranks the causes (what fixing each gives) when its steps cover at least this share of
#: the device's active window; else the lost time itself does
WHATIF_RANK_SHARE = 0.5
#: ... and its best fix saves at least this share of the mean step (else no fix matters in the steps)
WORTH_STEP_SHARE = 0.02
#: a what-if saving under this share of the mean step never names the cause over one that lost more
NEGLIGIBLE_STEP_SHARE = 0.05
#: the headline names the class's share too when it exceeds the cause's by this many points
CLASS_NOTE_POINTS = 5.0


def _worth_fixing(causes: dict[str, int], what_if: tuple[WhatIf, ...], losses: StepLosses | None,
                  lost: int, window_ns: int) -> tuple[str | None, str]:
    """(the cause whose fix gives most by the what-if, or None when the what-if cannot rank: nothing
    predicted, no fix worth ``WORTH_STEP_SHARE`` of a step, or its steps cover under
    ``WHATIF_RANK_SHARE`` of the device's active window — one-off work in the rest, an upload at
    start, changes no step; the text saying why the cause named is
    not the largest loss, or not the what-if's first)."""
    rows = [w for w in what_if if w.predicted and w.saved_ns >= WORTH_STEP_SHARE * w.step_ns_before > 0]
    if not rows or losses is None or not lost:
        return None, ""
    covered = int(losses.wall.sum())
    best = rows[0]
    top = max(causes, key=lambda k: causes[k])
    if covered < WHATIF_RANK_SHARE * window_ns:
        note = (f"; ranked by lost time: the {losses.n} steps the what-if re-times cover "
                f"{_pct(covered, window_ns):.0f}% of the device's active window (there, without {best.cause} a "
                f"step would take {fmt_ns(best.saved_ns)} less)")
        return None, note
    if best.cause == top:
        return best.cause, ""
    if best.saved_ns < NEGLIGIBLE_STEP_SHARE * best.step_ns_before:
        return None, (f"; ranked by lost time: without {best.cause} a step would take only {fmt_ns(best.saved_ns)} "
                      f"less ({_pct(best.saved_ns, best.step_ns_before):.1f}% of it), too little to decide over "
                      f"{top}, which lost more")
    raw = next((w for w in what_if if w.cause == top), None)
    gives = (f"removing it saves {fmt_ns(raw.saved_ns)} a step ({raw.bound} bound)" if raw is not None
             and raw.predicted else "its what-if gives back nothing in the steps")
    return best.cause, (f"; {top} lost more ({_pct(causes[top], lost):.0f}% of lost time) but {gives}, "
                        f"while without {best.cause} a step takes {fmt_ns(best.saved_ns)} less")


def decide(meta: TimelineMeta, bubbles: BubbleResult, comm: CommResult, eager: EagerResult,
           top_kernels: pd.DataFrame, budget_table: pd.DataFrame, steps_source: str,
           healthy_pct: float = 10.0, *, device: DeviceResult | None = None, coverage: Coverage | None = None,
           steps: StepsResult | None = None, engine_evidence: bool = True,
           losses: StepLosses | None = None, what_if: tuple[WhatIf, ...] = (),
           io: list[IoWork] | None = None, world: World = World.PYTORCH) -> Verdict:
    """``losses``: the steps' per-cause accounting (edges and short gaps of fallback steps from it);
    ``what_if``: its what-if rows, which rank the causes by what fixing each would give; ``io``: what
    the host did inside its data loading (``io_frames.io_work``), named in a ``host_io`` summary;
    ``world``: what ran (``analyses.world``), whose language the advice speaks."""
    window = bubbles.window_ns
    partial = meta.has_warning(WarningCode.PARTIAL_RANKS)
    fb_small = int(losses.small[losses.fallback].sum()) if losses is not None else 0
    # step edges are lost device time only in steps of the device's work (``StepLosses.predictable``)
    edges = {c.value: int(v.sum()) for c, v in losses.edges.items()} \
        if losses is not None and losses.predictable else {}
    graphed = int(losses.graphed.sum()) if losses is not None else 0
    causes = lost_by_cause(bubbles, comm, device, fb_small, partial, edges, graphed)
    scores = {b.value: 0 for b in Bottleneck}
    for c, ns in causes.items():
        scores[Cause(c).bottleneck.value] += ns
    lost = sum(causes.values())
    notes, problems = caveats(meta, bubbles, steps_source, losses)
    adequacy = max(0.4, 0.85 ** problems)
    cap = CAP_THIN if any(meta.has_warning(w) for w in _THIN) else 1.0
    ev = _evidence(bubbles, comm, eager, top_kernels, device, steps, causes, lost)
    best = what_if[0] if what_if else None
    if best is not None and best.predicted and best.step_ns_before > 0 \
            and best.saved_ns >= max(0.01 * best.step_ns_before, 1):
        ev.append(Finding("what_if", f"what if: without {best.cause} the mean step would take "
                          f"{fmt_ns(best.step_ns_after)} instead of {fmt_ns(best.step_ns_before)} "
                          f"({100 * best.saved_ns / best.step_ns_before:.0f}% less; {best.bound} bound)",
                          best.saved_ns, "ns"))

    def verdict(b: str, cause: Cause, conf: float, summary: str, healthy: bool = False,
                lines: tuple[str, str, str] = ("", "", ""), advice: tuple[Advice, ...] | None = None) -> Verdict:
        return Verdict(cast(BottleneckName, b), round(min(max(conf, 0.0), cap, 1.0), 3), summary, tuple(ev),
                       tuple(notes), healthy, scores, cause.value, causes,
                       advice if advice is not None else
                       advice_for(cause, causes, eager, comm, device, window, world, healthy), *lines)

    if window == 0:
        return verdict("kernel", Cause.COMPUTE, 0.2 * adequacy, "no device activity: nothing to diagnose")
    # NOTE: a step holds all of its time: host work of the steps before the device's first activity
    # or after its last (``edges``) is idle device time of the steps as much as a bubble is
    host_edges = sum(edges.values())
    span = window + host_edges
    idle = bubbles.total_ns + bubbles.sub_threshold_ns - graphed + host_edges
    comm_lost = causes.get(Cause.EXPOSED_COMM.value, 0) + causes.get(Cause.STRAGGLER.value, 0)
    copies = causes.get(Cause.MEMCPY.value, 0)
    # NOTE: warm-up steps are judged out, as they are left out of the mean step: a first step that
    # compiles on a busy device would hide the steady steps' idle time
    w_wall, w_busy = losses.warmup_ns() if losses is not None else (0, 0)
    span, idle = span - min(w_wall, span), idle - min(w_wall - w_busy, idle)
    busy = bubbles.busy_ns - min(w_busy, bubbles.busy_ns)
    h = healthy_pct / 100.0 * span
    if idle <= h and comm_lost <= h and copies <= h:
        worst = max(idle, comm_lost, copies)
        conf = (0.7 + 0.3 * (1 - worst / h)) * adequacy if h else 0.7 * adequacy
        summary = f"healthy: device busy {_pct(bubbles.busy_ns, window):.0f}% of its active window"
        if round(_pct(busy, span)) != round(_pct(bubbles.busy_ns, window)):
            summary += f" and {_pct(busy, span):.0f}% of its steps' time"
        if coverage is not None and coverage.capture_ns and coverage.device_active_ns < 0.5 * coverage.capture_ns:
            summary += (f" ({fmt_ns(bubbles.window_ns)}; only {100 * coverage.device_busy_share:.1f}% of the "
                        f"{fmt_ns(coverage.capture_ns)} capture)")
        if device is not None and device.busy_ns:
            summary += (f" (kernels {_pct(device.kernel_ns, device.busy_ns):.0f}%, copies "
                        f"{_pct(device.memcpy_ns, device.busy_ns):.0f}%, collectives "
                        f"{_pct(device.comm_ns, device.busy_ns):.0f}% of busy time)")
        top_name = clip_text(str(top_kernels.iloc[0]["name"]), 60) if len(top_kernels) else ""
        if top_name:
            summary += f"; time goes to kernels (top: {top_name})"
        lines = (f"healthy, device busy {_pct(bubbles.busy_ns, window):.0f}%", "only faster kernels help", "")
        return verdict("kernel", Cause.COMPUTE, conf, summary, True, lines)
    spread = no_dominant(losses, lost)
    if spread is not None:
        text, share, margin, near = spread
        conf = (0.5 + 0.3 * margin) * adequacy
        summary = (f"no dominant bottleneck: {text}; device busy {_pct(bubbles.busy_ns, window):.0f}% of its "
                   "active window")
        lines = ("no dominant bottleneck", f"no single fix gives more than {100 * share:.0f}% of the step",
                 _alternatives(Cause.COMPUTE, causes, lost, what_if, "", 0.0, ""))
        spread_advice = (Advice(Cause.COMPUTE.value, "No single cause dominates the step: " + text + (
            ". None is worth a fix on its own; the what-if table gives what removing each would save."
            if not near else
            ". `srtscope compare CLEAN THIS` against a run known to be clean shows what each cause gained: time "
            "the clean run does not lose is a fault worth fixing; the what-if table gives what removing each "
            "would save.")),)
        return verdict("kernel", Cause.COMPUTE, conf, summary, True, lines, spread_advice)
    worth, why = _worth_fixing(causes, what_if, losses, lost, window)
    if worth is not None:
        cause = Cause(worth)
        top = cause.bottleneck.value
    else:
        top = max(scores, key=lambda k: scores[k])
        in_class = {c: ns for c, ns in causes.items() if Cause(c).bottleneck.value == top}
        cause = Cause(max(in_class, key=lambda k: in_class[k]))
        if what_if and what_if[0].cause == cause.value:
            why = ""                          # the what-if agrees: nothing to explain
    share = _pct(causes.get(cause.value, 0), lost)          # the headline quotes the cause's own share
    una = causes.get(Cause.HOST_UNATTRIBUTED.value, 0)
    evidenced = lost - una
    dominance = scores[top] / lost if lost else 0.0
    conf = dominance * (0.4 + 0.6 * evidenced / lost if lost else 0.4) * adequacy
    bubble_pct = _pct(bubbles.total_ns, window)
    if cause is Cause.HOST_UNATTRIBUTED:
        conf = min(conf, 0.5)
    summary = _summary(cause, share, bubbles, comm, eager, device, causes, lost, bubble_pct, engine_evidence)
    if cause is Cause.HOST_IO and io:
        summary += _io_text(io[0], causes.get(Cause.HOST_IO.value, 0))
    cls_share = _pct(scores[top], lost)
    lines = (f"{share:.0f}% of lost time", _gain(cause, what_if),
             _alternatives(cause, causes, lost, what_if, top if cls_share >= share + CLASS_NOTE_POINTS else "",
                           cls_share, why))
    if len(budget_table) and top in ("scheduler", "prep", "kernel"):
        col = {"scheduler": "scheduler_ns", "prep": "prep_ns", "kernel": "kernel_ns"}[top]
        if col in budget_table:
            ex = budget_table.nlargest(3, col)
            ex = ex[ex[col] > 0]
            if len(ex):
                ev.append(Finding("example_steps", "steps losing most to " + top + ": " +
                                  ", ".join(f"{int(s)} (rank {int(r)})" for s, r in zip(ex["step"], ex["rank"])),
                                  int(ex[col].sum()), "ns"))
    return verdict(top, cause, conf, summary, lines=lines)


#: other causes under this share of lost time are left off the alternatives line (percent)
ALTERNATIVE_MIN_PCT = 5.0


def _gain(cause: Cause, what_if: tuple[WhatIf, ...]) -> str:
    """What fixing ``cause`` gives, from its what-if row: the mean step before and after."""
    w = next((x for x in what_if if x.cause == cause.value), None)
    if w is None or not w.step_ns_before:
        return ""
    if not w.predicted:
        return "fixing it: too little device work in the steps to predict what it gives"
    bound = f"; {w.bound} bound" if w.bound != "none" else ""
    return (f"fixing it: the mean step {fmt_ns(w.step_ns_before)} -> {fmt_ns(w.step_ns_after)} "
            f"({w.speedup:.2f}x, predicted{bound})")


def _alternatives(cause: Cause, causes: dict[str, int], lost: int, what_if: tuple[WhatIf, ...],
                  cls: str, cls_share: float, why: str) -> str:
    """One line: the other causes over ``ALTERNATIVE_MIN_PCT`` of lost time with what fixing each
    saves a step, the class's share when it says more than the cause's, and why the named cause is
    not the one that lost most (``_worth_fixing``)."""
    parts = []
    saves = {w.cause: w for w in what_if if w.predicted}
    others = []
    for c, ns in sorted(causes.items(), key=lambda kv: -kv[1]):
        if c == cause.value or _pct(ns, lost) < ALTERNATIVE_MIN_PCT:
            continue
        w = saves.get(c)
        fix = f", saves {fmt_ns(w.saved_ns)} a step" + (f" ({w.bound} bound)" if w.bound != "none" else "") \
            if w is not None and w.saved_ns else ""
        others.append(f"{c} {_pct(ns, lost):.0f}%{fix}")
    if others:
        parts.append("other causes: " + " · ".join(others[:3]))
    if cls:
        parts.append(f"the {cls} class {cls_share:.0f}% of lost time in all")
    note = why.lstrip("; ")
    if note:
        parts.append(note)
    return "; ".join(parts)


def _io_text(w: IoWork, io_ns: int) -> str:
    """Where the data-loading time went: preprocessing on the host, or loading itself."""
    where = f"; {_pct(w.ns, io_ns):.0f}% of it in {clip_text(w.outer, 60)!r}"
    if w.preprocessing:
        ops = ", ".join(clip_text(n, 30) for n, _ in w.inner[:3])
        return where + (f", {_pct(w.inner_ns, w.ns):.0f}% of that in operators inside it ({ops}): preprocessing "
                        "on the host (more loader workers, or preprocessing on the device)")
    return where


def _summary(cause: Cause, share: float, bubbles: BubbleResult, comm: CommResult, eager: EagerResult,
             device: DeviceResult | None, causes: dict[str, int], lost: int, bubble_pct: float,
             engine_evidence: bool) -> str:
    bc = bubbles.by_class
    stage = next(iter(bubbles.by_stage), None)
    tail = f" (device idle {bubble_pct:.0f}% of the window" + (f"; top stage {stage})" if stage else ")")
    if cause is Cause.SCHED_CPU:
        if bc.get("sync", 0) > bc.get("scheduler", 0):
            return f"host-sync-bound: host blocked on the device during {share:.0f}% of lost time" + tail
        return f"scheduler-bound: host scheduling during {share:.0f}% of lost time" + tail
    if cause is Cause.BATCH_PREP:
        return f"prep-bound: batch preparation during {share:.0f}% of lost time" + tail
    if cause is Cause.EAGER_FALLBACK:
        return (f"eager-fallback-bound: {plural(eager.eager_decode_steps, 'decode step')} ran eagerly while "
                f"{eager.graph_steps} replayed graphs; launching them one kernel at a time costs "
                f"{share:.0f}% of lost time" + tail)
    if cause is Cause.LAUNCH_BOUND:
        if bc.get("kernel", 0) > bc.get("launch", 0) and stage and engine_evidence:
            return f"kernel-bound: host inside the forward/sampling during {share:.0f}% of lost time" + tail
        small = bubbles.sub_threshold_ns
        extra = (f"; {fmt_ns(small)} of it in {bubbles.sub_threshold_count} gaps under the bubble threshold"
                 if small >= 0.25 * causes.get(Cause.LAUNCH_BOUND.value, 1) else "")
        return (f"launch-bound: the device waits while the host runs model code and launches kernels, "
                f"{share:.0f}% of lost time{extra}" + tail)
    if cause is Cause.MEMCPY:
        top = next(iter(device.memcpy.items()), None) if device is not None else None
        what = ""
        if top is not None:
            k, st = top
            what = f"; {k} {fmt_ns(st.ns)}" + (f" at {st.gbps:.1f} GB/s" if st.gbps else "")
        return (f"copy-bound: copies the device could not hide behind kernels, {share:.0f}% of lost time"
                f"{what} (kernels {_pct(device.kernel_ns, device.busy_ns) if device else 0:.0f}% of device busy)")
    if cause in (Cause.EXPOSED_COMM, Cause.STRAGGLER):
        who = (f"; straggler rank {comm.straggler_rank}" if comm.straggler_rank is not None else
               f"; straggler device {comm.straggler_device}" if comm.straggler_device is not None else "")
        return f"communication-bound: exposed/waiting collectives {share:.0f}% of lost time{who}" + tail
    if cause is Cause.HOST_IO:
        return f"host-bound, I/O: the device waits while the host reads, writes or loads data, {share:.0f}% " \
               "of lost time" + tail
    if cause is Cause.HANDOFF:
        return ("host-bound, hand-off: the device waits while the engine's processes hand each step to one "
                f"another (one blocked on the other's answer, neither in a stage), {share:.0f}% of lost time" + tail)
    if cause is Cause.COLD_START:
        return ("host-bound, cold start: allocation, set-up, module loading and first-use calls while the "
                f"device idles, {share:.0f}% of lost time" + tail)
    una = causes.get(Cause.HOST_UNATTRIBUTED.value, 0)
    user = next(iter(bubbles.by_user_range.items()), None)
    hint = (f"; {_pct(user[1], lost):.0f}% of lost time {_inside(user[0])}, which names no stage"
            if user is not None and user[1] >= 0.1 * una
            else "; add NVTX ranges (or record_function) around the host work to name it")
    return (f"host-bound, unannotated: device idle {bubble_pct:.0f}% of the window while the launching "
            f"thread ran code no range, operator or CUDA call explains ({_pct(una, lost):.0f}% of lost "
            f"time){hint}")


def _inside(label: str) -> str:
    """Where unattributed time lay: a range of the trace's own, or a Python function of the program."""
    if label.endswith(PYTHON_LABEL):
        return f"in the Python function {clip_text(label[:-len(PYTHON_LABEL)], 60)!r}"
    return f"inside the trace's own range {clip_text(label, 60)!r}"


def _evidence(bubbles: BubbleResult, comm: CommResult, eager: EagerResult, top_kernels: pd.DataFrame,
              device: DeviceResult | None, steps: StepsResult | None, causes: dict[str, int],
              lost: int) -> list[Finding]:
    window = bubbles.window_ns
    ev = [Finding("device_busy", f"device busy {_pct(bubbles.busy_ns, window):.1f}% of the active window",
                  _pct(bubbles.busy_ns, window), "pct"),
          Finding("bubbles", f"{plural(bubbles.count, 'bubble')} > {bubbles.threshold_ns // 1000} µs, "
                  f"{_pct(bubbles.total_ns, window):.1f}% of the window", bubbles.total_ns, "ns")]
    if device is not None and device.busy_ns:
        ev.append(Finding("device_split", f"device busy time: kernels {fmt_ns(device.kernel_ns)}, copies "
                          f"{fmt_ns(device.memcpy_ns)} ({fmt_ns(device.exposed_memcpy_ns)} not hidden), memset "
                          f"{fmt_ns(device.memset_ns)}, collectives {fmt_ns(device.comm_ns)}",
                          device.busy_ns, "ns"))
    if bubbles.sub_threshold_ns:
        ev.append(Finding("sub_threshold", f"{bubbles.sub_threshold_count} gaps at or under "
                          f"{bubbles.threshold_ns // 1000} µs add {fmt_ns(bubbles.sub_threshold_ns)} of idle time",
                          bubbles.sub_threshold_ns, "ns"))
    for c, ns in sorted(causes.items(), key=lambda kv: -kv[1])[:3]:
        if _pct(ns, lost) >= 1:
            ev.append(Finding(f"cause.{c}", f"{c}: {_pct(ns, lost):.0f}% of lost time", ns, "ns"))
    for cls, ns in sorted(bubbles.by_class.items(), key=lambda kv: -kv[1])[:3]:
        if _pct(ns, bubbles.total_ns) >= 1:
            ev.append(Finding(f"class.{cls}", f"{cls}: {_pct(ns, bubbles.total_ns):.0f}% of bubble time", ns, "ns"))
    for name, ns in list(bubbles.by_stage.items())[:3]:
        ev.append(Finding(f"stage.{name}", f"host in {name} during {_pct(ns, bubbles.total_ns):.0f}% of "
                          "bubble time", ns, "ns"))
    if comm.total_ns:
        ev.append(Finding("comm.exposed", f"communication {comm.total_ns / 1e6:.2f} ms, exposed "
                          f"{comm.exposed_ns / 1e6:.2f} ms", comm.exposed_ns, "ns"))
    if comm.skew_ns:
        who = (f"rank {comm.straggler_rank}" if comm.straggler_rank is not None else
               f"device {comm.straggler_device}" if comm.straggler_device is not None else "no single rank")
        busy = comm.straggler_device_busy
        doing = (f" (its device busy computing {100 * busy:.0f}% of the time before it arrived)"
                 if busy is not None and busy >= 0.5 else
                 f" (host in {comm.straggler_host_stage} before it arrived)" if comm.straggler_host_stage else "")
        ev.append(Finding("comm.skew", f"collective arrival skew {comm.skew_ns / 1e6:.2f} ms; straggler "
                          f"{who}{doing}", comm.skew_ns, "ns"))
    if eager.eager_decode_steps:
        why = ", ".join(f"{n} {r}" for r, n in eager.reasons.items())
        ev.append(Finding("eager_fallback", f"{plural(eager.eager_decode_steps, 'decode step')} ran eagerly while "
                          f"{eager.graph_steps} used graphs (why: {why or 'not recorded'}); extra "
                          f"{eager.extra_ns / 1e6:.2f} ms", eager.extra_ns, "ns"))
    user = next(iter(bubbles.by_user_range.items()), None)
    una = bubbles.by_class.get("unattributed", 0)
    if user is not None and una and user[1] >= 0.1 * una:
        ev.append(Finding("user_range", f"host {_inside(user[0])} (no stage) during {_pct(user[1], lost):.0f}% "
                          "of lost time", user[1], "ns"))
    if len(top_kernels):
        k = top_kernels.iloc[0]
        share = 100 * float(k["share"])
        pct = f"{share:.0f}%" if share >= 10 else f"{share:.1f}%"
        ev.append(Finding("top_kernel", f"top kernel {clip_text(str(k['name']), 80)}: {pct} of "
                          "kernel time", int(k["total_ns"]), "ns"))
    if steps is not None and steps.count:
        per = steps.per_rank
        ev.append(Finding("steps", f"{plural(max(per.values()), 'step')} per rank over "
                          f"{plural(len(per), 'rank')}, from {steps.source}", steps.count, "count"))
    return ev
