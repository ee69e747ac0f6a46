"""Event loops, one iteration per call, each wrapped in a ``loop.step`` probe range.

normal:  recv -> schedule t -> prep + forward t -> wait -> results t
overlap: recv -> schedule t+1 -> prep + launch t+1 (worker thread) -> wait t -> results t
         The forward of step t+1 runs while the host processes step t's results; a request that
         finishes at step t was already put into step t+1: its extra token is dropped and its
         extra KV slot freed by ``cache_finished_req``. Before a retraction the in-flight step is
         settled first (outputs must be final before a request is requeued).
"""
from __future__ import annotations

from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.schedule_batch import ScheduleBatch
from srtscope.engine.scheduler.scheduler import Scheduler
from srtscope.probes.ranges import stage
from srtscope.probes.stages import Stage

_LOOP = Stage.LOOP_STEP.value
_RECV = Stage.SCHED_RECV.value
_SCHED = Stage.SCHED_SCHEDULE.value

_IDLE = ForwardMode.IDLE.label


def _schedule(s: Scheduler, ls) -> ScheduleBatch | None:
    with stage(_RECV) as r:
        r.set(received=s.recv_requests())
    with stage(_SCHED) as sc:
        batch = s.get_next_batch_to_run()
        if s.tp_sync is not None:
            s.tp_sync.check_consensus(s.step, batch)   # divergence: an error, not a hang
        if batch is None:
            sc.set(mode=_IDLE, bs=0)
        else:
            sc.set(mode=batch.forward_mode.label, bs=batch.batch_size())
    if batch is None:
        ls.set(mode=_IDLE, bs=0, tokens=0)
    else:
        ls.set(mode=batch.forward_mode.label, bs=batch.batch_size(), tokens=batch.num_tokens())
    return batch


def step_normal(s: Scheduler) -> bool:
    """One normal-loop iteration; returns False when there was nothing to run."""
    with stage(_LOOP, step=s.step) as ls:
        batch = _schedule(s, ls)
        if batch is None:
            return False
        launched = s.launch_batch(batch)
        s.process_batch_result(launched)
        s.step += 1
        s.stats.steps += 1
        return True


def step_overlap(s: Scheduler) -> bool:
    """One overlap-loop iteration; returns False when nothing ran and nothing was in flight."""
    if s._drain_hook is None:
        s._drain_hook = lambda: _drain(s)
    with stage(_LOOP, step=s.step) as ls:
        batch = _schedule(s, ls)
        launched = s.launch_batch(batch) if batch is not None else None
        if launched is not None:
            s.step += 1
            s.stats.steps += 1
        had_prev = _drain(s)
        s.inflight = launched
        return launched is not None or had_prev


def _drain(s: Scheduler) -> bool:
    prev, s.inflight = s.inflight, None
    if prev is None:
        return False
    s.process_batch_result(prev)
    return True


def run_step(s: Scheduler) -> bool:
    return step_overlap(s) if s.config.enable_overlap else step_normal(s)
