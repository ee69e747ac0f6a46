"""Scheduler: the waiting queue, the running batch, the chunked request, the choice of the next
batch (``get_next_batch_to_run``) and the event loops that run it (as in SGLang / mini-sglang; the
loops, ``run_step`` / ``run_until_idle``, in scheduler/event_loop.py, a mixin of ``Scheduler``).

The batch choice, in the seed's order:

1. merge the last step's finished prefill into the running batch;
2. a new prefill batch (the chunked request's next chunk first, then admissions) if any — with
   ``enable_mixed_chunk``, the running decode requests ride along in it (a MIXED batch: each
   feeds one token and samples one, the prefill part shrinks by as many tokens);
3. otherwise decode the running batch (retracting requests when KV runs short);
4. otherwise idle (None).

Result processing (``process_batch_result``) appends tokens, runs stop checks, caches finished
requests' KV and frees their rows; finished requests wait in ``take_finished()`` for the caller (and
go to the ``on_finish`` given at construction, if any). The scheduler calls nothing of its caller:
its collaborators (worker, ``tp_sync``, ``on_finish``) are fixed at construction and its state is
written only by its own methods.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from srtscope.engine.config import EngineConfig
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.chunk_cache import ChunkCache
from srtscope.engine.mem.radix_cache import RadixCache
from srtscope.engine.mem.req_to_token import ReqToTokenPool
from srtscope.engine.request import Req, SamplingParams, validate_prompt
from srtscope.engine.schedule_batch import LaunchedStep, ScheduleBatch
from srtscope.engine.scheduler.event_loop import EventLoops
from srtscope.engine.scheduler.policy import InBatchPrefixFilter, sort_waiting
from srtscope.engine.scheduler.prefill_adder import CLIP_MAX_NEW_TOKENS, AddResult, PrefillAdder
from srtscope.engine.scheduler.worker_client import Pending, WorkerClient
from srtscope.probes.ranges import stage
from srtscope.probes.stages import Stage

_PREP = Stage.PREP_BATCH.value
_RESULT = Stage.SCHED_RESULT.value

RETRACT_DECODE_STEPS = 4   # after a retraction, keep room for this many decode steps


def spin_us(us: int) -> None:
    """Busy-wait ``us`` microseconds (sleeping first for long waits, 2 ms short of the end, so a
    late wake-up on a loaded machine rarely overshoots) — fault injection."""
    if us <= 0:
        return
    end = time.perf_counter_ns() + us * 1000
    if us > 3000:
        time.sleep((us - 2000) / 1e6)
    while time.perf_counter_ns() < end:
        pass


@dataclass
class SchedulerStats:
    prompt_tokens: int = 0        # prompt (fill) tokens at each admission
    cached_tokens: int = 0        # of which served from the prefix cache
    prefill_tokens: int = 0       # tokens actually prefilled (extend tokens)
    decode_tokens: int = 0        # tokens fed by decode steps
    generated_tokens: int = 0     # tokens appended to requests
    retractions: int = 0
    steps: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def eos_token_ids_of(worker: Any, config: EngineConfig) -> tuple[int, ...]:
    """The EOS ids requests stop at: the loaded checkpoint's, else the tokenizer's."""
    mc = getattr(worker, "model_config", config.model)
    tok_eos = getattr(getattr(worker, "tokenizer", None), "eos_token_id", None)
    return tuple(mc.eos_token_ids) or (() if tok_eos is None else (int(tok_eos),))


class Scheduler(EventLoops):
    """``on_finish(req)``: called as each request finishes (optional). ``tp_sync``: a TP rank's
    control plane (``engine.distributed.sync.TpSync``; None with one rank)."""

    def __init__(self, config: EngineConfig, worker: Any, req_pool_size: int | None = None, *,
                 on_finish: Callable[[Req], None] | None = None, tp_sync: Any = None) -> None:
        self.config = config
        self.worker = worker
        self.device = worker.device
        self.tokenizer = getattr(worker, "tokenizer", None)
        # the loaded checkpoint's architecture (config.model may be overridden by its config.json)
        self.model_config = getattr(worker, "model_config", config.model)
        self.eos_token_ids: tuple[int, ...] = eos_token_ids_of(worker, config)
        rows = req_pool_size if req_pool_size is not None else config.max_running_requests + 1
        self.req_to_token = ReqToTokenPool(rows, config.context_length, self.device)
        self.allocator = TokenSlotAllocator(config.max_total_tokens)
        cache_cls = ChunkCache if config.disable_radix_cache else RadixCache
        self.tree_cache = cache_cls(self.allocator, self.req_to_token)
        self.client = WorkerClient(worker, self.req_to_token, config.enable_overlap,
                                   future_size=8 * (rows + 1))
        self.waiting_queue: list[Req] = []
        self.running_batch = ScheduleBatch([], ForwardMode.DECODE)
        self.last_batch: ScheduleBatch | None = None
        self.chunked_req: Req | None = None
        self._inflight: LaunchedStep | None = None    # overlap: launched, result not processed
        self.new_token_ratio = config.init_new_token_ratio
        self._step = 0
        self._results_processed = 0
        self.stats = SchedulerStats()
        self.finished: list[Req] = []                 # drained by take_finished()
        self._on_finish = on_finish
        self._order = itertools.count()
        self._aborts: list[Req] = []
        self._live: dict[str, Req] = {}
        self._inbox: list[Req] = []
        self._inbox_rids: set[str] = set()
        self._tp_sync = tp_sync

    @property
    def step(self) -> int:
        """The number of the next step to launch (steps launched so far)."""
        return self._step

    @property
    def tp_sync(self) -> Any:
        return self._tp_sync

    # -- intake --------------------------------------------------------------------------------
    def make_req(self, input_ids: list[int], params: SamplingParams | Mapping[str, Any] | None = None,
                 rid: str = "") -> Req:
        """Validate and build a request (``ValueError`` naming the field; nothing is queued)."""
        sp = SamplingParams.from_any(params)
        cfg = self.config
        ids = validate_prompt(input_ids, cfg.context_length, cfg.max_total_tokens,
                              self.model_config.vocab_size)
        room = min(cfg.context_length, cfg.max_total_tokens) - len(ids)
        if rid:
            self._check_rid(rid)
        return Req(ids, sp, rid=rid, eos_token_ids=self.eos_token_ids,
                   max_new_tokens=min(sp.max_new_tokens, room))

    def _check_rid(self, rid: str) -> None:
        if rid in self._live or rid in self._inbox_rids:
            raise ValueError(f"rid: duplicate request id {rid!r} (still queued or running)")

    def submit(self, req: Req) -> Req:
        """Hand a request to the scheduler; it joins the waiting queue at the next ``sched.recv``."""
        self._check_rid(req.rid)
        req.arrival_ns = req.arrival_ns or time.perf_counter_ns()
        self._inbox.append(req)
        self._inbox_rids.add(req.rid)
        return req

    def recv_requests(self) -> int:
        """Move submitted requests into the waiting queue; returns how many. Under TP, rank 0's
        new requests and aborts are broadcast to every rank here (followers submit nothing)."""
        if self._tp_sync is not None:
            return self._recv_tp()
        if not self._inbox:
            return 0
        inbox, self._inbox = self._inbox, []
        self._inbox_rids.clear()
        for req in inbox:
            self.add_request(req)
        return len(inbox)

    def _recv_tp(self) -> int:
        inbox, self._inbox = self._inbox, []
        self._inbox_rids.clear()
        aborts = [r.rid for r in self._aborts]
        reqs, abort_rids = self._tp_sync.exchange(inbox, aborts)
        for req in reqs:
            self.add_request(req)
        if not self._tp_sync.is_leader:
            for rid in abort_rids:
                self.abort(rid)
        return len(reqs)

    def add_request(self, req: Req) -> Req:
        req.order = next(self._order)
        req.arrival_ns = req.arrival_ns or time.perf_counter_ns()
        self._live[req.rid] = req
        self.waiting_queue.append(req)
        return req

    def abort(self, rid: str) -> bool:
        """Abort a live request (takes effect at the next scheduling); False if unknown."""
        req = self._live.get(rid) or next((r for r in self._inbox if r.rid == rid), None)
        if req is None or req.finished:
            return False
        req.to_abort = True
        self._aborts.append(req)
        return True

    # -- state queries ---------------------------------------------------------------------------
    def is_idle(self) -> bool:
        last = self.last_batch
        return (not self.waiting_queue and not self._inbox and self.running_batch.is_empty()
                and self.chunked_req is None and self._inflight is None
                and (last is None or all(r.finished for r in last.reqs)))

    def num_live(self) -> int:
        return len(self._live)

    def take_finished(self) -> list[Req]:
        """The requests finished since the last call, in finishing order (the list is emptied)."""
        done, self.finished = self.finished, []
        return done

    # -- the batch choice ------------------------------------------------------------------------
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        spin_us(self.config.inject.sched_us)
        self._process_aborts()
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend_like:
            last.filter(lambda r: not r.finished and r is not last.chunked_req)
            last.chunked_req = None
            if not last.is_empty():
                self.running_batch.merge(last)
        self.last_batch = None
        batch = self.get_new_batch_prefill()
        if batch is None:
            self.running_batch.filter(lambda r: not r.finished)
            if not self.running_batch.is_empty():
                batch = self.update_running_batch(self.running_batch)
        self.last_batch = batch
        return batch

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        cfg = self.config
        chunked = self.chunked_req
        if not self.waiting_queue and chunked is None:
            return None
        running = [r for r in self.running_batch.reqs if not r.finished]
        if chunked is None and (len(running) >= cfg.max_running_requests
                                or self.req_to_token.available_size() == 0):
            return None        # running batch full / no free request rows
        mix = self._mix_tokens(len(running))
        adder = PrefillAdder(self.tree_cache, self.allocator, running, self.new_token_ratio,
                             cfg.max_prefill_tokens, cfg.chunked_prefill_size,
                             mixed_decode_tokens=mix)
        if chunked is not None:
            self.tree_cache.cache_unfinished_req(chunked)
            room = self.allocator.available_size() + self.tree_cache.evictable_size() - mix
            if room > 0:              # mixed: leave a slot for each decode row riding along
                adder.add_chunked_req(chunked, room)
        self.chunked_req = None
        if self.waiting_queue and adder.new_chunked_req is None:
            applied = sort_waiting(cfg.schedule_policy, self.waiting_queue, self.tree_cache)
            in_batch = InBatchPrefixFilter(self.tree_cache) if applied == "lpm" else None
            rows = self.req_to_token.available_size()
            for req in self.waiting_queue:
                if len(running) + len(adder.can_run) >= cfg.max_running_requests:
                    break
                if rows <= 0:
                    break
                if in_batch is not None and in_batch.should_defer(req):
                    continue
                res = adder.add_one_req(req)
                if res is AddResult.NO_TOKEN:
                    break
                if req in adder.can_run:
                    rows -= 1
                    self.stats.prompt_tokens += req.seq_len
                if res is AddResult.OTHER:
                    break
            admitted = {id(r) for r in adder.can_run}
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        self.stats.cached_tokens += adder.cached_tokens
        if not adder.can_run:
            self.chunked_req = chunked if (chunked is not None and not chunked.finished) else None
            return None
        self.chunked_req = adder.new_chunked_req
        batch = ScheduleBatch(adder.can_run, ForwardMode.EXTEND, chunked_req=adder.new_chunked_req)
        batch.prepare_for_extend(self.allocator, self.req_to_token, self.tree_cache)
        self.stats.prefill_tokens += sum(batch.extend_lens)
        for r in batch.reqs:
            r.is_chunked = int(r is batch.chunked_req)
        if mix and self._decode_fits(len(running)):
            self._mix_running(batch, running)
        return batch

    def _mix_tokens(self, running_bs: int) -> int:
        """Decode tokens to ride along with the next prefill (0: no mixing). Mixing is skipped
        when the decode rows alone would use up the prefill or chunk budget."""
        cfg = self.config
        if not cfg.enable_mixed_chunk or running_bs == 0:
            return 0
        if running_bs >= min(cfg.max_prefill_tokens, cfg.chunked_prefill_size):
            return 0
        return running_bs

    def _mix_running(self, batch: ScheduleBatch, running: list[Req]) -> None:
        """Move the running decode requests into ``batch`` (MIXED); the running batch empties
        and gets them back, with the finished prefills, when the mixed batch is merged."""
        batch.mix_with_running(running, self.allocator, self.req_to_token, self.tree_cache)
        self.running_batch = ScheduleBatch([], ForwardMode.DECODE)
        self.stats.decode_tokens += len(running)
        self.new_token_ratio = max(self.new_token_ratio - self.config.new_token_ratio_decay,
                                   self.config.min_new_token_ratio)

    def update_running_batch(self, batch: ScheduleBatch) -> ScheduleBatch | None:
        """Make room for one decode step (retracting if needed), then allocate its slots."""
        if not self._decode_fits(batch.batch_size()):
            if self._inflight is not None:
                self._settle_inflight()            # overlap: settle outputs before retracting
                batch.filter(lambda r: not r.finished)
                if batch.is_empty():
                    return None
            if not self._decode_fits(batch.batch_size()):
                self.retract_decode(batch)
            if not self._decode_fits(batch.batch_size()) and self.chunked_req is not None:
                self._retract_chunked()          # the half-prefilled request yields its slots
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.config.new_token_ratio_decay,
                                       self.config.min_new_token_ratio)
        batch.prepare_for_decode(self.allocator, self.req_to_token, self.tree_cache)
        self.stats.decode_tokens += batch.batch_size()
        return batch

    def _decode_fits(self, bs: int, steps: int = 1) -> bool:
        return self.allocator.available_size() + self.tree_cache.evictable_size() >= bs * steps

    def retract_decode(self, batch: ScheduleBatch) -> list[Req]:
        """Requeue requests, fewest outputs first (ties: longest prompt), until the rest fit."""
        order = sorted(batch.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)),
                       reverse=True)
        retracted: list[Req] = []
        while len(order) > 1 and not self._decode_fits(
                len(order), min(RETRACT_DECODE_STEPS, max(r.remaining_new_tokens() for r in order))):
            req = order.pop()
            self.tree_cache.cache_finished_req(req)
            req.reset_for_retract()
            retracted.append(req)
        if retracted:
            gone = {id(r) for r in retracted}
            batch.filter(lambda r: id(r) not in gone)
            self.waiting_queue.extend(retracted)
            self.stats.retractions += len(retracted)
            total_decoded = sum(len(r.output_ids) for r in batch.reqs)
            total_max = sum(min(r.max_new_tokens, CLIP_MAX_NEW_TOKENS) for r in batch.reqs)
            ratio = (total_decoded + RETRACT_DECODE_STEPS * len(batch.reqs)) / max(total_max, 1)
            self.new_token_ratio = min(1.0, max(ratio, self.new_token_ratio))
        return retracted

    def _retract_chunked(self) -> None:
        req, self.chunked_req = self.chunked_req, None
        assert req is not None                          # called with a chunked request only
        self.tree_cache.cache_finished_req(req)
        req.reset_for_retract()
        self.waiting_queue.insert(0, req)
        self.stats.retractions += 1

    def _process_aborts(self) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.finished:
                continue
            req.abort()
            if req in self.waiting_queue:
                self.waiting_queue.remove(req)
            if req is self.chunked_req:
                self.chunked_req = None
            self.tree_cache.cache_finished_req(req)
            self._finish(req)

    # -- prep, launch, results -------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch) -> LaunchedStep:
        """Lower the batch to a ForwardBatch (``prep.batch``) and hand it to the worker (which runs
        it now, or on its thread in the overlap loop); the step counter moves on."""
        with stage(_PREP, mode=batch.forward_mode.label, bs=batch.batch_size(), step=self._step):
            spin_us(self.config.inject.prep_us)
            fb, writes, placeholders = batch.to_forward_batch(self.req_to_token, self.client.device,
                                                              self._step)
            rows = fb.sample_rows or []
            base = self.client.reserve_future(len(rows)) if self.client.overlap else 0
            if self.client.overlap:
                for j, i in enumerate(rows):
                    batch.reqs[i].future_idx = base + j
        launched = LaunchedStep(self._step, batch.forward_mode, tuple(batch.reqs), tuple(rows),
                                base, num_tokens=fb.num_tokens,
                                num_decode_rows=batch.num_decode_rows)
        launched.handle = self.client.launch(Pending(fb, writes, placeholders, base, len(rows)))
        self._step += 1
        self.stats.steps += 1
        return launched

    def process_batch_result(self, launched: LaunchedStep) -> None:
        """Tokens -> requests; stop checks; finished requests' KV cached and rows freed.

        Token layout (``GenerationBatchResult``): one token per batch row, row i = ``reqs[i]``;
        only the rows in ``sample_rows`` are used (a chunk's row carries an unused token)."""
        tokens = self.client.wait_tokens(launched.handle)
        if len(tokens) != len(launched.reqs):
            raise RuntimeError(f"next_token_ids: {len(tokens)} tokens for a batch of "
                               f"{len(launched.reqs)} rows (one per row expected)")
        self._results_processed += 1
        with stage(_RESULT, mode=launched.mode.label, bs=len(launched.reqs), step=launched.step) as r:
            spin_us(self.config.inject.result_us)
            now = time.perf_counter_ns()
            detok = self.tokenizer
            n_finished = 0
            # rows whose prompt was (re)filled this step: share it in the cache right away
            fill_rows = (len(launched.reqs) - launched.num_decode_rows
                         if launched.mode.is_extend_like and self.tree_cache.enabled else 0)
            for j, i in enumerate(launched.sample_rows):
                req = launched.reqs[i]
                if req.future_idx == launched.future_base + j:
                    req.future_idx = -1
                if req.finished:
                    continue       # one step late (overlap) or aborted: the token is dropped
                req.is_chunked = 0
                self.stats.generated_tokens += 1
                if req.append_token(tokens[i], detok, now):
                    self.tree_cache.cache_finished_req(req)
                    self._finish(req)
                    n_finished += 1
                elif i < fill_rows:
                    self.tree_cache.cache_unfinished_req(req)
            r.set(finished=n_finished)

    def _finish(self, req: Req) -> None:
        req.finish_ns = time.perf_counter_ns()
        self._live.pop(req.rid, None)
        self.finished.append(req)
        if self._on_finish is not None:
            self._on_finish(req)

    # -- invariants ------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """At idle: free + evictable == total slots (as sets), nothing locked, all rows free."""
        if not self.is_idle():
            raise AssertionError("check_invariants: the scheduler is not idle")
        locked = self.tree_cache.locked_nodes()
        if locked or self.tree_cache.protected_size():
            raise AssertionError(f"locked cache nodes at idle: {locked[:5]}")
        self.req_to_token.check_all_free()
        free, evictable = self.allocator.available_size(), self.tree_cache.evictable_size()
        if free + evictable != self.allocator.size:
            raise AssertionError(f"free {free} + evictable {evictable} != total "
                                 f"{self.allocator.size}")
        self.allocator.check(in_use=self.tree_cache.all_values())

    def close(self) -> None:
        self.client.close()
