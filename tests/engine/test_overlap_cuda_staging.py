"""The CUDA overlap path's pure parts, on the CPU: the slot ring's event bookkeeping (with fake
events), packing tensors into one arena and back, and the whole staged WorkerClient path run
with a CPU stand-in for the streams — outputs equal the normal loop's."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.forward_batch import ForwardBatch, ForwardMode
from srtscope.engine.runner.sampler import make_sampling_info
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler.scheduler import Scheduler
from srtscope.engine.scheduler.stream_staging import ALIGN, StagingRing, TensorStager, host_tensors, layout
from srtscope.engine.scheduler.worker_client import WorkerClient
from tests.engine.sched_helpers import FakeWorker, byte_prompt, drain

torch.set_num_threads(1)


class FakeEvent:
    """An event that completes when the test says so (``done``); counts host waits."""

    def __init__(self, name: str = "", done: bool = False) -> None:
        self.name, self.done, self.syncs = name, done, 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.syncs += 1
        self.done = True


def _alloc(n):
    return torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)


def test_ring_reuses_a_slot_only_after_its_forward_was_recorded():
    ring = StagingRing(2, _alloc, min_bytes=64)
    a = ring.acquire(10)
    ring.mark_copied(a, FakeEvent("copy a"))
    b = ring.acquire(10)
    with pytest.raises(RuntimeError, match="reused while still copied"):
        ring.acquire(10)                 # slot a's forward has not recorded ``consumed``
    ring.mark_consumed(a, FakeEvent("fwd a"))
    ring.mark_copied(b, FakeEvent("copy b"))
    a2 = ring.acquire(10)
    assert a2 is a and a2.consumed.name == "fwd a"   # the copy into a waits on this event
    with pytest.raises(RuntimeError):
        ring.mark_consumed(a2, FakeEvent())          # filling: not copied yet


def test_ring_waits_for_the_copy_before_rewriting_pinned_memory():
    ring = StagingRing(2, _alloc, min_bytes=64)
    slots = []
    for _ in range(2):
        s = ring.acquire(8)
        ring.mark_copied(s, FakeEvent("copy"))
        ring.mark_consumed(s, FakeEvent("fwd"))
        slots.append(s)
    pending_copy = slots[0].copied
    assert ring.acquire(8) is slots[0]
    assert pending_copy.syncs == 1 and ring.stats.host_waits == 1
    s1 = slots[1]
    s1.copied.done = True                       # already finished: no host wait
    assert ring.acquire(8) is s1 and s1.copied.syncs == 0 and ring.stats.host_waits == 1


def test_ring_grow_waits_for_the_old_device_arena():
    ring = StagingRing(2, _alloc, min_bytes=64)
    s = ring.acquire(8)
    ring.mark_copied(s, FakeEvent(done=True))
    fwd = FakeEvent("fwd")
    ring.mark_consumed(s, fwd)
    ring.mark_copied(ring.acquire(8), FakeEvent(done=True))
    old = s.dev
    big = ring.acquire(1000)
    assert big is s and fwd.syncs == 1 and s.dev is not old and s.dev.numel() >= 1000
    assert s.consumed is None and ring.stats.grows == 1


def test_ring_abandon_after_a_failed_step_and_min_slots():
    ring = StagingRing(2, _alloc)
    s = ring.acquire(8)
    ring.abandon(s)
    ring.mark_copied(ring.acquire(8), FakeEvent())
    assert ring.acquire(8) is s
    with pytest.raises(ValueError):
        StagingRing(1, _alloc)


def test_layout_is_aligned_and_pack_round_trips():
    ts = [torch.arange(5, dtype=torch.int64), torch.tensor([0.5, 1.5, -2.0]),
          torch.empty(0, dtype=torch.int64), torch.tensor([True, False]),
          torch.arange(12, dtype=torch.int32).reshape(3, 4).T]         # non-contiguous
    offs, used = layout(ts)
    assert all(o % ALIGN == 0 for o in offs) and used % ALIGN == 0
    ring = StagingRing(2, _alloc)
    copies = []

    def copy(dst, src, wait):
        copies.append(wait)
        dst.copy_(src)
        return FakeEvent(done=True)

    slot, views = TensorStager(ring, copy).stage(ts)
    assert slot.state == "copied" and copies == [None]
    for t, v in zip(ts, views):
        assert v.dtype == t.dtype and v.shape == t.shape and torch.equal(v, t)
        assert v.untyped_storage().data_ptr() == slot.dev.untyped_storage().data_ptr()


def test_host_tensors_rebuilds_batch_sampling_and_writes():
    ids = torch.tensor([[3, 4], [1, 2], [2, 3], [0, 1], [9, 10]])
    si = make_sampling_info([0.0, 0.7], top_ks=[-1, 5])
    table = torch.zeros(4, 8, dtype=torch.int32)      # the shared table: never staged
    fb = ForwardBatch(ForwardMode.DECODE, 2, ids[0], ids[1], ids[2], ids[3], table, ids[4],
                      sampling=si, seq_lens_cpu=[3, 4], step=7)
    writes = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([9, 10]))
    tensors, rebuild = host_tensors(fb, writes)
    assert len(tensors) == 5 + 4 + 3
    views = [t.clone() + 100 if t.dtype == torch.int64 else t.clone() for t in tensors]
    fb2, w2 = rebuild(views)
    assert fb2 is not fb and fb2.req_to_token is table and fb2.step == 7
    assert torch.equal(fb2.input_ids, ids[0] + 100) and torch.equal(w2[2], writes[2] + 100)
    assert torch.equal(fb2.sampling.top_ks, si.top_ks + 100) and fb2.sampling is not si
    assert torch.equal(fb.input_ids, ids[0])                          # the original untouched
    _, rebuild_none = host_tensors(dataclasses.replace(fb, sampling=None), None)
    assert rebuild_none(views[:5])[1] is None


class CpuStreams:
    """The staged path's stream object on the CPU: copies run at once; events are fakes that
    check the ordering the CUDA streams would enforce."""

    def __init__(self, n_slots: int = 3) -> None:
        self.ring = StagingRing(n_slots, _alloc, min_bytes=64)
        self.log: list[str] = []
        self.copy_waits: list[object] = []

    def forward_ctx(self):
        return contextlib.nullcontext()

    def copy(self, dst, src, wait_event):
        if wait_event is not None:
            assert isinstance(wait_event, FakeEvent) and wait_event.name == "consumed"
        self.copy_waits.append(wait_event)
        if dst is not None:
            dst.copy_(src)
        self.log.append("copy")
        return FakeEvent("copied", done=True)

    def forward_wait(self, event):
        assert event.name == "copied"
        self.log.append("wait")

    def record(self):
        self.log.append("record")
        return FakeEvent("consumed", done=True)

    def to_host(self, t):
        self.log.append("d2h")
        return t.clone(), FakeEvent("ids", done=True)

    def synchronize(self):
        pass


CFG = EngineConfig(device="cpu", max_total_tokens=400, max_running_requests=6,
                   context_length=256, chunked_prefill_size=24, enable_probes=False)


def _run(cfg, worker, streams=None, n=8):
    s = Scheduler(cfg, worker)
    if streams is not None:
        s.client.close()
        s.client = WorkerClient(worker, s.req_to_token, True, s.client.future_size, streams)
        assert s.client.staged and s.client.device.type == "cpu"
    reqs = [s.submit(s.make_req(byte_prompt(i, 5 + 9 * i), {"max_new_tokens": 2 + (i * 5) % 11}))
            for i in range(n)]
    drain(s)
    s.close()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("fake", [True, False])
def test_staged_client_on_cpu_equals_normal_loop(fake):
    worker = FakeWorker(CFG, delay_s=0.001) if fake else TpModelWorker(CFG)
    normal = _run(CFG, worker)
    streams = CpuStreams()
    staged = _run(dataclasses.replace(CFG, enable_overlap=True), worker, streams)
    assert staged == normal and all(staged)
    log = streams.log
    n = log.count("copy")
    assert n > 10 and log.count("wait") == log.count("record") == log.count("d2h") == n
    # every step: copy, forward waits on it, forward, consumed recorded, ids copied to the host
    assert log == ["copy", "wait", "record", "d2h"] * n
    # from the first reuse on, each copy waited on the forward that last read its slot
    waits = streams.copy_waits
    assert waits[:3] == [None] * 3 and all(w is not None for w in waits[3:])


def test_cpu_overlap_is_not_staged():
    s = Scheduler(dataclasses.replace(CFG, enable_overlap=True), FakeWorker(CFG))
    assert not s.client.staged and s.client.streams is None and s.client.device.type == "cpu"
    s.close()
