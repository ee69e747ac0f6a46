"""Overlap loop: same greedy outputs as the normal loop, forward t concurrent with scheduling
t+1, the one-step-late finish dropped and its slot freed, the idle invariant at the end."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from srtscope import probes
from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler.scheduler import Scheduler
from srtscope.probes.recorder import get_recorder
from srtscope.probes.stages import Stage
from tests.engine.sched_helpers import FakeWorker, byte_prompt

pytestmark = pytest.mark.usefixtures("probes_off")

torch.set_num_threads(1)

CFG = EngineConfig(device="cpu", max_total_tokens=1024, max_running_requests=8,
                   context_length=256, chunked_prefill_size=24, enable_probes=False)
PROMPTS = [byte_prompt(3, 30) + byte_prompt(i, n) for i, n in enumerate([2, 40, 7, 19, 60, 1])]
PARAMS = [{"max_new_tokens": m} for m in (1, 9, 4, 12, 2, 7)]


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(CFG)


def run(worker, **kw):
    cfg = dataclasses.replace(CFG, **kw)
    with Engine(cfg, worker=worker) as eng:
        outs = eng.generate(PROMPTS, PARAMS)
        eng.check_invariants()
        return [o.output_ids for o in outs], eng.stats


@pytest.mark.parametrize("kw", [{}, {"disable_radix_cache": True}, {"max_total_tokens": 120}])
def test_overlap_equals_normal(worker, kw):
    normal, _ = run(worker, **kw)
    overlap, stats = run(worker, enable_overlap=True, **kw)
    assert overlap == normal
    assert [len(o) for o in overlap] == [p["max_new_tokens"] for p in PARAMS]


def test_stop_token_one_step_late_is_dropped(worker):
    free, _ = run(worker)
    stops = [{"max_new_tokens": p["max_new_tokens"], "stop_token_ids": [o[0]]}
             for o, p in zip(free, PARAMS)]
    for overlap in (False, True):
        with Engine(dataclasses.replace(CFG, enable_overlap=overlap), worker=worker) as eng:
            outs = eng.generate(PROMPTS, stops)
            assert [o.output_ids for o in outs] == [f[:1] for f in free]
            eng.check_invariants()               # the extra decode slot was freed


@pytest.mark.parametrize("overlap", [False, True])
def test_step_t_plus_1_is_launched_before_step_t_results_are_read(worker, overlap):
    probes.enable(nvtx=False)
    get_recorder().clear()
    with Engine(dataclasses.replace(CFG, enable_overlap=overlap), worker=worker) as eng:
        eng.generate(PROMPTS, PARAMS)
    spans = get_recorder().spans()
    main = threading.get_native_id()
    fwd = [s for s in spans if s.name == Stage.RUN_EAGER.value]
    assert fwd and all((s.tid != main) == overlap for s in fwd)   # forwards on the worker thread
    prep = {s.attrs["step"]: s.start_ns for s in spans
            if s.name == Stage.PREP_BATCH.value and "part" not in s.attrs}
    result = {s.attrs["step"]: s.start_ns for s in spans if s.name == Stage.SCHED_RESULT.value}
    ahead = [prep[t + 1] < result[t] for t in sorted(result) if t + 1 in prep]
    assert len(ahead) >= 10 and all(a == overlap for a in ahead)


def test_fake_worker_overlap_with_slow_forward_and_aborts():
    cfg = dataclasses.replace(CFG, max_total_tokens=200, chunked_prefill_size=16,
                              enable_overlap=True)
    outs = {}
    for overlap in (False, True):
        c = dataclasses.replace(cfg, enable_overlap=overlap)
        s = Scheduler(c, FakeWorker(c, delay_s=0.002))
        reqs = [s.submit(s.make_req(byte_prompt(i, 10 + 7 * i), {"max_new_tokens": 3 + i}))
                for i in range(8)]
        victim = s.submit(s.make_req(byte_prompt(99, 50), {"max_new_tokens": 40}))
        for k in range(10_000):
            if s.is_idle():
                break
            if k == 6:
                s.abort(victim.rid)
            s.run_step()
        s.check_invariants()
        s.close()
        assert victim.finished_reason.kind.value == "abort"
        outs[overlap] = [r.output_ids for r in reqs]
    assert outs[True] == outs[False]
