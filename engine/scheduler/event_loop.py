"""The scheduler's event loops (a mixin of ``Scheduler``, engine/scheduler/scheduler.py).

One iteration (``run_step``), each inside a ``loop.step`` probe range:

normal:  recv -> schedule t -> prep + forward t -> wait -> results t
overlap: recv -> schedule t+1 -> prep + launch t+1 (worker thread) -> wait t -> results t
         The forward of step t+1 runs while the host processes step t's results; a request that
         finishes at step t was already put into step t+1: its extra token is dropped and its
         extra KV slot freed by ``cache_finished_req``. Before a retraction the in-flight step is
         settled first (outputs must be final before a request is requeued).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from srtscope.engine.forward_batch import ForwardMode
from srtscope.probes.ranges import stage
from srtscope.probes.stages import Stage

if TYPE_CHECKING:
    from srtscope.engine.config import EngineConfig
    from srtscope.engine.schedule_batch import LaunchedStep, ScheduleBatch

_LOOP = Stage.LOOP_STEP.value
_RECV = Stage.SCHED_RECV.value
_SCHED = Stage.SCHED_SCHEDULE.value
_IDLE = ForwardMode.IDLE.label


class EventLoops:
    """``run_step`` / ``run_until_idle`` over the scheduler's own state and methods (declared
    below for the type checker; ``Scheduler`` defines them)."""

    if TYPE_CHECKING:
        config: EngineConfig
        _step: int
        _results_processed: int
        _inflight: LaunchedStep | None
        _tp_sync: Any

        def is_idle(self) -> bool: ...
        def recv_requests(self) -> int: ...
        def get_next_batch_to_run(self) -> ScheduleBatch | None: ...
        def run_batch(self, batch: ScheduleBatch) -> LaunchedStep: ...
        def process_batch_result(self, launched: LaunchedStep) -> None: ...

    # -- the event loops -------------------------------------------------------------------------
    def run_step(self) -> bool:
        """One event-loop iteration (normal or overlap, per config); False when nothing ran (and,
        overlap, nothing was in flight)."""
        return self._step_overlap() if self.config.enable_overlap else self._step_normal()

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Iterate until every submitted request is finished; returns the iterations."""
        steps = 0
        while not self.is_idle():
            if steps >= max_steps:
                raise RuntimeError(f"not idle after {max_steps} steps")
            self.run_step()
            steps += 1
        return steps

    def _step_normal(self) -> bool:
        with stage(_LOOP, step=self._step) as ls:
            batch = self._schedule(ls)
            if batch is None:
                return False
            self.process_batch_result(self.run_batch(batch))
            return True

    def _step_overlap(self) -> bool:
        done_before = self._results_processed
        with stage(_LOOP, step=self._step) as ls:
            batch = self._schedule(ls)            # may settle the in-flight step (retraction)
            launched = self.run_batch(batch) if batch is not None else None
            prev, self._inflight = self._inflight, launched
            if prev is not None:
                self.process_batch_result(prev)
            return launched is not None or self._results_processed != done_before

    def _schedule(self, ls: Any) -> ScheduleBatch | None:
        """``sched.recv`` then ``sched.schedule`` (the batch choice; under TP, the ranks' consensus)."""
        with stage(_RECV) as r:
            r.set(received=self.recv_requests())
        with stage(_SCHED) as sc:
            batch = self.get_next_batch_to_run()
            if self._tp_sync is not None:
                self._tp_sync.check_consensus(self._step, batch)   # divergence: an error, not a hang
            if batch is None:
                sc.set(mode=_IDLE, bs=0)
            else:
                sc.set(mode=batch.forward_mode.label, bs=batch.batch_size())
        if batch is None:
            ls.set(mode=_IDLE, bs=0, tokens=0)
        else:
            ls.set(mode=batch.forward_mode.label, bs=batch.batch_size(), tokens=batch.num_tokens())
        return batch

    def _settle_inflight(self) -> None:
        """Overlap: process the in-flight step's results now (before a retraction)."""
        prev, self._inflight = self._inflight, None
        if prev is not None:
            self.process_batch_result(prev)
