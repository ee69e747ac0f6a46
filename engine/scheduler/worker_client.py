"""The scheduler's handle on the model worker: synchronous (normal loop) or on a worker thread
(overlap loop).

Everything a forward needs from shared state is applied in *stream order*, right before that
forward, on the thread that runs it: the pending req-to-token writes, and the resolution of
future-token placeholders (``input_ids < 0``: ``-(k+1)`` is the token that future slot k receives
from an earlier, possibly still running, forward). The scheduler thread therefore never rewrites
anything a running forward reads; it only blocks (``sync.wait``) when it needs a step's tokens.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.forward_batch import ForwardBatch
from engine.mem.req_to_token import ReqToTokenPool
from probes.ranges import stage
from probes.stages import Stage

_PREP = Stage.PREP_BATCH.value
_SYNC = Stage.SYNC_WAIT.value


@dataclass
class Pending:
    """One launched forward. ``result`` is the worker's GenerationBatchResult once ``done``."""

    fb: ForwardBatch
    writes: tuple | None
    placeholders: bool
    future_base: int
    num_sampled: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class WorkerClient:
    def __init__(self, worker: Any, pool: ReqToTokenPool, overlap: bool, future_size: int) -> None:
        self.worker = worker
        self.pool = pool
        self.overlap = overlap
        self.device = torch.device(worker.device)
        self.future_size = future_size
        self.future_buf = torch.zeros(future_size, dtype=torch.int64, device=self.device)
        self._next_future = 0
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if overlap:
            self._thread = threading.Thread(target=self._loop, name="srtscope-forward", daemon=True)
            self._thread.start()

    def reserve_future(self, n: int) -> int:
        """Base index of n consecutive future slots (a ring; sized for two steps in flight)."""
        if n > self.future_size // 4:
            raise ValueError(f"future ring too small for {n} rows")
        if self._next_future + n > self.future_size:
            self._next_future = 0
        base = self._next_future
        self._next_future += n
        return base

    def launch(self, pending: Pending) -> Pending:
        if self._thread is None:
            self._execute(pending)
        else:
            self._queue.put(pending)
        return pending

    def wait_tokens(self, pending: Pending) -> list[int]:
        """Block until the forward is done and return its sampled ids on the host."""
        with stage(_SYNC, what="next_token_ids"):
            if self._thread is not None:
                pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return pending.result.next_token_ids.tolist()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # -- the forward side ------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)    # the CUDA current device is per host thread
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            self._execute(pending)

    def _execute(self, p: Pending) -> None:
        try:
            fb = p.fb
            if p.writes is not None or p.placeholders:
                with stage(_PREP, part="req_to_token", step=fb.step):
                    self.pool.write_device(p.writes)
                    if p.placeholders:
                        ids = fb.input_ids
                        fb.input_ids = torch.where(ids < 0, self.future_buf[(-ids - 1).clamp(min=0)],
                                                   ids)
            result = self.worker.forward_batch_generation(fb)
            if self.overlap and p.num_sampled:
                ids = result.next_token_ids
                if ids.shape[0] != p.num_sampled:
                    ids = ids[torch.as_tensor(fb.sample_rows, device=ids.device)]
                self.future_buf[p.future_base:p.future_base + p.num_sampled] = ids
            p.result = result
        except BaseException as exc:  # surfaced to the scheduler thread in wait_tokens
            p.error = exc
        finally:
            p.done.set()
