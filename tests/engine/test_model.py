"""The engine model against a plain full-sequence causal forward of the same weights."""
from __future__ import annotations

import pytest
import torch

from srtscope.engine.config import EngineConfig, ModelConfig
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.model.weights import random_state_dict
from srtscope.engine.runner.tp_worker import TpModelWorker
from tests.engine.worker_helpers import MiniBatcher, reference_logits

ATOL = 2e-4


def _worker(**model_kw) -> TpModelWorker:
    return TpModelWorker(EngineConfig(model=ModelConfig(**model_kw), device="cpu",
                                      max_total_tokens=4096))


@pytest.fixture(scope="module")
def worker() -> TpModelWorker:
    return _worker()


@pytest.fixture(scope="module")
def sd(worker):
    return random_state_dict(worker.model_config)


def _prompt(seed: int, n: int, vocab: int = 320) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def test_extend_from_empty_equals_reference(worker, sd):
    prompts = [_prompt(1, 23), _prompt(2, 5), _prompt(3, 1), _prompt(4, 40)]
    mb = MiniBatcher(8, worker.config.context_length)
    res = worker.forward_batch_generation(mb.extend(dict(enumerate(prompts))))
    assert res.logits.shape == (4, worker.model_config.vocab_size)
    for i, p in enumerate(prompts):
        ref = reference_logits(sd, worker.model_config, p)
        torch.testing.assert_close(res.logits[i], ref[-1], atol=ATOL, rtol=0)
    assert res.next_token_ids.dtype == torch.int64
    assert torch.equal(res.next_token_ids, res.logits.argmax(-1))   # no sampling info: greedy


def test_two_chunks_equal_one_extend(worker):
    p = _prompt(5, 37)
    one = MiniBatcher(4, worker.config.context_length)
    full = worker.forward_batch_generation(one.extend({0: p})).logits
    two = MiniBatcher(4, worker.config.context_length)
    worker.forward_batch_generation(two.extend({0: p[:20]}))
    second = worker.forward_batch_generation(two.extend({0: p[20:]})).logits
    torch.testing.assert_close(second, full, atol=ATOL, rtol=0)


def test_decode_after_extend_equals_full_forward_each_position(worker, sd):
    prompts = {0: _prompt(6, 9), 3: _prompt(7, 14)}
    mb = MiniBatcher(8, worker.config.context_length)
    res = worker.forward_batch_generation(mb.extend(prompts))
    seqs = {r: list(p) for r, p in prompts.items()}
    for _ in range(6):
        nxt = {r: int(t) for r, t in zip(prompts, res.next_token_ids.tolist())}
        for r, t in nxt.items():
            seqs[r].append(t)
        fb = mb.decode(nxt)
        assert fb.forward_mode == ForwardMode.DECODE
        res = worker.forward_batch_generation(fb)
        for i, r in enumerate(prompts):
            ref = reference_logits(sd, worker.model_config, seqs[r])
            torch.testing.assert_close(res.logits[i], ref[-1], atol=ATOL, rtol=0)


def test_mixed_batch_decode_rows_and_a_prefill_chunk(worker, sd):
    a, b = _prompt(8, 11), _prompt(9, 17)
    mb = MiniBatcher(8, worker.config.context_length)
    worker.forward_batch_generation(mb.extend({0: a}))
    fb = mb.extend({0: [42], 1: b}, mode=ForwardMode.MIXED)
    res = worker.forward_batch_generation(fb)
    torch.testing.assert_close(res.logits[0], reference_logits(sd, worker.model_config, a + [42])[-1],
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(res.logits[1], reference_logits(sd, worker.model_config, b)[-1],
                               atol=ATOL, rtol=0)
    assert res.eager_reason == "no_cuda" and not res.graph_used


def test_shared_prefix_slots_through_req_to_token(worker, sd):
    """Two requests whose rows point at the same cached prefix slots (what a radix hit does)."""
    prefix, s1, s2 = _prompt(10, 16), _prompt(11, 4), _prompt(12, 7)
    mb = MiniBatcher(8, worker.config.context_length)
    worker.forward_batch_generation(mb.extend({0: prefix}))
    mb.req_to_token[1, :16] = mb.req_to_token[0, :16]
    mb.req_to_token[2, :16] = mb.req_to_token[0, :16]
    mb.lens[1] = mb.lens[2] = 16
    res = worker.forward_batch_generation(mb.extend({1: s1, 2: s2}))
    torch.testing.assert_close(res.logits[0], reference_logits(sd, worker.model_config, prefix + s1)[-1],
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(res.logits[1], reference_logits(sd, worker.model_config, prefix + s2)[-1],
                               atol=ATOL, rtol=0)


def test_idle_batch(worker):
    empty = torch.empty(0, dtype=torch.int64)
    from srtscope.engine.forward_batch import ForwardBatch

    fb = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty, empty,
                      torch.zeros(1, 8, dtype=torch.int32), empty)
    res = worker.forward_batch_generation(fb)
    assert res.next_token_ids.shape == (0,)
    assert res.logits.shape == (0, worker.model_config.vocab_size)


def test_random_init_is_deterministic_and_seeded():
    a = random_state_dict(ModelConfig(seed=3))
    b = random_state_dict(ModelConfig(seed=3))
    c = random_state_dict(ModelConfig(seed=4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.parametrize("kw", [dict(num_heads=4, num_kv_heads=4), dict(num_heads=8, num_kv_heads=1,
                                                                       tie_word_embeddings=True)])
def test_other_shapes_match_reference(kw):
    w = _worker(**kw)
    sd = random_state_dict(w.model_config)
    p = _prompt(13, 19)
    mb = MiniBatcher(2, w.config.context_length)
    res = w.forward_batch_generation(mb.extend({0: p}))
    torch.testing.assert_close(res.logits[0], reference_logits(sd, w.model_config, p)[-1],
                               atol=ATOL, rtol=0)


def test_bfloat16_model_runs_and_tracks_float32():
    w32 = _worker()
    w16 = _worker(dtype="bfloat16")
    assert w16.kv_pool.k_buffer[0].dtype == torch.bfloat16
    p = _prompt(14, 12)
    l32 = w32.forward_batch_generation(MiniBatcher(2, 2048).extend({0: p})).logits
    l16 = w16.forward_batch_generation(MiniBatcher(2, 2048).extend({0: p})).logits
    assert l16.dtype == torch.float32
    assert torch.corrcoef(torch.stack([l32[0], l16[0]]))[0, 1] > 0.98
