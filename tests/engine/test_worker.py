"""TpModelWorker contract, probes, KV pool, tokenizers."""
from __future__ import annotations

import json

import pytest
import torch

from srtscope.engine.config import BOS_ID, EOS_ID, EngineConfig, ModelConfig
from srtscope.engine.mem.kv_pool import KVPool
from srtscope.engine.runner.sampler import make_sampling_info
from srtscope.engine.runner.tp_worker import GenerationBatchResult, TpModelWorker
from srtscope.engine.tokenizer import ByteTokenizer, get_tokenizer
from srtscope.probes import ranges
from srtscope.probes import recorder as rec
from tests.engine.worker_helpers import MiniBatcher


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(EngineConfig(device="cpu", max_total_tokens=1000))


def test_contract_attributes(worker):
    assert worker.device == torch.device("cpu")
    assert isinstance(worker.kv_pool, KVPool) and worker.kv_pool.size == 1001
    mc = worker.model_config
    assert len(worker.kv_pool.k_buffer) == mc.num_layers
    assert worker.kv_pool.k_buffer[0].shape == (1001, mc.num_kv_heads, mc.head_dim)
    assert worker.tokenizer.eos_token_id == EOS_ID
    assert worker.attention_backend == "torch_native"


def test_result_shapes_and_sampling(worker):
    mb = MiniBatcher(4, 2048)
    info = make_sampling_info([0.0, 0.8], top_ks=[-1, 20], seeds=[None, 3], output_lens=[0, 0])
    res = worker.forward_batch_generation(mb.extend({0: [1, 2, 3], 1: [4, 5]}, sampling=info))
    assert isinstance(res, GenerationBatchResult)
    assert res.next_token_ids.shape == (2,) and res.next_token_ids.dtype == torch.int64
    assert res.logits.shape == (2, worker.model_config.vocab_size)
    assert res.next_token_ids[0] == res.logits[0].argmax()
    assert res.padded_bs == 2


def test_probes(worker):
    rec._DEFAULT.clear()
    ranges.enable(nvtx=False)
    try:
        mb = MiniBatcher(4, 2048)
        res = worker.forward_batch_generation(mb.extend({0: [1, 2, 3]}))
        worker.forward_batch_generation(mb.decode({0: int(res.next_token_ids[0])}))
    finally:
        ranges.disable()
    spans = rec._DEFAULT.raw_spans()
    names = [s[0] for s in spans]
    assert names.count("prep.batch") == 2 and names.count("run.eager") == 2
    assert names.count("run.sample") == 2
    assert "comm.all_reduce" not in names   # tp_size == 1: no collective at all
    for s in spans:
        if s[0] == "run.eager":
            assert s[5]["reason"] == "no_cuda" and s[5]["bs"] == 1
        if s[0] == "prep.batch":
            assert s[5]["part"] == "attn"


def test_kv_pool_validation():
    with pytest.raises(ValueError, match="size"):
        KVPool(1, 1, 1, 4, "float32", "cpu")
    with pytest.raises(ValueError, match="dtype"):
        KVPool(4, 1, 1, 4, "int8", "cpu")
    p = KVPool(4, 2, 1, 2, "float32", "cpu")
    p.set_kv(1, torch.tensor([2, 3]), torch.ones(2, 1, 2), torch.full((2, 1, 2), 2.0))
    assert p.k_buffer[1][2:].eq(1).all() and p.v_buffer[1][2:].eq(2).all()
    assert p.k_buffer[0].eq(0).all() and p.k_buffer[1][:2].eq(0).all()


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer(ModelConfig())
    assert isinstance(tok, ByteTokenizer)
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (BOS_ID, EOS_ID, 259)
    for text in ["hello", "", "héllo wörld — 你好 🙂", "\x00\n\t"]:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text
    assert tok.decode([104, 105, EOS_ID, 300, BOS_ID]) == "hi"
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"   # a cut UTF-8 sequence is replaced
    with pytest.raises(ValueError, match="vocab_size"):
        get_tokenizer(ModelConfig(vocab_size=200))


def test_hf_tokenizer_folder(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "!": 5}
    t = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens(["<s>", "</s>"])
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tok = get_tokenizer(ModelConfig(tokenizer_path=str(tmp_path)))
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 6)
    assert tok.encode("hello world !") == [3, 4, 5]
    assert tok.decode([1, 3, 4, 2]) == "hello world"
    assert tok.decode([3, 300, 4]) == "hello world"   # ids past the tokenizer's vocab are dropped
    with pytest.raises(ValueError, match="tokenizer_path"):
        get_tokenizer(ModelConfig(tokenizer_path=str(tmp_path / "nope")))


def test_tp1_touches_no_torch_distributed(worker):
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    assert worker.tp.size == 1 and not worker.tp.enabled
    x = torch.ones(3)
    assert worker.tp.all_reduce(x) is x and worker.tp.all_gather_last_dim(x) is x


def test_one_device_timer_for_runner_and_collectives(worker, monkeypatch):
    """The runner's run ranges and the TP collectives share the worker's ``DeviceTimer``; on the CPU
    it is off (no event, no ``device_ns``); with (stand-in) CUDA events the run range gets
    ``device_ns`` once resolved, under the attribute names traces have always carried."""
    from tests.probes.test_nvml_and_timer import _FakeEvent

    mr = worker.model_runner
    assert mr.timer is worker.tp.timer and not mr.timer.enabled
    rec._DEFAULT.clear()
    ranges.enable(nvtx=False)
    try:
        mb = MiniBatcher(4, 2048)
        worker.forward_batch_generation(mb.extend({0: [1, 2, 3]}))
        assert mr.timer.pending == 0
        monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
        monkeypatch.setattr(mr.timer, "enabled", True)
        monkeypatch.setattr(mr, "_timed", True)
        monkeypatch.setattr(_FakeEvent, "lazy", True)
        worker.forward_batch_generation(mb.decode({0: 4}))
        assert mr.timer.pending == 1
        worker.resolve_device_times(synchronize=True)
        assert mr.timer.pending == 0
    finally:
        ranges.disable()
    runs = [s[5] for s in rec._DEFAULT.raw_spans() if s[0] == "run.eager"]
    rec._DEFAULT.clear()
    assert "device_ns" not in runs[0]
    assert set(runs[1]) == {"bs", "reason", "device_ns"} and runs[1]["device_ns"] > 0
