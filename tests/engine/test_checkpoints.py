"""Loading a real checkpoint faithfully: vocab, rope (top level, ``rope_parameters``, llama3 scaling or a
clear refusal), dtype and EOS from the checkpoint; request intake (bad ids, duplicate rids, tensor
prompts, stop strings). Checkpoints are made in the test (HF-Llama layout, as test_weights does).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from srtscope.engine.config import EngineConfig, ModelConfig, RopeScaling
from srtscope.engine.engine import Engine
from srtscope.engine.model.rotary import inv_frequencies
from srtscope.engine.model.weights import random_state_dict, save_checkpoint
from srtscope.engine.request import FinishKind, Req, SamplingParams
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.tokenizer import ByteTokenizer
from tests.engine.worker_helpers import MiniBatcher, reference_logits

pytestmark = pytest.mark.usefixtures("probes_off")

PROMPT = [5, 77, 190, 33, 12, 250, 41, 9, 100, 64, 3, 17]
ATOL = 2e-4


def _cfg(path, **kw) -> EngineConfig:
    return EngineConfig(model=ModelConfig(weights_path=str(path), **kw.pop("model", {})), device="cpu",
                        max_total_tokens=512, context_length=256, enable_probes=False, **kw)


def _checkpoint(path, mc: ModelConfig, edit=None, **save_kw):
    """Save ``mc``'s random weights; ``edit(config_dict)`` rewrites config.json afterwards."""
    save_checkpoint(str(path), mc, **save_kw)
    if edit is not None:
        f = path / "config.json"
        d = json.loads(f.read_text())
        edit(d)
        f.write_text(json.dumps(d))
    return path


def _last_logits(worker: TpModelWorker, ids=PROMPT) -> torch.Tensor:
    return worker.forward_batch_generation(MiniBatcher(2, 256).extend({0: ids})).logits[0]


# -- vocab -------------------------------------------------------------------------------------
def test_prompt_ids_checked_against_the_checkpoints_vocab(tmp_path):
    _checkpoint(tmp_path / "v512", ModelConfig(vocab_size=512, seed=3))
    with Engine(_cfg(tmp_path / "v512")) as eng:
        out = eng.generate([[511, 3, 400]], {"max_new_tokens": 2})[0]
        assert out.error is None and len(out.output_ids) == 2
    _checkpoint(tmp_path / "v300", ModelConfig(vocab_size=300, seed=3))
    with Engine(_cfg(tmp_path / "v300")) as eng:
        outs = eng.generate([[1, 2, 3], [1, 310, 2], [4, 5]], {"max_new_tokens": 3}, on_error="return")
        assert outs[1].error is not None and outs[1].error.startswith("prompt: token ids must be in [0, 300)")
        assert [len(outs[0].output_ids), len(outs[2].output_ids)] == [3, 3]
        with pytest.raises(ValueError, match="^request 0: prompt: "):
            eng.generate([[310]])
        assert len(eng.generate([[7, 8]], {"max_new_tokens": 2})[0].output_ids) == 2   # still serving
        eng.check_invariants()


# -- rope ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["top_level", "rope_parameters"])
def test_rope_theta_is_honoured(tmp_path, layout):
    mc = ModelConfig(rope_theta=500_000.0, seed=11)

    def edit(d):
        if layout == "rope_parameters":         # transformers >= 5
            d.pop("rope_theta")
            d["rope_parameters"] = {"rope_type": "default", "rope_theta": 500_000.0}

    _checkpoint(tmp_path, mc, edit)
    w = TpModelWorker(_cfg(tmp_path))
    assert w.model_config.rope_theta == 500_000.0
    sd = random_state_dict(mc)
    got = _last_logits(w)
    torch.testing.assert_close(got, reference_logits(sd, mc, PROMPT)[-1], atol=ATOL, rtol=0)
    wrong = reference_logits(sd, ModelConfig(seed=11), PROMPT)[-1]       # theta 10000
    assert (got - wrong).abs().max() > 100 * ATOL


