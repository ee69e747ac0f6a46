"""HF checkpoints of the families users have — Llama (GQA, tied embeddings, llama3 rope, a free
head_dim, bf16), Mistral without a sliding window, Qwen2 (q/k/v biases), Qwen3 (q/k norms, head_dim)
— built by transformers and served by the engine give HF's greedy tokens, token for token; every
config key that changes the math and is not computed is refused with one line naming it.
"""
from __future__ import annotations

import json

import pytest
import torch

from srtscope.engine.config import EngineConfig, ModelConfig
from srtscope.engine.engine import Engine
from srtscope.engine.model.weights import save_checkpoint
from srtscope.engine.runner.tp_worker import TpModelWorker
from tests.engine.hf_helpers import hf_greedy, tiny_hf_checkpoint

pytestmark = pytest.mark.usefixtures("probes_off")

PROMPTS = [[5, 77, 190, 33, 12, 250, 41, 9, 100, 64, 3, 17], [300, 2, 71]]
STEPS = 8
LLAMA3 = {"rope_type": "llama3", "rope_theta": 50_000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _cfg(path) -> EngineConfig:
    return EngineConfig(model=ModelConfig(weights_path=str(path)), device="cpu", max_total_tokens=512,
                        context_length=256, enable_probes=False)


# family, dtype, transformers config, what the engine must read from it
CASES = {
    "llama-gqa-tied-llama3": ("llama", torch.float32,
                              dict(tie_word_embeddings=True, rope_parameters=LLAMA3),
                              dict(tie_word_embeddings=True, num_kv_heads=2)),
    "llama-head_dim-bf16": ("llama", torch.bfloat16, dict(head_dim=32), dict(head_dim=32, dtype="bfloat16")),
    "mistral-no-window-head_dim": ("mistral", torch.float32, dict(head_dim=32, sliding_window=None),
                                   dict(head_dim=32, qkv_bias=False, qk_norm=False)),
    "qwen2-qkv-bias": ("qwen2", torch.float32, dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                       dict(qkv_bias=True, rope_theta=1e6)),
    "qwen3-qk-norm-head_dim": ("qwen3", torch.float32, dict(head_dim=32),
                               dict(qk_norm=True, head_dim=32)),
    "qwen3-bf16": ("qwen3", torch.bfloat16, dict(head_dim=16), dict(qk_norm=True, dtype="bfloat16")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_match_hf_transformers(tmp_path, case):
    pytest.importorskip("transformers")
    family, dtype, hf_kw, want_cfg = CASES[case]
    tiny_hf_checkpoint(tmp_path, family, dtype=dtype, seed=len(case), **hf_kw)
    with Engine(_cfg(tmp_path)) as eng:
        mc = eng.worker.model_config
        for key, value in want_cfg.items():
            assert getattr(mc, key) == value, key
        got = [o.output_ids for o in eng.generate(PROMPTS, {"max_new_tokens": STEPS, "ignore_eos": True})]
    assert got == [hf_greedy(tmp_path, p, STEPS, dtype) for p in PROMPTS]


def _ours(path, edit, mc: ModelConfig | None = None):
    save_checkpoint(str(path), mc or ModelConfig())
    f = path / "config.json"
    d = json.loads(f.read_text())
    edit(d)
    f.write_text(json.dumps(d))
    return path


REFUSED = [   # (config.json edit, the one line's tail)
    (lambda d: d.update(hidden_act="gelu"), r"config\.json hidden_act='gelu' is not supported \(silu only\)"),
    (lambda d: d.update(hidden_act="gelu_pytorch_tanh", model_type="qwen2"), r"hidden_act='gelu_pytorch_tanh'"),
    (lambda d: d.update(sliding_window=4096), r"sliding_window=4096 \(sliding-window attention, e\.g\. a Mistral"),
    (lambda d: d.update(attention_bias=True), r"attention_bias=true is not supported"),
    (lambda d: d.update(mlp_bias=True), r"mlp_bias=true is not supported"),
    (lambda d: d.update(model_type="qwen3", attention_bias=True), r"attention_bias=true"),
    (lambda d: d.update(model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=1),
     r"sliding-window attention \(sliding_window=64 in 1 layer"),
    (lambda d: d.update(model_type="qwen3", layer_types=["full_attention", "sliding_attention"]),
     r"sliding-window attention .* in 1 layer"),
    (lambda d: d.update(model_type="qwen3", layer_types=["full_attention", "chunked_attention"]),
     r"layer_types=.* is not supported"),
    (lambda d: d.update(rope_scaling={"rope_type": "longrope", "factor": 4.0}), r"rope_type 'longrope'"),
    (lambda d: d.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), r"rope_type 'yarn'"),
    (lambda d: d.update(model_type="mistral", sliding_window=4096), r"sliding_window=4096 \(sliding-window"),
    (lambda d: d.update(model_type="phi3"), r"model_type 'phi3' is not supported \(llama, mistral, qwen2, qwen3\)"),
    (lambda d: d.update(model_type="gemma"), r"model_type 'gemma'"),
    (lambda d: d.update(quantization_config={"quant_method": "awq"}), r"key 'quantization_config' is not known"),
    (lambda d: d.update(partial_rotary_factor=0.5), r"key 'partial_rotary_factor'"),
    (lambda d: d.update(use_sliding_window=True), r"key 'use_sliding_window' is not known to the llama"),
    (lambda d: d.update(rope_interleaved=True), r"rope_interleaved=true is not supported"),
]


@pytest.mark.parametrize("edit, match", REFUSED)
def test_unsupported_config_keys_are_refused_naming_them(tmp_path, edit, match):
    _ours(tmp_path, edit)
    with pytest.raises(ValueError, match=r"^weights_path: .*" + match) as exc:
        TpModelWorker(_cfg(tmp_path))
    assert "\n" not in str(exc.value)


def test_inert_and_off_keys_load(tmp_path):
    """Keys that do not change a forward pass, and math keys set to what the engine computes."""
    _ours(tmp_path, lambda d: d.update(
        attention_dropout=0.0, initializer_range=0.02, use_cache=True, pretraining_tp=1, attention_bias=False,
        mlp_bias=False, sliding_window=None, bos_token_id=1, transformers_version="4.44.0",
        _name_or_path="x", hidden_act="silu", is_llama_config=True, rope_interleaved=False))   # as SmolLM2
    assert TpModelWorker(_cfg(tmp_path)).model_config.qkv_bias is False
    _ours(tmp_path, lambda d: d.update(model_type="qwen2", use_sliding_window=False, sliding_window=4096,
                                       max_window_layers=28), ModelConfig(qkv_bias=True))
    assert TpModelWorker(_cfg(tmp_path)).model_config.qkv_bias is True


def test_head_dim_disagreeing_with_the_tensors_names_the_tensor(tmp_path):
    _ours(tmp_path, lambda d: d.update(head_dim=16), ModelConfig(hidden_size=128, num_heads=4, head_size=48))
    with pytest.raises(ValueError, match=r"^weights: 'model\.layers\.0\.self_attn\.q_proj\.weight' expected "
                                         r"shape \(64, 128\), got \(192, 128\)"):
        TpModelWorker(_cfg(tmp_path))


def test_bias_tensors_without_the_setting_are_refused(tmp_path):
    _ours(tmp_path, lambda d: d.update(model_type="llama"), ModelConfig(qkv_bias=True))
    with pytest.raises(ValueError, match=r"unexpected tensors \['model\.layers\.0\.self_attn\.k_proj\.bias'"):
        TpModelWorker(_cfg(tmp_path))


@pytest.mark.parametrize("mc", [ModelConfig(qkv_bias=True, seed=3), ModelConfig(qk_norm=True, head_size=48, seed=4)])
def test_qwen_features_round_trip_and_shard_at_tp1(tmp_path, mc):
    """Random Qwen-shaped weights saved and loaded back give the random model's logits."""
    save_checkpoint(str(tmp_path), mc)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == ("qwen2" if mc.qkv_bias else "qwen3")
    ids = [[5, 6, 7, 8]]
    with Engine(EngineConfig(model=mc, device="cpu", max_total_tokens=256, enable_probes=False)) as a:
        want = a.generate(ids, {"max_new_tokens": 6, "ignore_eos": True})[0].output_ids
    with Engine(_cfg(tmp_path)) as b:
        assert b.generate(ids, {"max_new_tokens": 6, "ignore_eos": True})[0].output_ids == want


# config.json of published small checkpoints, as their model cards' files give them
PUBLISHED = {
    "Llama-3.2-1B": ({"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                      "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
                      "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
                      "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
                      "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
                      "pretraining_tp": 1, "rms_norm_eps": 1e-05,
                      "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                      "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                      "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
                     dict(head_size=64)),
    "SmolLM2-135M": ({"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                      "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
                      "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
                      "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
                      "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
                      "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
                      "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                      "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152},
                     dict(head_size=0)),
    "Qwen2.5-0.5B": ({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
                      "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
                      "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
                      "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
                      "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                      "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                      "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
                      "use_sliding_window": False, "vocab_size": 151936},
                     dict(qkv_bias=True)),
    "Qwen3-0.6B": ({"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
                    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
                    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
                    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
                    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
                    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
                    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
                   dict(qk_norm=True, head_size=128)),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_small_checkpoints_configs_load(tmp_path, name):
    """The configs users' checkpoints have pass the key check and give the architecture."""
    from srtscope.engine.model.weights import model_config_from_hf

    hf, want = PUBLISHED[name]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    mc = model_config_from_hf(str(tmp_path))
    assert (mc.hidden_size, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.vocab_size, mc.dtype) == \
        (hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"], hf["num_key_value_heads"],
         hf["vocab_size"], "bfloat16")
    for key, value in want.items():
        assert getattr(mc, key) == value, key
    hf["use_mrope" if name.startswith("Qwen") else "hidden_act"] = True if name.startswith("Qwen") else "gelu"
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="use_mrope=true" if name.startswith("Qwen") else "hidden_act='gelu'"):
        model_config_from_hf(str(tmp_path))
