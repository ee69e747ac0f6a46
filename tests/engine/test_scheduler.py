"""Scheduler: batch selection order, admission budgets, chunked prefill, retraction, prefix reuse.

Runs against ``FakeWorker`` (tests/engine/sched_helpers.py), which verifies every request's KV
slots on every forward, so a wrong row, a stale slot or a freed-and-reused slot fails loudly.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from srtscope.engine.config import EngineConfig
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.request import FinishKind
from srtscope.engine.scheduler.scheduler import Scheduler
from tests.engine.sched_helpers import FakeWorker, byte_prompt, drain

BASE = EngineConfig(device="cpu", max_total_tokens=4096, max_running_requests=16,
                    chunked_prefill_size=-1, context_length=512, enable_probes=False)


def make(req_pool_size=None, **kw) -> Scheduler:
    cfg = dataclasses.replace(BASE, **kw)
    return Scheduler(cfg, FakeWorker(cfg), req_pool_size=req_pool_size)


def run(s: Scheduler, prompts, max_new=8, **sp) -> list[list[int]]:
    reqs = [s.submit(s.make_req(p, {"max_new_tokens": max_new, **sp})) for p in prompts]
    drain(s)
    s.close()
    return [r.output_ids for r in reqs]


PROMPTS = [byte_prompt(i, n) for i, n in enumerate([5, 40, 17, 90, 3, 64, 33, 128])]


def test_seed_order_merge_then_new_prefill_then_decode():
    s = make()
    a = s.submit(s.make_req([1, 2, 3], {"max_new_tokens": 5}))
    s.recv_requests()
    b1 = s.get_next_batch_to_run()
    assert b1.forward_mode == ForwardMode.EXTEND and b1.reqs == [a]
    s.process_batch_result(s.run_batch(b1))
    b = s.submit(s.make_req([4, 5, 6], {"max_new_tokens": 5}))
    s.recv_requests()
    b2 = s.get_next_batch_to_run()
    # the finished prefill (a) joined the running batch; the new prefill (b) runs first
    assert s.running_batch.reqs == [a]
    assert b2.forward_mode == ForwardMode.EXTEND and b2.reqs == [b]
    s.process_batch_result(s.run_batch(b2))
    b3 = s.get_next_batch_to_run()
    assert b3.forward_mode == ForwardMode.DECODE and b3.reqs == [a, b]
    s.process_batch_result(s.run_batch(b3))
    while not s.is_idle():
        s.run_step()
    assert s.get_next_batch_to_run() is None          # idle
    s.check_invariants()


@pytest.mark.parametrize("kw, pool, why", [
    ({"max_running_requests": 2}, None, "running batch full"),
    ({}, 2, "no free request rows"),
    ({"max_total_tokens": 90}, None, "KV budget exhausted"),
])
def test_cases_where_a_new_prefill_does_not_run(kw, pool, why):
    s = make(req_pool_size=pool, **kw)
    for i in range(2):
        s.submit(s.make_req(byte_prompt(i, 20), {"max_new_tokens": 20}))
    s.run_step()                                        # both admitted (one prefill batch)
    assert s.running_batch.is_empty() and len(s.last_batch.reqs) == 2, why
    late = s.submit(s.make_req(byte_prompt(9, 20), {"max_new_tokens": 8}))
    s.recv_requests()
    batch = s.get_next_batch_to_run()
    assert batch.forward_mode == ForwardMode.DECODE, why
    assert late in s.waiting_queue and late not in batch.reqs, why
    s.process_batch_result(s.run_batch(batch))
    while not s.is_idle():
        s.run_step()
    assert late.finished_reason.kind is FinishKind.LENGTH
    s.check_invariants()


def test_max_prefill_tokens_splits_admission():
    s = make(max_prefill_tokens=50)
    for i in range(3):
        s.submit(s.make_req(byte_prompt(i, 30), {"max_new_tokens": 2}))
    s.run_step()
    assert len(s.last_batch.reqs) == 1 and len(s.waiting_queue) == 2
    run(s, [])


@pytest.mark.parametrize("chunk", [8, 24, 100])
def test_chunked_equals_unchunked(chunk):
    want = run(make(), PROMPTS)
    s = make(chunked_prefill_size=chunk)
    got = run(s, PROMPTS)
    assert got == want
    modes = s.worker.calls
    assert max(n for m, _, n in modes if m == "extend") <= chunk


def test_chunked_request_is_single_and_emits_no_token():
    s = make(chunked_prefill_size=16)
    long = s.submit(s.make_req(byte_prompt(1, 50), {"max_new_tokens": 3}))
    short = s.submit(s.make_req(byte_prompt(2, 40), {"max_new_tokens": 3}))
    seen_chunked = []
    while not s.is_idle():
        s.run_step()
        lb = s.last_batch
        if lb is not None and lb.chunked_req is not None:
            seen_chunked.append(lb.chunked_req)
            assert sum(r.is_chunked for r in lb.reqs) == 1
            assert not lb.chunked_req.output_ids        # a chunk never emits a token
    assert long in seen_chunked and short in seen_chunked
    assert len(long.output_ids) == len(short.output_ids) == 3
    s.check_invariants()


def test_retraction_under_tiny_pool_matches_roomy_pool():
    prompts = [byte_prompt(i, 24) for i in range(6)]
    want = run(make(), prompts, max_new=24)
    s = make(max_total_tokens=110, init_new_token_ratio=0.1, min_new_token_ratio=0.0)
    got = run(s, prompts, max_new=24)
    assert s.stats.retractions > 0
    assert got == want


def test_retract_fewest_outputs_first():
    s = make(max_total_tokens=40)
    reqs = [s.make_req([7] * 4, {"max_new_tokens": 30}) for _ in range(3)]
    for r, outs in zip(reqs, ([1] * 9, [2] * 2, [3] * 5)):
        r.output_ids = list(outs)
        s.add_request(r)
    s.waiting_queue.clear()
    for r in reqs:
        r.req_pool_idx = s.req_to_token.alloc()
        r.kv_len = r.seq_len - 1
        s.req_to_token.write(r.req_pool_idx, 0, s.allocator.alloc(r.kv_len))
        s.running_batch.reqs.append(r)
    s.allocator.alloc(s.allocator.available_size())    # the pool is now full
    retracted = s.retract_decode(s.running_batch)
    assert retracted[0] is reqs[1]                     # 2 outputs: the fewest
    assert all(r in s.waiting_queue and r.req_pool_idx is None for r in retracted)
    assert reqs[0] in s.running_batch.reqs


def test_prefix_cache_on_equals_off_with_fewer_prefill_tokens():
    system = byte_prompt(99, 80)
    prompts = [system + byte_prompt(i, 10) for i in range(10)]
    results = {}
    for disable in (True, False):
        s = make(disable_radix_cache=disable)
        outs = []
        for p in prompts:                               # one at a time: each can reuse the last
            outs += run_keep(s, [p])
        s.check_invariants()
        results[disable] = (outs, s.stats.prefill_tokens, s.stats.cache_hit_rate)
    assert results[False][0] == results[True][0]
    assert results[False][1] < results[True][1] - 8 * 80
    assert results[True][2] == 0 and results[False][2] > 0.6


def run_keep(s: Scheduler, prompts, max_new=8):
    reqs = [s.submit(s.make_req(p, {"max_new_tokens": max_new})) for p in prompts]
    while not s.is_idle():
        s.run_step()
    return [r.output_ids for r in reqs]


def test_randomized_workload_with_aborts_keeps_invariants():
    rng = random.Random(0)
    for overlap in (False, True):
        s = make(max_total_tokens=400, max_running_requests=8, chunked_prefill_size=32,
                 enable_overlap=overlap)
        s.worker.vocab = 258                              # EOS (257) can be sampled
        live = []
        for i in range(300):
            n = rng.choice([1, 3, 8, 30, 70])
            p = byte_prompt(rng.randrange(20), 10)[: rng.randint(1, 10)] + byte_prompt(i, n)
            live.append(s.submit(s.make_req(p, {"max_new_tokens": rng.randint(1, 12)})))
            if rng.random() < 0.1:
                s.abort(rng.choice(live).rid)
            if rng.random() < 0.5:
                s.run_step()
        while not s.is_idle():
            if rng.random() < 0.02 and s._live:
                s.abort(rng.choice(list(s._live)))
            s.run_step()
        s.check_invariants()
        assert all(r.finished for r in live)
        assert all(len(r.output_ids) <= r.max_new_tokens for r in live)
        assert any(r.finished_reason.kind is FinishKind.ABORT for r in live)
        s.close()


@pytest.mark.parametrize("policy, first", [("fcfs", "early"), ("lpm", "cached")])
def test_policies_order_the_waiting_queue(policy, first):
    s = make(schedule_policy=policy, max_prefill_tokens=8)
    run_keep(s, [[5] * 30])
    early = s.submit(s.make_req([1] * 30, {"max_new_tokens": 1}))
    cached = s.submit(s.make_req([5] * 30 + [6], {"max_new_tokens": 1}))
    s.recv_requests()
    batch = s.get_next_batch_to_run()
    assert batch.reqs[0] is {"early": early, "cached": cached}[first]
    s.process_batch_result(s.run_batch(batch))
    run_keep(s, [])
    s.check_invariants()


@pytest.mark.parametrize("leak, msg", [
    (lambda s: s.allocator.alloc(1), "free .* != total"),
    (lambda s: s.req_to_token.alloc(), "rows still held"),
    (lambda s: s.tree_cache.inc_lock_ref(s.tree_cache.match_prefix([5] * 10).last_node),
     "locked cache nodes"),
    (lambda s: s.submit(s.make_req([1, 2], {})), "not idle"),
])
def test_check_invariants_catches_leaks(leak, msg):
    s = make()
    run_keep(s, [[5] * 30])
    s.check_invariants()
    leak(s)
    with pytest.raises(AssertionError, match=msg):
        s.check_invariants()


@pytest.mark.parametrize("policy, first_round", [("lpm", 2), ("fcfs", 5)])
def test_lpm_defers_requests_sharing_an_uncached_prefix(policy, first_round):
    system = byte_prompt(5, 64)
    s = make(schedule_policy=policy)
    prompts = [system + byte_prompt(i, 8) for i in range(4)] + [byte_prompt(77, 40)]
    reqs = [s.submit(s.make_req(p, {"max_new_tokens": 2})) for p in prompts]
    s.run_step()
    assert len(s.last_batch.reqs) == first_round      # lpm: one of the shared four + the loner
    while not s.is_idle():
        s.run_step()
    s.check_invariants()
    shared_hits = sum(r.cached_tokens >= 64 for r in reqs[:4])
    assert shared_hits == (3 if policy == "lpm" else 0)


def test_chunked_request_yields_its_slots_when_decode_cannot_proceed():
    s = make(max_total_tokens=40, chunked_prefill_size=8)
    a = s.submit(s.make_req([3] * 4, {"max_new_tokens": 30}))
    s.run_step()
    s.run_step()                                        # a prefilled and decoding (5 slots)
    b = s.submit(s.make_req(byte_prompt(4, 38), {"max_new_tokens": 1}))
    s.recv_requests()
    s.waiting_queue.remove(b)                          # stage b as a half-prefilled chunk
    b.req_pool_idx = s.req_to_token.alloc()
    b.kv_len = s.allocator.available_size()            # b holds every free slot
    s.req_to_token.write(b.req_pool_idx, 0, s.allocator.alloc(b.kv_len))
    s.chunked_req = b
    batch = s.update_running_batch(s.running_batch)    # a must decode: b is pushed back
    assert batch.reqs == [a] and s.chunked_req is None and s.waiting_queue[0] is b
    assert b.req_pool_idx is None and b.num_retractions == 1
    s.process_batch_result(s.run_batch(batch))
    while not s.is_idle():
        s.run_step()
    assert len(a.output_ids) == 30 and len(b.output_ids) == 1
    s.check_invariants()


@pytest.mark.parametrize("overlap", [False, True])
def test_the_scheduler_owns_its_loop_and_state(overlap):
    """Callbacks come in at construction; step, in-flight step and TP sync are not writable from
    outside; the overlap loop settles its in-flight step before a retraction with no hook."""
    cfg = dataclasses.replace(BASE, enable_overlap=overlap, max_total_tokens=110,
                              init_new_token_ratio=0.1, min_new_token_ratio=0.0)
    seen = []
    s = Scheduler(cfg, FakeWorker(cfg), on_finish=seen.append)
    reqs = [s.submit(s.make_req(byte_prompt(i, 24), {"max_new_tokens": 24})) for i in range(6)]
    with pytest.raises(AttributeError):
        s.step = 3
    with pytest.raises(AttributeError):
        s.tp_sync = object()
    assert not hasattr(s, "_drain_hook") and not hasattr(s, "inflight")
    retract, settled = s.retract_decode, []

    def checked_retract(batch):
        settled.append(s._inflight is None)          # outputs final before anyone is requeued
        return retract(batch)

    s.retract_decode = checked_retract
    drain(s)
    s.close()
    assert s.stats.retractions > 0 and settled and all(settled)   # the KV budget forced retractions
    assert s.step == s.stats.steps > 0
    assert sorted(r.rid for r in seen) == sorted(r.rid for r in reqs)
    assert [r.rid for r in s.take_finished()] == [r.rid for r in seen] and s.take_finished() == []
    assert all(len(r.output_ids) == 24 for r in reqs)


def test_token_layout_is_one_per_row_and_checked():
    """The worker's tokens are per batch row; a result with one per sampled row only is refused
    (no guessing from lengths), and a chunk's row never receives its token."""
    cfg = dataclasses.replace(BASE, chunked_prefill_size=16)
    w = FakeWorker(cfg)
    s = Scheduler(cfg, w)
    short = s.submit(s.make_req(byte_prompt(2, 5), {"max_new_tokens": 2}))
    long = s.submit(s.make_req(byte_prompt(1, 40), {"max_new_tokens": 2}))
    s.recv_requests()
    batch = s.get_next_batch_to_run()
    assert batch.reqs == [short, long] and batch.chunked_req is long
    launched = s.run_batch(batch)
    assert launched.sample_rows == (0,)
    s.process_batch_result(launched)
    assert long.output_ids == [] and len(short.output_ids) == 1

    forward = w.forward_batch_generation

    def sampled_rows_only(fb):
        res = forward(fb)
        res.next_token_ids = res.next_token_ids[fb.sample_rows]
        return res

    w.forward_batch_generation = sampled_rows_only
    batch = s.get_next_batch_to_run()
    assert batch.chunked_req is long and len(batch.reqs) == 1 and batch.sample_rows() == []
    with pytest.raises(RuntimeError, match="one per row"):
        s.process_batch_result(s.run_batch(batch))
    s.close()


def test_the_request_path_calls_nothing_above_it():
    """The scheduler, batches and runner import nothing of their callers (engine facade, workloads,
    tp launch, cli)."""
    import ast
    import pathlib

    import srtscope.engine as eng

    root = pathlib.Path(eng.__file__).parent
    above = ("srtscope.engine.engine", "srtscope.engine.workloads", "srtscope.engine.tp_launch",
             "srtscope.engine.distributed", "srtscope.cli")
    files = [*sorted((root / "scheduler").glob("*.py")), *sorted((root / "runner").glob("*.py")),
             root / "schedule_batch.py", root / "forward_batch.py"]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(above), f"{f.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(above) for a in node.names), f.name
