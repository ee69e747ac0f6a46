"""Weights: safetensors round trip (HF-Llama layout), config.json, errors, TP sharding over gloo."""
from __future__ import annotations

import json
import socket

import pytest
import torch

from srtscope.engine.config import EngineConfig, ModelConfig
from srtscope.engine.model.weights import model_config_from_hf, random_state_dict, read_safetensors, save_checkpoint
from srtscope.engine.runner.tp_worker import TpModelWorker
from tests.engine.worker_helpers import MiniBatcher, tp_rank_main

PROMPTS = {0: list(range(5, 30)), 1: list(range(60, 67))}


def _logits(worker: TpModelWorker) -> torch.Tensor:
    return worker.forward_batch_generation(MiniBatcher(4, 2048).extend(PROMPTS)).logits


def test_safetensors_round_trip(tmp_path):
    mc = ModelConfig(seed=7)
    save_checkpoint(str(tmp_path), mc)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["num_hidden_layers"] == mc.num_layers and hf["num_key_value_heads"] == mc.num_kv_heads
    sd = read_safetensors(str(tmp_path))
    assert "model.layers.0.self_attn.q_proj.weight" in sd and "lm_head.weight" in sd
    random_w = TpModelWorker(EngineConfig(model=mc, device="cpu", max_total_tokens=512))
    loaded_w = TpModelWorker(EngineConfig(model=ModelConfig(seed=999, weights_path=str(tmp_path)),
                                          device="cpu", max_total_tokens=512))
    torch.testing.assert_close(_logits(loaded_w), _logits(random_w), atol=0, rtol=0)


def test_config_json_sets_the_architecture(tmp_path):
    mc = ModelConfig(hidden_size=64, intermediate_size=96, num_layers=3, num_heads=8, num_kv_heads=4,
                     vocab_size=300, seed=2)
    save_checkpoint(str(tmp_path), mc)
    got = model_config_from_hf(str(tmp_path), ModelConfig())
    assert (got.hidden_size, got.num_layers, got.num_heads, got.num_kv_heads, got.vocab_size) == \
        (64, 3, 8, 4, 300)
    w = TpModelWorker(EngineConfig(model=ModelConfig(weights_path=str(tmp_path)), device="cpu",
                                   max_total_tokens=256))
    assert w.model_config.num_layers == 3 and w.kv_pool.num_layers == 3
    assert _logits(w).shape == (2, 300)


def test_bad_checkpoints(tmp_path):
    mc = ModelConfig()
    sd = random_state_dict(mc)
    del sd["model.norm.weight"]
    save_checkpoint(str(tmp_path / "missing"), mc, sd)
    with pytest.raises(ValueError, match="model.norm.weight"):
        TpModelWorker(EngineConfig(model=ModelConfig(weights_path=str(tmp_path / "missing")),
                                   device="cpu", max_total_tokens=64))
    sd = random_state_dict(mc)
    sd["model.layers.9.mlp.extra.weight"] = torch.zeros(2)
    save_checkpoint(str(tmp_path / "extra"), mc, sd)
    with pytest.raises(ValueError, match="unexpected"):
        TpModelWorker(EngineConfig(model=ModelConfig(weights_path=str(tmp_path / "extra")),
                                   device="cpu", max_total_tokens=64))
    with pytest.raises(ValueError, match="weights_path"):
        TpModelWorker(EngineConfig(model=ModelConfig(weights_path=str(tmp_path / "nowhere")),
                                   device="cpu", max_total_tokens=64))


def test_half_precision_checkpoint_loads(tmp_path):
    mc = ModelConfig(seed=1)
    save_checkpoint(str(tmp_path), mc, dtype=torch.bfloat16)
    w = TpModelWorker(EngineConfig(model=ModelConfig(weights_path=str(tmp_path), dtype="bfloat16"),
                                   device="cpu", max_total_tokens=128))
    assert w.model_runner.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.isfinite(_logits(w)).all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("arch", [{}, {"qkv_bias": True}, {"qk_norm": True, "head_size": 48}],
                         ids=["llama", "qwen2-biases", "qwen3-norms-head_dim"])
def test_tp2_over_gloo_matches_tp1(tmp_path, arch):
    """Each rank loads its shards of a saved checkpoint (q/k/v biases sharded with their rows, q/k
    norms whole on every rank); logits equal the unsharded model's."""
    import torch.multiprocessing as mp

    save_checkpoint(str(tmp_path), ModelConfig(seed=5, **arch))
    kw = dict(max_total_tokens=512, model=ModelConfig(weights_path=str(tmp_path)))
    ref_w = TpModelWorker(EngineConfig(device="cpu", max_total_tokens=512, model=ModelConfig(seed=5, **arch)))
    mb = MiniBatcher(8, 2048)
    res = ref_w.forward_batch_generation(mb.extend(PROMPTS))
    ref = [res.logits]
    for _ in range(3):
        res = ref_w.forward_batch_generation(
            mb.decode({r: int(t) for r, t in zip(PROMPTS, res.next_token_ids.tolist())}))
        ref.append(res.logits)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=tp_rank_main, args=(r, 2, port, kw, PROMPTS, 3, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (lg, comm)) for r, lg, comm in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in (0, 1):
        logits, comm = got[r]
        for a, b in zip(logits, ref):
            torch.testing.assert_close(torch.from_numpy(a), b, atol=1e-4, rtol=0)
        assert comm, "tp=2 emits comm.all_reduce ranges"
        assert all(attrs["bytes"] >= 0 and attrs["dtype"] == "float32" for _, attrs in comm)
