"""The overlap loop on CUDA streams (``gpu``; skipped without CUDA): greedy outputs equal the
normal loop's with graphs on; a slow forward (``torch.cuda._sleep`` on the forward stream) with a
churning batch cannot expose a write-after-read race; graph replay inside the overlap loop gives
the eager outputs."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler.stream_staging import CudaStreams
from tests.engine.sched_helpers import byte_prompt

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CFG = EngineConfig(device="cuda", max_total_tokens=4096, max_running_requests=16,
                   context_length=256, chunked_prefill_size=48, cuda_graph_max_bs=16,
                   enable_probes=False)
PROMPTS = [byte_prompt(5, 24) + byte_prompt(i, 3 + (7 * i) % 41) for i in range(24)]
PARAMS = [{"max_new_tokens": 2 + (5 * i) % 19} for i in range(24)]


class Recording:
    """Wraps a worker's forward: records (graph_used, mode, bs) and optionally sleeps first on
    the current (= forward) stream, so the device lags far behind the host."""

    def __init__(self, worker, sleep_cycles: int = 0) -> None:
        self.worker, self.sleep_cycles, self.calls = worker, sleep_cycles, []
        self.streams = set()
        self._orig = worker.forward_batch_generation

    def __enter__(self):
        def fwd(fb):
            if self.sleep_cycles:
                torch.cuda._sleep(self.sleep_cycles)   # delays this step's reads of its inputs
            self.streams.add(torch.cuda.current_stream().cuda_stream)
            res = self._orig(fb)
            self.calls.append((res.graph_used, fb.forward_mode.label, fb.batch_size))
            return res
        self.worker.forward_batch_generation = fwd
        return self

    def __exit__(self, *exc):
        self.worker.forward_batch_generation = self._orig


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(CFG)


@pytest.fixture(scope="module")
def eager_worker():
    return TpModelWorker(dataclasses.replace(CFG, disable_cuda_graph=True))


def run(worker, prompts=PROMPTS, params=PARAMS, sleep_cycles=0, **kw):
    cfg = dataclasses.replace(CFG, **kw)
    with Recording(worker, sleep_cycles) as rec, Engine(cfg, worker=worker) as eng:
        client = eng.scheduler.client
        outs = eng.generate(prompts, params)
        eng.check_invariants()
    return [o.output_ids for o in outs], rec, client


def test_overlap_equals_normal_with_graphs(worker):
    assert worker.graph_capture_bs, "graphs were not captured"
    normal, rec_n, _ = run(worker)
    overlap, rec_o, client = run(worker, enable_overlap=True)
    assert overlap == normal
    assert [len(o) for o in overlap] == [p["max_new_tokens"] for p in PARAMS]
    assert any(g for g, mode, _ in rec_o.calls if mode == "decode"), "no graph replay in overlap"
    default = torch.cuda.default_stream().cuda_stream
    assert rec_n.streams == {default}
    assert default not in rec_o.streams and len(rec_o.streams) == 1   # the forward stream
    assert client.staged and client.stager.ring.stats.acquires == len(rec_o.calls)


@pytest.mark.parametrize("graphs", [True, False])
def test_slow_forward_with_churning_batches_has_no_war_race(worker, eager_worker, graphs):
    """Many steps, batch composition changing every few steps (arrivals, finishes, chunked
    prefills, padding buckets), and ~1 ms of device sleep before each forward: the host stages
    step t+1 (and rewrites pinned memory) long before step t's kernels read their inputs."""
    w = worker if graphs else eager_worker
    prompts = [byte_prompt(100 + i, 2 + (11 * i) % 57) for i in range(40)]
    params = [{"max_new_tokens": 1 + (7 * i) % 23} for i in range(40)]
    normal, _, _ = run(w, prompts, params, max_running_requests=12)
    slow, rec, client = run(w, prompts, params, sleep_cycles=2_000_000, enable_overlap=True,
                            max_running_requests=12)
    assert slow == normal
    sizes = {bs for _, _, bs in rec.calls}
    assert len(rec.calls) > 40 and len(sizes) > 4
    assert client.stager.ring.stats.acquires == len(rec.calls)


def test_graph_replay_in_overlap_equals_eager(worker, eager_worker):
    graphs, rec_g, _ = run(worker, enable_overlap=True)
    eager, rec_e, _ = run(eager_worker, enable_overlap=True)
    assert graphs == eager
    assert sum(g for g, _, _ in rec_g.calls) > 5 and not any(g for g, _, _ in rec_e.calls)


def test_cuda_streams_copy_waits_and_ids_reach_pinned_host():
    dev = torch.device("cuda", torch.cuda.current_device())
    cs = CudaStreams(dev, n_slots=2)
    src = torch.arange(64, dtype=torch.uint8).pin_memory()
    dst = torch.zeros(64, dtype=torch.uint8, device=dev)
    with cs.forward_ctx():
        torch.cuda._sleep(5_000_000)
        reader = cs.record()                 # "the forward that read dst" ends after the sleep
    ev = cs.copy(dst, src, reader)
    cs.forward_wait(ev)
    ev.synchronize()
    assert reader.query()                    # the copy could not finish before its reader
    assert torch.equal(dst.cpu(), src)
    host, ready = cs.to_host(dst.long())
    ready.synchronize()
    assert host.is_pinned() and torch.equal(host, src.long())
