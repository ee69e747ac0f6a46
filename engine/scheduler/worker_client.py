"""The scheduler's handle on the model worker: synchronous (normal loop) or on a worker thread
(overlap loop).

Everything a forward needs from shared state is applied in *stream order*, right before that
forward, on the thread that runs it: the pending req-to-token writes, and the resolution of
future-token placeholders (``input_ids < 0``: ``-(k+1)`` is the token that future slot k receives
from an earlier, possibly still running, forward). The scheduler thread therefore never rewrites
anything a running forward reads; it only blocks (``sync.wait``) when it needs a step's tokens.

On CUDA the overlap loop is *staged* (``engine/scheduler/stream_staging.py``): the scheduler lowers
each batch to host tensors; the worker thread packs them into a pinned arena of a slot ring, copies
them with one H2D on a copy stream (after waiting on the event of the forward that last read that
slot), and runs the forward on a dedicated forward stream (after waiting on the copy's event). The
sampled ids go to pinned host memory with ``non_blocking=True`` and an event the scheduler
synchronizes inside ``sync.wait``. On the CPU nothing of this exists: behaviour is unchanged.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from srtscope.engine.forward_batch import ForwardBatch
from srtscope.engine.mem.req_to_token import ReqToTokenPool
from srtscope.engine.scheduler.stream_staging import CudaStreams, TensorStager, host_tensors
from srtscope.probes.ranges import stage
from srtscope.probes.stages import Stage

_PREP = Stage.PREP_BATCH.value
_SYNC = Stage.SYNC_WAIT.value


@dataclass
class Pending:
    """One launched forward. ``result`` is the worker's ``GenerationBatchResult`` once ``done``
    (one token per batch row; ``num_sampled`` of them, the rows in ``fb.sample_rows``, are used)."""

    fb: ForwardBatch
    writes: tuple | None
    placeholders: bool
    future_base: int
    num_sampled: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    host_ids: torch.Tensor | None = None   # staged path: pinned copy of the sampled ids
    ids_ready: Any = None                  # staged path: event after that D2H copy


class WorkerClient:
    """``streams``: the staged path's stream object (``CudaStreams`` by default on CUDA with
    overlap; tests pass a CPU stand-in to run the staged path without a GPU)."""

    def __init__(self, worker: Any, pool: ReqToTokenPool, overlap: bool, future_size: int,
                 streams: Any = None) -> None:
        self.worker = worker
        self.pool = pool
        self.overlap = overlap
        self.worker_device = torch.device(worker.device)
        self.staged = overlap and (streams is not None or self.worker_device.type == "cuda")
        # NOTE: ``device`` is where the scheduler builds each ForwardBatch. On the staged path
        # that is the host: all H2D copies are issued here, in stream order, on the copy stream.
        self.device = torch.device("cpu") if self.staged else self.worker_device
        self.future_size = future_size
        self.future_buf = torch.zeros(future_size, dtype=torch.int64, device=self.worker_device)
        self.streams: Any = None
        self.stager: TensorStager | None = None
        if self.staged:
            if streams is None:
                # weights, KV pool, req-to-token table, graphs and future_buf were initialised on
                # the default stream; the forward and copy streams start after all of it
                torch.cuda.synchronize(self.worker_device)
                streams = CudaStreams(self.worker_device)
            self.streams = streams
            self.stager = TensorStager(streams.ring, streams.copy)
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
            if pending.ids_ready is not None:
                pending.ids_ready.synchronize()
                assert pending.host_ids is not None      # set with ids_ready
                return pending.host_ids.tolist()
            return pending.result.next_token_ids.tolist()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        if self.streams is not None:
            self.streams.synchronize()   # no copy or forward still reads the arenas

    # -- the forward side ------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.worker_device.type == "cuda":
            torch.cuda.set_device(self.worker_device)   # the current device is per host thread
        if self.streams is not None:
            # NOTE: the current stream is per host thread too: every kernel this thread launches
            # (req-to-token writes, placeholders, forward, graph replay, sampling) goes here.
            with self.streams.forward_ctx():
                self._serve()
        else:
            self._serve()

    def _serve(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            self._execute(pending)

    def _stage(self, p: Pending) -> tuple[ForwardBatch, tuple | None, Any]:
        """Host inputs -> a ring slot's device arena (copy stream); the forward stream waits."""
        with stage(_PREP, part="h2d", step=p.fb.step):
            tensors, rebuild = host_tensors(p.fb, p.writes)
            assert self.stager is not None          # _stage: the staged path only
            slot, views = self.stager.stage(tensors)
            fb, writes = rebuild(views)
            self.streams.forward_wait(slot.copied)   # read-after-write
        return fb, writes, slot

    def _execute(self, p: Pending) -> None:
        slot = None
        try:
            fb, writes = p.fb, p.writes
            if self.staged:
                fb, writes, slot = self._stage(p)
            if writes is not None or p.placeholders:
                with stage(_PREP, part="req_to_token", step=fb.step):
                    self.pool.write_device(writes)
                    if p.placeholders:
                        ids = fb.input_ids
                        fb.input_ids = torch.where(ids < 0, self.future_buf[(-ids - 1).clamp(min=0)],
                                                   ids)
            result = self.worker.forward_batch_generation(fb)
            if self.overlap and p.num_sampled:
                ids = result.next_token_ids               # one per batch row
                if p.num_sampled != fb.batch_size:        # future slots hold the sampled rows only
                    ids = ids[torch.as_tensor(fb.sample_rows, device=ids.device)]
                self.future_buf[p.future_base:p.future_base + p.num_sampled] = ids
            if slot is not None:
                self._finish_staged(p, slot, result)
                slot = None
            p.result = result
        except BaseException as exc:  # surfaced to the scheduler thread in wait_tokens
            p.error = exc
            if slot is not None and self.stager is not None:
                self.streams.synchronize()   # nothing reads the slot any more
                self.stager.ring.abandon(slot)
        finally:
            p.done.set()

    def _finish_staged(self, p: Pending, slot: Any, result: Any) -> None:
        """Record the slot's ``consumed`` event and start the D2H copy of the sampled ids."""
        # after every kernel that read the slot's device arena (forward, sampling, future_buf)
        assert self.stager is not None
        self.stager.ring.mark_consumed(slot, self.streams.record())
        p.host_ids, p.ids_ready = self.streams.to_host(result.next_token_ids)
