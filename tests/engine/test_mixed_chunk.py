"""Mixed chunks (``enable_mixed_chunk``): running decode requests ride along with prefill chunks in
one MIXED forward. Exact layout/advance checks on ``FakeWorker``; output equality, fewer forwards
and the ``loop.step`` mode on the real tiny model.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler.scheduler import Scheduler
from srtscope.probes.recorder import get_recorder
from srtscope.probes.stages import Stage
from tests.engine.sched_helpers import FakeWorker, byte_prompt, drain

pytestmark = pytest.mark.usefixtures("probes_off")

torch.set_num_threads(1)

BASE = EngineConfig(device="cpu", max_total_tokens=4096, max_running_requests=16,
                    chunked_prefill_size=16, context_length=512, enable_probes=False,
                    enable_mixed_chunk=True)


def make(**kw) -> Scheduler:
    cfg = dataclasses.replace(BASE, **kw)
    return Scheduler(cfg, FakeWorker(cfg))


def test_config_needs_chunked_prefill():
    with pytest.raises(ValueError, match="^enable_mixed_chunk: "):
        dataclasses.replace(BASE, chunked_prefill_size=-1)
    assert not EngineConfig().enable_mixed_chunk


def test_decode_rows_ride_along_one_token_and_the_chunk_emits_none():
    s = make()
    short = s.submit(s.make_req(byte_prompt(1, 6), {"max_new_tokens": 30}))
    s.run_step()                                   # prefill of the short request
    s.run_step()                                   # one decode step
    assert len(short.output_ids) == 2
    long = s.submit(s.make_req(byte_prompt(2, 40), {"max_new_tokens": 3}))
    s.recv_requests()
    chunks = []
    while long.kv_len < 40:
        before = len(short.output_ids)
        batch = s.get_next_batch_to_run()
        assert batch.forward_mode == ForwardMode.MIXED and batch.reqs == [long, short]
        assert batch.num_decode_rows == 1 and batch.extend_lens[-1] == 1
        # the chunk budget (16) less the one decode token
        assert batch.extend_lens[0] == min(15, 40 - long.kv_len + batch.extend_lens[0])
        assert batch.num_tokens() == batch.extend_lens[0] + 1 <= 16
        chunks.append(batch.extend_lens[0])
        s.process_batch_result(s.run_batch(batch))
        assert len(short.output_ids) == before + 1     # exactly one token per mixed step
        assert long.output_ids == [] if long.kv_len < 40 else len(long.output_ids) == 1
    assert sum(chunks) == 40 and len(chunks) == 3 and s.chunked_req is None
    assert len(long.output_ids) == 1                   # the last chunk samples the first token
    nxt = s.get_next_batch_to_run()                    # both decode now
    assert nxt.forward_mode == ForwardMode.DECODE and set(nxt.reqs) == {long, short}
    s.process_batch_result(s.run_batch(nxt))
    drain(s)
    s.close()
    assert len(short.output_ids) == 30 and len(long.output_ids) == 3


def test_too_many_decode_rows_for_the_chunk_budget_no_mixing():
    s = make(chunked_prefill_size=4)
    for i in range(4):
        s.submit(s.make_req(byte_prompt(i, 1), {"max_new_tokens": 20}))
    s.run_step()                                   # one 4-token prefill: 4 decoding requests
    s.run_step()
    assert len(s.running_batch.reqs) == 4
    s.submit(s.make_req(byte_prompt(9, 12), {"max_new_tokens": 2}))
    s.recv_requests()
    batch = s.get_next_batch_to_run()
    assert batch.forward_mode == ForwardMode.EXTEND and batch.num_decode_rows == 0
    s.process_batch_result(s.run_batch(batch))
    drain(s)
    s.close()


def _staggered(s: Scheduler, seed: int, abort_at: int = -1) -> tuple[list, list]:
    """Short requests decoding while long prompts keep arriving; returns (outputs, modes)."""
    rng = random.Random(seed)
    plan = {k: [] for k in range(0, 60, 3)}
    for i in range(24):
        n = rng.choice([4, 9, 70, 130]) if i % 3 else rng.randint(3, 12)
        plan[rng.choice(list(plan))].append((byte_prompt(100 + i, n), rng.randint(1, 24)))
    reqs, modes, victim = [], [], None
    for k in range(10_000):
        for prompt, m in plan.get(k, []):
            reqs.append(s.submit(s.make_req(prompt, {"max_new_tokens": m})))
        if k == 2:
            victim = s.submit(s.make_req(byte_prompt(99, 150), {"max_new_tokens": 40}))
        if k == abort_at:
            s.abort(victim.rid)
        if k > max(plan) and s.is_idle():
            break
        s.recv_requests()
        before = len(s.worker.calls)
        s.run_step()
        modes.extend(c[0] for c in s.worker.calls[before:])
    s.check_invariants()
    s.close()
    assert victim.finished_reason.kind.value == "abort"
    return [r.output_ids for r in reqs] + [victim.output_ids], modes


TINY = {"max_total_tokens": 200, "init_new_token_ratio": 0.05, "min_new_token_ratio": 0.0}


@pytest.mark.parametrize("kw", [{}, {"enable_overlap": True}, TINY,
                                {**TINY, "enable_overlap": True}])
def test_fake_worker_mixed_equals_unmixed_with_retraction_and_abort(kw):
    kw = {"chunked_prefill_size": 32, **kw}
    want, plain = _staggered(make(enable_mixed_chunk=False, **kw), seed=3, abort_at=20)
    s = make(**kw)
    got, modes = _staggered(s, seed=3, abort_at=20)
    assert got[:-1] == want[:-1] and all(got[:-1])
    assert "mixed" in modes and "mixed" not in plain
    assert len(modes) < len(plain)
    if "max_total_tokens" in kw:
        assert s.stats.retractions > 0


# -- the real tiny model ---------------------------------------------------------------------------

CFG = EngineConfig(device="cpu", max_total_tokens=2048, max_running_requests=16,
                   context_length=256, chunked_prefill_size=24, enable_probes=False)


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(CFG)


def _run_real(worker, **kw) -> tuple[list[list[int]], int, list[dict]]:
    eng = Engine(dataclasses.replace(CFG, **kw), worker=worker)
    get_recorder().clear()
    with eng:
        reqs = [eng.submit(byte_prompt(i, n), {"max_new_tokens": 16})
                for i, n in enumerate([5, 11, 8])]
        late = {2: [(20, 100)], 5: [(21, 70), (22, 3)], 9: [(23, 120)]}
        for k in range(10_000):
            for seed, n in late.get(k, []):
                reqs.append(eng.submit(byte_prompt(seed, n), {"max_new_tokens": 10}))
            if k > max(late) and eng.scheduler.is_idle():
                break
            eng.step()
        eng.check_invariants()
        steps = eng.scheduler.stats.steps
    spans = [dict(s.attrs) for s in get_recorder().spans() if s.name == Stage.LOOP_STEP.value]
    return [r.output_ids for r in reqs], steps, spans


@pytest.mark.parametrize("overlap", [False, True])
def test_real_model_mixed_equals_unmixed_with_fewer_forwards(worker, overlap):
    want, steps_plain, _ = _run_real(worker, enable_overlap=overlap)
    got, steps_mixed, spans = _run_real(worker, enable_overlap=overlap, enable_mixed_chunk=True,
                                        enable_probes=True)
    assert got == want and all(len(o) in (10, 16) for o in got)
    assert steps_mixed < steps_plain
    mixed = [a for a in spans if a.get("mode") == "mixed"]
    assert mixed and all(a["bs"] >= 2 and a["tokens"] > a["bs"] for a in mixed)
