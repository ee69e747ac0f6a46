"""Verdict: scheduler, prep or kernel — with a confidence, the evidence and the capture's caveats.

Lost time is bubble time plus exposed communication (plus, where the collectives are only host
ranges, their arrival skew: the time the others wait; CPU stand-in collectives are exposed whole,
wait included). It is blamed as: scheduler <- scheduler + sync bubbles (a host
loop serialised on device results is the event loop's problem); prep <- prep bubbles; kernel <-
kernel + launch bubbles + communication. Unattributed bubble time is blamed on nobody; it lowers the
confidence, and when it outweighs every bottleneck the verdict is "host-bound, unannotated" under
"scheduler" (the host loop) with a confidence of at most 0.5. A trace whose bubbles and exposed
comm stay under ``healthy_pct`` of the active window is healthy: bottleneck "kernel" (the device
is busy; only faster kernels help).

confidence = dominance of the top bottleneck x (0.4 + 0.6 x attributed share of lost time)
             x capture adequacy (0.85 per adequacy warning, floor 0.4); healthy: 0.7..1 x adequacy.
"""
from __future__ import annotations

import pandas as pd

from srtscope.analyzers.results import BubbleResult, CommResult, EagerResult, Finding, Verdict
from srtscope.analyzers.timeline import TimelineMeta, WarningCode

_ADEQUACY = (WarningCode.NO_NVTX, WarningCode.GRAPH_NOT_PER_NODE, WarningCode.LOW_NVTX_COVERAGE,
             WarningCode.WINDOW_CUT, WarningCode.NO_API, WarningCode.UNKNOWN_SCHEMA, WarningCode.NO_KERNELS)
LOW_COVERAGE = 0.5


def _pct(a: int, b: int) -> float:
    return 100.0 * a / b if b else 0.0


def caveats(meta: TimelineMeta, bubbles: BubbleResult, steps_source: str) -> tuple[list[str], int]:
    """(caveat lines, number of adequacy problems)."""
    out = [f"{w.code.value}: {w.message}" for w in meta.warnings]
    problems = sum(1 for w in meta.warnings if w.code in _ADEQUACY)
    if bubbles.nvtx_coverage is not None and bubbles.total_ns and bubbles.nvtx_coverage < LOW_COVERAGE \
            and not meta.has_warning(WarningCode.LOW_NVTX_COVERAGE):
        out.append(f"low_nvtx_coverage: NVTX ranges cover {100 * bubbles.nvtx_coverage:.0f}% of the "
                   "launching thread's time during bubbles")
        problems += 1
    una = bubbles.by_class.get("unattributed", 0)
    if bubbles.total_ns and una > 0.25 * bubbles.total_ns:
        out.append(f"unattributed: {_pct(una, bubbles.total_ns):.0f}% of bubble time has no stage range "
                   "and no telling CUDA API state on the launching thread")
    if steps_source == "none":
        out.append("no_steps: no engine steps found (no loop.step / scheduler ranges, no API calls)")
    return out, problems


