"""ScheduleBatch: one scheduling decision on the CPU — which requests run this step, in which mode,
with which KV slots — and its lowering to a ForwardBatch (one step's device tensors).

Slot bookkeeping happens here (``prepare_for_extend`` / ``prepare_for_decode`` /
``mix_with_running``), called from ``get_next_batch_to_run`` as in SGLang: each runs in its own
``prep.batch part=alloc`` range nested in ``sched.schedule`` (the innermost stage decides, so slot
allocation is prep). ``to_forward_batch`` (inside the scheduler's ``prep.batch``) only builds
tensors and copies them to the device. A ScheduleBatch may be mutated after launch (the running batch is filtered and
merged); what the result processing needs is frozen in a ``LaunchedStep``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from srtscope.engine.forward_batch import ForwardBatch, ForwardMode, SamplingBatchInfo
from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.req_to_token import ReqToTokenPool
from srtscope.engine.request import Req
from srtscope.probes.ranges import stage
from srtscope.probes.stages import Stage

_PREP = Stage.PREP_BATCH.value


class OutOfSlotsError(RuntimeError):
    """The allocator could not provide slots even after eviction (admission should prevent it)."""


def alloc_slots(allocator: TokenSlotAllocator, tree_cache, n: int) -> np.ndarray:
    """n slots, evicting unlocked cache leaves when the free list is short."""
    short = n - allocator.available_size()
    if short > 0:
        tree_cache.evict(short)
    out = allocator.alloc(n)
    if out is None:
        raise OutOfSlotsError(f"need {n} KV slots, {allocator.available_size()} free after eviction")
    return out


@dataclass
class LaunchedStep:
    """What result processing needs from a launched batch, frozen at launch."""

    step: int
    mode: ForwardMode
    reqs: tuple[Req, ...]
    sample_rows: tuple[int, ...]       # rows of reqs that receive a token
    future_base: int                   # overlap: future slot of sample row j is future_base + j
    handle: Any = None                 # the worker client's pending result
    num_tokens: int = 0
    num_decode_rows: int = 0           # mixed: the last rows are decode requests riding along


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    chunked_req: Req | None = None     # its prompt is still incomplete after this step
    out_cache_loc: np.ndarray | None = None
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    num_decode_rows: int = 0           # mixed: the last rows are decode requests (extend by 1)
    _sampling: SamplingBatchInfo | None = None
    _sampling_key: tuple = ()

    # -- shape ---------------------------------------------------------------------------------
    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def num_tokens(self) -> int:
        if self.forward_mode == ForwardMode.DECODE:
            return len(self.reqs)
        return sum(self.extend_lens)

    def sample_rows(self) -> list[int]:
        return [i for i, r in enumerate(self.reqs) if r is not self.chunked_req]

    # -- membership ----------------------------------------------------------------------------
    def filter(self, keep) -> None:
        """Keep only requests for which ``keep(req)`` is true (e.g. not finished)."""
        kept = [r for r in self.reqs if keep(r)]
        if len(kept) != len(self.reqs):
            self.reqs = kept
            self._sampling = None

    def merge(self, other: ScheduleBatch) -> None:
        """Append other's requests (a finished prefill joining the running decode batch)."""
        self.reqs = self.reqs + [r for r in other.reqs if r is not other.chunked_req]
        self._sampling = None

    # -- slot bookkeeping (prep.batch part=alloc, inside sched.schedule) -------------------------
    def prepare_for_extend(self, allocator: TokenSlotAllocator, pool: ReqToTokenPool,
                           tree_cache) -> None:
        """Give each request a row (if new) and slots for its ``extend_input_len`` new tokens.

        Each request arrives with ``prefix_len``/``last_node`` from the prefix match and the
        matched slots in ``prefix_indices`` (new admissions) — written into its row here.
        """
        with stage(_PREP, part="alloc", mode=ForwardMode.EXTEND.label, bs=len(self.reqs)):
            self._prepare_for_extend(allocator, pool, tree_cache)

    def _prepare_for_extend(self, allocator: TokenSlotAllocator, pool: ReqToTokenPool,
                            tree_cache) -> None:
        self.forward_mode = ForwardMode.EXTEND
        self.num_decode_rows = 0
        total = sum(r.extend_input_len for r in self.reqs)
        slots = alloc_slots(allocator, tree_cache, total)
        self.out_cache_loc = slots
        self.prefix_lens, self.extend_lens = [], []
        off = 0
        for r in self.reqs:
            if r.req_pool_idx is None:
                row = pool.alloc()
                if row is None:
                    raise OutOfSlotsError("no free request row (admission should prevent it)")
                r.req_pool_idx = row
                prefix = r.prefix_indices
                if prefix is not None and len(prefix):
                    pool.write(row, 0, prefix)
                r.prefix_indices = None
                r.kv_len = r.prefix_len
            n = r.extend_input_len
            self.prefix_lens.append(r.kv_len)
            self.extend_lens.append(n)
            pool.write(r.req_pool_idx, r.kv_len, slots[off:off + n])
            r.kv_len += n
            r.prefill_tokens += n
            off += n

    def prepare_for_decode(self, allocator: TokenSlotAllocator, pool: ReqToTokenPool,
                           tree_cache) -> None:
        """One new slot per request for the token it feeds this step."""
        with stage(_PREP, part="alloc", mode=ForwardMode.DECODE.label, bs=len(self.reqs)):
            self._prepare_for_decode(allocator, pool, tree_cache)

    def _prepare_for_decode(self, allocator: TokenSlotAllocator, pool: ReqToTokenPool,
                            tree_cache) -> None:
        self.forward_mode = ForwardMode.DECODE
        self.num_decode_rows = 0
        bs = len(self.reqs)
        slots = alloc_slots(allocator, tree_cache, bs)
        self.out_cache_loc = slots
        rows = np.fromiter((r.req_pool_idx for r in self.reqs), dtype=np.int64, count=bs)
        cols = np.fromiter((r.kv_len for r in self.reqs), dtype=np.int64, count=bs)
        pool.write_many(rows, cols, slots)
        for r in self.reqs:
            r.kv_len += 1

    def mix_with_running(self, running: list[Req], allocator: TokenSlotAllocator,
                         pool: ReqToTokenPool, tree_cache) -> None:
        """Append decode requests to this (prepared) extend batch: each feeds its last token
        (one new slot, extend length 1) and samples one; the batch becomes MIXED."""
        if not running:
            return
        with stage(_PREP, part="alloc", mode=ForwardMode.MIXED.label, bs=len(running)):
            self._mix_with_running(running, allocator, pool, tree_cache)

    def _mix_with_running(self, running: list[Req], allocator: TokenSlotAllocator,
                          pool: ReqToTokenPool, tree_cache) -> None:
        bs = len(running)
        slots = alloc_slots(allocator, tree_cache, bs)
        rows = np.fromiter((r.req_pool_idx for r in running), dtype=np.int64, count=bs)
        cols = np.fromiter((r.kv_len for r in running), dtype=np.int64, count=bs)
        pool.write_many(rows, cols, slots)
        for r in running:
            r.extend_input_len = 1
            self.prefix_lens.append(r.kv_len)
            self.extend_lens.append(1)
            r.kv_len += 1
        self.out_cache_loc = np.concatenate([self.out_cache_loc, slots])
        self.reqs = self.reqs + list(running)
        self.num_decode_rows = bs
        self.forward_mode = ForwardMode.MIXED
        self._sampling = None

    # -- lowering (prep.batch) -----------------------------------------------------------------
    def sampling_info(self, device: torch.device) -> SamplingBatchInfo:
        """Per-row sampling tensors; rebuilt only when membership changed (output_lens always)."""
        reqs = self.reqs
        key = tuple(id(r) for r in reqs)
        if self._sampling is None or key != self._sampling_key:
            sp = [r.sampling_params for r in reqs]
            vals = torch.tensor([[p.temperature, p.top_p, p.min_p] for p in sp],
                                dtype=torch.float32).reshape(len(sp), 3).T.contiguous().to(device)
            self._sampling = SamplingBatchInfo(
                temperatures=vals[0], top_ps=vals[1], min_ps=vals[2],
                top_ks=torch.tensor([p.top_k for p in sp], dtype=torch.int64).to(device),
                seeds=[p.seed for p in sp], output_lens=[],
                is_all_greedy=all(p.temperature == 0.0 for p in sp))
            self._sampling_key = key
        # index of the token sampled this step within each request's output
        # NOTE: a fresh object per step: in the overlap loop the previous step's forward may still
        # be sampling with its own output_lens on the worker thread (shared tensors are read-only).
        return dataclasses.replace(self._sampling,
                                   output_lens=[r.kv_len - len(r.origin_input_ids) for r in reqs])

    def to_forward_batch(self, pool: ReqToTokenPool, device: torch.device,
                         step: int) -> tuple[ForwardBatch, tuple | None, bool]:
        """Build the ForwardBatch. Returns it, the pending req-to-token writes
        ``(rows, cols, slots)`` as device tensors, and whether input_ids hold future placeholders
        (``-(k+1)`` = the token that future slot k will hold — overlap loop only)."""
        reqs = self.reqs
        bs = len(reqs)
        placeholders = False
        out_loc = self.out_cache_loc
        assert out_loc is not None                      # set by the prepare_* step
        rpi_cpu = np.array([r.req_pool_idx for r in reqs], dtype=np.int64)
        extra: dict[str, Any] = {}
        ids: list[int] = []
        if self.forward_mode == ForwardMode.DECODE:
            for r in reqs:
                if r.future_idx >= 0:
                    ids.append(-(r.future_idx + 1))
                    placeholders = True
                else:
                    ids.append(r.output_ids[-1])
            seq = np.fromiter((r.kv_len for r in reqs), dtype=np.int64, count=bs)
            packed = np.empty((5, bs), dtype=np.int64)
            packed[0] = ids
            packed[1] = seq - 1
            packed[2] = seq
            packed[3] = rpi_cpu
            packed[4] = out_loc
            t = torch.from_numpy(packed).to(device, non_blocking=True)
            input_ids, positions, seq_lens, rpi, loc = t[0], t[1], t[2], t[3], t[4]
            seq_cpu = seq.tolist()
        else:
            pos: list[np.ndarray] = []
            first_decode = bs - self.num_decode_rows
            for i, (r, p, n) in enumerate(zip(reqs, self.prefix_lens, self.extend_lens)):
                if i >= first_decode and r.future_idx >= 0:
                    ids.append(-(r.future_idx + 1))     # mixed decode row, token still in flight
                    placeholders = True
                else:
                    ids.extend(r.fill_ids[p:p + n])
                pos.append(np.arange(p, p + n, dtype=np.int64))
            ntok = len(ids)
            seq_cpu = [p + n for p, n in zip(self.prefix_lens, self.extend_lens)]
            flat = np.empty(3 * ntok + 4 * bs, dtype=np.int64)
            flat[:ntok] = ids
            flat[ntok:2 * ntok] = np.concatenate(pos) if pos else []
            flat[2 * ntok:3 * ntok] = out_loc
            o = 3 * ntok
            flat[o:o + bs] = seq_cpu
            flat[o + bs:o + 2 * bs] = rpi_cpu
            flat[o + 2 * bs:o + 3 * bs] = self.prefix_lens
            flat[o + 3 * bs:o + 4 * bs] = self.extend_lens
            t = torch.from_numpy(flat).to(device, non_blocking=True)
            input_ids, positions, loc = t[:ntok], t[ntok:2 * ntok], t[2 * ntok:o]
            seq_lens, rpi = t[o:o + bs], t[o + bs:o + 2 * bs]
            extra = dict(extend_prefix_lens=t[o + 2 * bs:o + 3 * bs],
                         extend_seq_lens=t[o + 3 * bs:o + 4 * bs],
                         extend_prefix_lens_cpu=list(self.prefix_lens),
                         extend_seq_lens_cpu=list(self.extend_lens))
        writes = pool.take_dirty(device)
        fb = ForwardBatch(forward_mode=self.forward_mode, batch_size=bs, input_ids=input_ids,
                          positions=positions, seq_lens=seq_lens, req_pool_indices=rpi,
                          req_to_token=pool.table, out_cache_loc=loc,
                          sampling=self.sampling_info(device), seq_lens_cpu=seq_cpu,
                          sample_rows=self.sample_rows(), step=step, **extra)
        return fb, writes, placeholders
