"""No dominant bottleneck: when the steps' lost time names no cause worth a fix on its own.

A clean engine still loses a little to each of its stages every step; that names no bottleneck.
``no_dominant`` says so (the verdict is then healthy, ``kernel`` / ``compute``) when the steps hold
most of the lost time and either the largest cause loses under ``DOMINANT_STEP_SHARE`` of the mean
step and under ``DOMINANT_RATIO`` x the next, or it is the engine's own scheduling, batch
preparation or hand-off between its processes under ``STAGE_STEP_SHARE`` of the typical step
(medians: a loaded host's long steps do not dilute a cost paid every step), lost step after step
(``steady``): an intermittent stall costing ``STALL_STEP_SHARE`` of the step is a fault. A stage
forgiven near its line (``NEAR_MARGIN``) is said to be: one trace cannot tell a steady fault there
from the engine's own cost, a run known to be clean can (``srtscope compare``).
"""
from __future__ import annotations

import numpy as np

from srtscope.analyzers.analyses.losses import WARMUP_FACTOR, StepLosses
from srtscope.analyzers.model.units import fmt_ns
from srtscope.analyzers.model.vocab import Cause

#: no dominant bottleneck: the largest cause loses under this share of the mean step ...
DOMINANT_STEP_SHARE = 0.15
#: ... and under this many times the next cause's loss
DOMINANT_RATIO = 2.0
#: the engine's own stages (scheduling, batch preparation) under this share of the typical step
#: (``typical_share``) are its normal rhythm, whatever the next cause: a clean engine spends that much on
#: them every step. NOTE: measured on this 2-core host, loaded: clean engines 0.12-0.14 (srtscope's own
#: engine, batch preparation, 7 runs), at most 0.03 (SGLang 0.5.23, vLLM 0.32); a steady 15-20 ms fault
#: 0.22 (vLLM, 75 ms steps) to 0.34 (SGLang, 50 ms steps)
STAGE_STEP_SHARE = 0.18
#: ... unless its stalls cost this share of the mean step: a fault (real SGLang on a loaded 2-core host:
#: clean runs' jitter 1-5%, a 60 ms stall every 4th scheduler call 13-17% with steps of 70-130 ms)
STALL_STEP_SHARE = 0.10
#: a stage forgiven within this margin of ``STAGE_STEP_SHARE`` (its typical share over 0.8 of it) is
#: near the line: a steady fault there reads the same (vLLM's 15 ms ``allocate_slots`` stall in steps
#: of 85-110 ms: 17-18.5% of the typical step), so the text says how to tell them apart
NEAR_MARGIN = 0.2
#: an engine's own per-step costs, by cause: what the rule forgives under ``STAGE_STEP_SHARE``
_ENGINE_STAGES = {Cause.SCHED_CPU.value: "scheduling", Cause.BATCH_PREP.value: "batch preparation",
                  Cause.HANDOFF.value: "hand-off between its processes"}


def no_dominant(losses: StepLosses | None, lost: int) -> tuple[str, float, float, bool] | None:
    """(what the step loses, the largest cause's share of the mean step, the margin the rule held by:
    0..1, 1 - the deciding share over its bound, whether an engine's stage was forgiven near its line:
    ``NEAR_MARGIN``) when no cause dominates the step (module doc); None when one does, or with no
    steps to tell (a clean engine still loses a little to each of its stages: that names no
    bottleneck)."""
    if losses is None or not losses.n or not losses.predictable:
        return None
    keep = ~losses.warmup
    step = int(losses.wall[keep].sum()) // max(int(keep.sum()), 1)
    per = sorted(losses.mean_lost().items(), key=lambda kv: -kv[1])
    if not step or not per:
        return None
    # the steps' view judges only where they hold most of the lost time: the kept steps', and the
    # warm-up steps' but for cold-start calls (a cold start is a cause of its own, not the engine's
    # first steps' scheduling or preparation)
    in_steps = sum(int(losses.device_lost(c)[keep if c is Cause.COLD_START else slice(None)].sum())
                   for c in losses.lost)
    if in_steps < 0.5 * lost:
        return None
    top, top_ns = per[0]
    nxt_name, nxt = per[1] if len(per) > 1 else ("", 0)
    share = top_ns / step
    spread = share < DOMINANT_STEP_SHARE and top_ns < DOMINANT_RATIO * nxt
    typical = typical_share(losses.device_lost(Cause(top))[keep], losses.wall[keep])
    stage = top in _ENGINE_STAGES and typical < STAGE_STEP_SHARE \
        and steady(losses.device_lost(Cause(top))[keep], step)
    if not spread and not stage:
        return None
    text = f"the largest cause, {top}, loses {fmt_ns(top_ns)} of the {fmt_ns(step)} mean step ({100 * share:.0f}%)"
    margin = 1 - share / DOMINANT_STEP_SHARE if spread else 1 - typical / STAGE_STEP_SHARE
    near = not spread and margin < NEAR_MARGIN
    if spread:
        text += f", under {DOMINANT_RATIO:g}x the next ({nxt_name} {fmt_ns(nxt)})"
    elif not near:
        text += (f", what the engine's {_ENGINE_STAGES[top]} costs every step ({100 * typical:.0f}% of the "
                 f"median step, under {100 * STAGE_STEP_SHARE:.0f}%)")
    else:
        text += (f", {100 * typical:.0f}% of the median step: under the {100 * STAGE_STEP_SHARE:.0f}% an engine's "
                 f"{_ENGINE_STAGES[top]} may cost every step, but near it, where a steady fault in that stage "
                 "reads the same")
    return text, share, max(0.0, margin), near


def typical_share(per_step: np.ndarray, wall: np.ndarray) -> float:
    """A cause's loss in the typical step, as a share of the typical step: medians of both (a cost paid
    step after step is the typical step's; a loaded host's long steps would shrink a mean's share)."""
    step = float(np.median(wall)) if len(wall) else 0.0
    return float(np.median(per_step)) / step if step else 0.0


def steady(per_step: np.ndarray, mean_step_ns: float) -> bool:
    """Whether a cause's loss comes step after step, as an engine's own stage time does: its stalls —
    steps losing over ``WARMUP_FACTOR`` x its median — cost under ``STALL_STEP_SHARE`` of the mean step
    (their time over that median, per step). An intermittent stall is concentrated in a few steps and
    worth a fix: a fault, not the engine's rhythm, however long the ordinary step (a loaded host's
    steps may outlast the stall); a busy host's jitter costs a few percent."""
    if not int(per_step.sum()) or not len(per_step):
        return True
    base = float(np.median(per_step))
    stall = per_step > WARMUP_FACTOR * base
    excess = float((per_step[stall] - base).sum()) / len(per_step)
    return excess < STALL_STEP_SHARE * mean_step_ns