def decide(meta: TimelineMeta, bubbles: BubbleResult, comm: CommResult, eager: EagerResult,
           top_kernels: pd.DataFrame, budget_table: pd.DataFrame, steps_source: str,
           healthy_pct: float = 10.0) -> Verdict:
    bc = bubbles.by_class
    window = bubbles.window_ns
    # NOTE: with host ranges as collectives, waiting for a late rank is host time the ranges don't
    # show as exposed; with CPU stand-ins the exposed time already holds that wait
    comm_lost = comm.exposed_ns + (comm.skew_ns if comm.source == "ranges" else 0)
    scores = {"scheduler": bc.get("scheduler", 0) + bc.get("sync", 0), "prep": bc.get("prep", 0),
              "kernel": bc.get("kernel", 0) + bc.get("launch", 0) + comm_lost}
    lost = bubbles.total_ns + comm_lost
    notes, problems = caveats(meta, bubbles, steps_source)
    adequacy = max(0.4, 0.85 ** problems)
    ev: list[Finding] = [Finding("device_busy", f"device busy {_pct(bubbles.busy_ns, window):.1f}% of the "
                                 "active window", _pct(bubbles.busy_ns, window), "pct"),
                         Finding("bubbles", f"{bubbles.count} bubbles > {bubbles.threshold_ns // 1000} µs, "
                                 f"{_pct(bubbles.total_ns, window):.1f}% of the window", bubbles.total_ns, "ns")]
    for cls, ns in sorted(bc.items(), key=lambda kv: -kv[1])[:3]:
        if ns > 0:
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
        ev.append(Finding("eager_fallback", f"{eager.eager_decode_steps} decode steps ran eagerly while "
                          f"{eager.graph_steps} used graphs ({eager.reasons}); extra "
                          f"{eager.extra_ns / 1e6:.2f} ms", eager.extra_ns, "ns"))
    if len(top_kernels):
        k = top_kernels.iloc[0]
        ev.append(Finding("top_kernel", f"top kernel {str(k['name'])[:80]}: {100 * k['share']:.0f}% of "
                          "device time", int(k["total_ns"]), "ns"))

    bubble_pct = _pct(bubbles.total_ns, window)
    if window == 0:
        return Verdict("kernel", round(0.2 * adequacy, 3), "no device activity: nothing to diagnose",
                       tuple(ev), tuple(notes), False, scores)
    if lost <= healthy_pct / 100.0 * window:
        conf = (0.7 + 0.3 * (1 - lost / (healthy_pct / 100.0 * window))) * adequacy
        summary = f"healthy: device busy {_pct(bubbles.busy_ns, window):.0f}%"
        if len(top_kernels):
            summary += f"; time goes to kernels (top: {str(top_kernels.iloc[0]['name'])[:60]})"
        return Verdict("kernel", round(min(conf, 1.0), 3), summary, tuple(ev), tuple(notes), True, scores)
    blamed = sum(scores.values())
    una = bc.get("unattributed", 0)
    if una >= max(scores.values()):
        top = max(scores, key=lambda k: scores[k])
        nxt = (f"; of the named time, {top} leads with {_pct(scores[top], lost):.0f}%"
               if _pct(scores[top], lost) >= 1 else "")
        conf = 0.5 * (una / lost) * adequacy
        user = next(iter(bubbles.by_user_range.items()), None)
        if user is not None and user[1] >= 0.1 * una:
            ev.append(Finding("user_range", f"host inside its own range {user[0][:60]!r} during "
                              f"{_pct(user[1], bubbles.total_ns):.0f}% of bubble time (names no stage)",
                              user[1], "ns"))
            advice = (f"; {_pct(user[1], bubbles.total_ns):.0f}% of bubble time inside the trace's own "
                      f"range {user[0][:60]!r}, which names no stage")
        else:
            advice = "; add NVTX stage ranges to split scheduler from prep"
        return Verdict("scheduler", round(min(conf, 0.5), 3),
                       f"host-bound, unannotated: device idle {bubble_pct:.0f}% of the window while the "
                       f"launching thread ran code no stage range or CUDA API state explains "
                       f"({_pct(una, lost):.0f}% of lost time){nxt}{advice}",
                       tuple(ev), tuple(notes), False, scores)
    top = max(scores, key=lambda k: scores[k])
    dominance = scores[top] / blamed
    conf = dominance * (0.4 + 0.6 * min(blamed / lost, 1.0)) * adequacy
    share = _pct(scores[top], lost)
    stage = next(iter(bubbles.by_stage), None)
    if top == "scheduler":
        if bc.get("sync", 0) > bc.get("scheduler", 0):
            summary = f"host-sync-bound: host blocked on the device during {share:.0f}% of lost time"
        else:
            summary = f"scheduler-bound: host scheduling during {share:.0f}% of lost time"
    elif top == "prep":
        summary = f"prep-bound: batch preparation during {share:.0f}% of lost time"
    else:
        parts = {"kernel": bc.get("kernel", 0), "launch": bc.get("launch", 0), "comm": comm_lost}
        sub = max(parts, key=lambda k: parts[k])
        if sub == "comm":
            who = (f"; straggler rank {comm.straggler_rank}" if comm.straggler_rank is not None else
                   f"; straggler device {comm.straggler_device}" if comm.straggler_device is not None else "")
            summary = f"communication-bound: exposed/waiting collectives {share:.0f}% of lost time{who}"
        elif sub == "launch":
            summary = f"launch-bound: host launching kernels while the device idles, {share:.0f}% of lost time"
        else:
            summary = f"kernel-bound: host inside the forward/sampling during {share:.0f}% of lost time"
    summary += f" (device idle {bubble_pct:.0f}% of the window"
    summary += f"; top stage {stage})" if stage and top != "kernel" else ")"
    if len(budget_table):
        col = {"scheduler": "scheduler_ns", "prep": "prep_ns", "kernel": "kernel_ns"}[top]
        ex = budget_table.nlargest(3, col)
        ex = ex[ex[col] > 0]
        if len(ex):
            ev.append(Finding("example_steps", "steps losing most to " + top + ": " +
                              ", ".join(f"{int(s)} (rank {int(r)})" for s, r in zip(ex["step"], ex["rank"])),
                              int(ex[col].sum()), "ns"))
    return Verdict(top, round(min(max(conf, 0.0), 1.0), 3), summary, tuple(ev), tuple(notes), False, scores)
