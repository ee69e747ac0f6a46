"""Workload generators and the runner's report (FakeWorker: fast, checks every KV slot)."""
from __future__ import annotations

import dataclasses
import hashlib
import pickle

import pytest

from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.workloads import make_workload, run_workload
from tests.engine.sched_helpers import FakeWorker

CFG = EngineConfig(device="cpu", max_total_tokens=3000, max_running_requests=16,
                   context_length=1024, chunked_prefill_size=64, enable_probes=False)

SMALL = {
    "shared-prefix": dict(num_requests=12, system_len=64, user_len=(4, 12), max_new_tokens=5),
    "multi-turn": dict(num_sessions=3, turns=3, system_len=16, user_len=(2, 6), max_new_tokens=4),
    "agent-tree": dict(num_roots=2, depth=2, branching=2, root_len=24, max_new_tokens=3),
    "random": dict(num_requests=20, prompt_len=(1, 80), output_len=(1, 9)),
}
EXPECTED_REQUESTS = {"shared-prefix": 12, "multi-turn": 9, "agent-tree": 2 * (1 + 2 + 4),
                     "random": 20}


def engine(**kw) -> Engine:
    cfg = dataclasses.replace(CFG, **kw)
    return Engine(cfg, worker=FakeWorker(cfg))


@pytest.mark.parametrize("name", list(SMALL))
def test_workload_runs_to_completion_with_a_report(name):
    with engine() as eng:
        rep = run_workload(eng, make_workload(name, **SMALL[name]))
        eng.check_invariants()
    assert rep.num_requests == EXPECTED_REQUESTS[name]
    assert rep.output_tokens == sum(len(o) for o in rep.outputs.values()) > 0
    assert rep.output_tok_per_s > 0 and rep.ttft_ms_p50 > 0 and rep.itl_ms_p50 >= 0
    assert rep.ttft_ms_p50 <= rep.ttft_ms_p99
    assert 0.0 <= rep.cache_hit_rate <= 1.0


@pytest.mark.parametrize("name, floor", [("shared-prefix", 0.5), ("multi-turn", 0.3),
                                         ("agent-tree", 0.5)])
def test_prefix_heavy_workloads_hit_the_cache(name, floor):
    with engine() as eng:
        hit = run_workload(eng, make_workload(name, **SMALL[name]))
    with engine(disable_radix_cache=True) as eng:
        miss = run_workload(eng, make_workload(name, **SMALL[name]))
    assert hit.cache_hit_rate > floor and miss.cache_hit_rate == 0
    assert hit.prefill_tokens < miss.prefill_tokens
    assert hit.outputs == miss.outputs


def test_overlap_runner_gives_the_same_outputs():
    spec = make_workload("multi-turn", **SMALL["multi-turn"])
    with engine() as eng:
        normal = run_workload(eng, spec)
    spec = make_workload("multi-turn", **SMALL["multi-turn"])
    with engine(enable_overlap=True) as eng:
        overlap = run_workload(eng, spec)
        eng.check_invariants()
    assert overlap.outputs == normal.outputs


def test_unknown_workload_is_named():
    with pytest.raises(ValueError, match="^workload: unknown workload 'zipf'"):
        make_workload("zipf")


def _expand(workload) -> list[tuple]:
    """Every request the workload makes, breadth first, with a reply derived from each prompt."""
    rows, queue = [], list(workload.items)
    while queue:
        it = queue.pop(0)
        rows.append((it.tag, tuple(it.prompt_ids), it.params.max_new_tokens, it.arrival_s))
        if it.followups is not None:
            reply = [(sum(it.prompt_ids) + 7 * k) % 256 for k in range(it.params.max_new_tokens)]
            queue.extend(it.followups(it, reply))
    return rows


# digests of the requests the closure-based generators made (before follow-ups became picklable)
PINNED = [
    ("multi-turn", {}, 32, "740f7dae54d63a5d"),
    ("multi-turn", dict(num_sessions=3, turns=3, system_len=16, user_len=(2, 6), max_new_tokens=4,
                        seed=5), 9, "eda1613273bdeb28"),
    ("agent-tree", {}, 30, "61916aca4b94c667"),
    ("agent-tree", dict(num_roots=2, depth=2, branching=3, root_len=24, max_new_tokens=3, seed=7),
     26, "1c969e46ddd434a8"),
]


@pytest.mark.parametrize("name, kw, count, digest", PINNED)
def test_followup_workloads_make_the_pinned_requests_and_pickle(name, kw, count, digest):
    wl = make_workload(name, **kw)
    rows = _expand(wl)
    assert len(rows) == count
    assert hashlib.blake2b(repr(rows).encode(), digest_size=8).hexdigest() == digest
    assert _expand(pickle.loads(pickle.dumps(wl))) == rows     # what a spawned rank would get


def test_pickled_followup_workload_runs_the_same():
    spec = make_workload("agent-tree", **SMALL["agent-tree"])
    with engine() as eng:
        want = run_workload(eng, spec)
    with engine() as eng:
        got = run_workload(eng, pickle.loads(pickle.dumps(spec)))
    assert got.outputs == want.outputs and got.num_requests == EXPECTED_REQUESTS["agent-tree"]


@pytest.mark.parametrize("name", list(SMALL))
def test_prompts_and_followups_drawn_from_a_given_vocab(name):
    """``vocab`` (a tokenizer's word ids, ``run --model``): every prompt id, follow-ups' new text
    included, is one of them; the follow-ups pickle (TP ranks get them)."""
    vocab = (1000, 1001, 1002, 1003)
    wl = make_workload(name, vocab=vocab, **SMALL[name])
    assert all(set(it.prompt_ids) <= set(vocab) for it in wl.items)
    follow = [it for it in wl.items if it.followups is not None]
    for it in follow:
        for nxt in it.followups(it, [7, 8]):
            assert nxt.prompt_ids[:len(it.prompt_ids) + 2] == it.prompt_ids + [7, 8]
            assert set(nxt.prompt_ids[len(it.prompt_ids) + 2:]) <= set(vocab)
        assert pickle.loads(pickle.dumps(it.followups)) == it.followups
    assert bool(follow) == (name in ("multi-turn", "agent-tree"))
    plain = make_workload(name, **SMALL[name])          # no vocab: byte ids, as before
    assert all(0 <= t < 256 for it in plain.items for t in it.prompt_ids)


def test_text_vocab_is_the_sample_texts_ids():
    from srtscope.engine.tokenizer import ByteTokenizer
    from srtscope.engine.workloads import SAMPLE_TEXT, text_vocab

    assert text_vocab(ByteTokenizer()) == tuple(sorted(set(SAMPLE_TEXT.encode())))