def _hf_llama3_inv_freq(head_dim, theta, factor, low, high, old):
    """transformers' _compute_llama3_parameters, transcribed."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    low_wl, high_wl = old / low, old / high
    wl = 2 * math.pi / inv
    llama = torch.where(wl > low_wl, inv / factor, inv)
    smooth = (old / wl - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wl < high_wl) * ~(wl > low_wl)
    return torch.where(medium, smoothed, llama)


@pytest.mark.parametrize("layout", ["rope_scaling", "rope_parameters"])
def test_llama3_rope_scaling_is_honoured(tmp_path, layout):
    mc = ModelConfig(rope_theta=50_000.0, seed=12)
    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}

    def edit(d):
        if layout == "rope_parameters":
            d.pop("rope_theta")
            d["rope_parameters"] = {**params, "rope_theta": 50_000.0}
        else:
            d["rope_scaling"] = params

    _checkpoint(tmp_path, mc, edit)
    w = TpModelWorker(_cfg(tmp_path))
    assert w.model_config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    want = _hf_llama3_inv_freq(mc.head_dim, 50_000.0, 8.0, 1.0, 4.0, 64)
    plain = inv_frequencies(mc.head_dim, 50_000.0)
    assert not torch.equal(want, plain)                  # scaled, smoothed and kept bands all occur
    torch.testing.assert_close(inv_frequencies(mc.head_dim, 50_000.0, w.model_config.rope_scaling), want,
                               atol=0, rtol=1e-12)
    sd = random_state_dict(mc)
    got = _last_logits(w)
    torch.testing.assert_close(got, reference_logits(sd, mc, PROMPT, inv_freq=want)[-1], atol=ATOL, rtol=0)
    assert (got - reference_logits(sd, mc, PROMPT)[-1]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("rope, match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling\.rope_type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling\.rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"rope_parameters\.partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     r"rope_parameters\.low_freq_factor is missing"),
])
def test_unsupported_rope_is_refused_naming_the_key(tmp_path, rope, match):
    _checkpoint(tmp_path, ModelConfig(), lambda d: d.update(rope))
    with pytest.raises(ValueError, match=match):
        TpModelWorker(_cfg(tmp_path))


# -- dtype ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_config_dtype_is_read(tmp_path, key):
    def edit(d):
        d.pop("torch_dtype")
        d[key] = "bfloat16"

    _checkpoint(tmp_path, ModelConfig(seed=1), edit, dtype=torch.bfloat16)
    w = TpModelWorker(_cfg(tmp_path))
    assert w.model_config.dtype == "bfloat16"
    assert w.model_runner.model.embed_tokens.weight.dtype == torch.bfloat16
    assert w.kv_pool.dtype == torch.bfloat16
    explicit = TpModelWorker(_cfg(tmp_path, model={"dtype": "float32"}))   # an explicit dtype wins
    assert explicit.model_runner.model.embed_tokens.weight.dtype == torch.float32


def test_bf16_checkpoint_matches_the_reference_in_bf16_precision(tmp_path):
    mc = ModelConfig(seed=4)
    _checkpoint(tmp_path, mc, dtype=torch.bfloat16)
    w = TpModelWorker(_cfg(tmp_path))
    sd = {k: v.to(torch.bfloat16).float() for k, v in random_state_dict(mc).items()}
    ref = reference_logits(sd, mc, PROMPT)[-1]
    assert w.model_runner.model.embed_tokens.weight.dtype == torch.bfloat16     # from config.json
    got = _last_logits(w)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.1 * ref.std()     # bf16 activations: close, not exact
    assert int(got.argmax()) == int(ref.argmax())


# -- eos ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["config", "generation_config"])
def test_eos_from_the_checkpoint(tmp_path, where):
    mc = ModelConfig(seed=6)
    _checkpoint(tmp_path / "plain", mc)
    with Engine(_cfg(tmp_path / "plain")) as eng:
        free = eng.generate([PROMPT], {"max_new_tokens": 8})[0].output_ids
    eos = next(t for t in free[2:] if t != 257)
    cut = free.index(eos) + 1

    def edit(d):
        if where == "config":
            d["eos_token_id"] = eos
        else:
            d["eos_token_id"] = 1          # generation_config.json wins, as in HF generate()
            (tmp_path / "ckpt" / "generation_config.json").write_text(
                json.dumps({"eos_token_id": [2, eos]}))

    _checkpoint(tmp_path / "ckpt", mc, edit)
    with Engine(_cfg(tmp_path / "ckpt")) as eng:
        out = eng.generate([PROMPT], {"max_new_tokens": 8})[0]
        assert out.finish_reason == {"type": "eos", "matched": eos, "message": ""}
        assert out.output_ids == free[:cut]
        ignored = eng.generate([PROMPT], {"max_new_tokens": 8, "ignore_eos": True})[0]
        assert ignored.output_ids == free


# -- stop strings ---------------------------------------------------------------------------------
def test_multibyte_stop_string_with_the_byte_tokenizer():
    stop = "😀😀😀"                                   # 3 characters, 12 bytes
    req = Req([1, 2], SamplingParams(max_new_tokens=64, stop=(stop,)))
    tok = ByteTokenizer()
    done = [req.append_token(b, tok) for b in b"ab " + stop.encode()]
    assert done[-1] and not any(done[:-1])
    assert req.finished_reason.kind is FinishKind.STOP_STR and req.finished_reason.matched == stop
    assert req.output_text(tok) == "ab "
    kept = Req([1, 2], SamplingParams(max_new_tokens=64, stop=(stop,), no_stop_trim=True))
    for b in "é".encode() + stop.encode():
        kept.append_token(b, tok)
    assert kept.finished and kept.output_text(tok) == "é" + stop


@pytest.fixture(scope="module")
def eng():
    e = Engine(EngineConfig(device="cpu", max_total_tokens=1024, context_length=256, enable_probes=False))
    yield e
    e.close()


def test_stop_string_trimmed_by_default(eng):
    prompts = [f"prompt {i}" for i in range(16)]
    frees = eng.generate(prompts, {"max_new_tokens": 24})
    i, k = next((i, k) for i, o in enumerate(frees) for k, t in enumerate(o.output_ids)
                if 32 < t < 127 and k > 0)
    free, prompt = frees[i], prompts[i]
    stop = chr(free.output_ids[k])
    cut = free.output_ids.index(ord(stop))
    out = eng.generate([prompt], {"max_new_tokens": 24, "stop": [stop]})[0]
    assert out.output_ids == free.output_ids[:cut + 1]          # the ids keep the stop token
    assert out.text == ByteTokenizer().decode(free.output_ids[:cut]) and stop not in out.text[-1:]
    kept = eng.generate([prompt], {"max_new_tokens": 24, "stop": [stop], "no_stop_trim": True})[0]
    assert kept.text.endswith(stop)


# -- intake ---------------------------------------------------------------------------------------
def test_duplicate_rid_rejected_while_queued_or_running(eng):
    eng.submit("first", {"max_new_tokens": 3}, rid="x")
    with pytest.raises(ValueError, match="^rid: duplicate"):
        eng.submit("second", {"max_new_tokens": 3}, rid="x")
    eng.step()                                                   # now running
    with pytest.raises(ValueError, match="^rid: duplicate"):
        eng.submit("second", {"max_new_tokens": 3}, rid="x")
    eng.run_until_idle()
    eng.scheduler.take_finished()
    eng.submit("again", {"max_new_tokens": 2}, rid="x")           # finished: the rid is free again
    eng.run_until_idle()
    eng.scheduler.take_finished()
    eng.check_invariants()


def test_tensor_and_array_prompts(eng):
    ids = [72, 101, 108, 108, 111]
    want = eng.generate(ids, {"max_new_tokens": 4})[0].output_ids
    for p in (torch.tensor(ids), np.array(ids), [np.int64(t) for t in ids], tuple(ids)):
        outs = eng.generate(p, {"max_new_tokens": 4})
        assert len(outs) == 1 and outs[0].output_ids == want, type(p)
    two = eng.generate(torch.tensor([ids, ids]), {"max_new_tokens": 4})
    assert [o.output_ids for o in two] == [want, want]
    with pytest.raises(ValueError, match="prompt: token ids must be ints"):
        eng.generate(torch.tensor([1.5, 2.0]))


def test_tp_size_above_one_without_ranks_raises():
    with pytest.raises(ValueError, match="^tp_size: .*tp_launch"):
        Engine(EngineConfig(device="cpu", tp_size=2, enable_probes=False))


# -- HF transformers parity (when transformers is installed) --------------------------------------
@pytest.mark.parametrize("kind", ["rope_parameters", "bf16"])
def test_greedy_tokens_match_hf_transformers(tmp_path, kind):
    transformers = pytest.importorskip("transformers")
    if kind == "rope_parameters" and int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("rope_parameters is the transformers >= 5 config format")
    if kind == "rope_parameters":
        mc = ModelConfig(rope_theta=500_000.0, seed=21)

        def edit(d):
            d.pop("rope_theta")
            d["rope_parameters"] = {"rope_type": "default", "rope_theta": 500_000.0}

        _checkpoint(tmp_path, mc, edit)
        dtype = torch.float32
    else:
        mc = ModelConfig(seed=22)
        _checkpoint(tmp_path, mc, dtype=torch.bfloat16)
        dtype = torch.bfloat16
    steps = 8
    with Engine(_cfg(tmp_path)) as eng:
        assert eng.worker.model_config.dtype == str(dtype).replace("torch.", "")
        got = eng.generate([PROMPT], {"max_new_tokens": steps, "ignore_eos": True})[0].output_ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=dtype,
                                                           attn_implementation="eager").eval()
    assert hf.dtype == dtype
    ids = torch.tensor([PROMPT])
    want = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = hf(ids).logits[0, -1].float().argmax()
            want.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert got == want
