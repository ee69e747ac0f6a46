"""Tiny random HF checkpoints built with transformers (Llama, Mistral, Qwen2, Qwen3), a tiny word-level
``tokenizer.json`` beside them, and HF's own greedy tokens to compare the engine's with.

Weights are redrawn after transformers' init (its std 0.02 leaves logits in near-ties that float
reassociation can flip): matrices ~ N(0, 1/fan_in), norms 1 + N(0, 0.1), biases N(0, 0.1), so greedy
argmaxes are well separated. Embeddings ~ N(0, 1), or N(0, 0.1) when tied: with large tied
embeddings the last token's own row wins every argmax and a model would repeat it whatever its
layers compute.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

WORDS = ("the a of to and in is it that for on with as was he she they we you at by this from or "
         "but not be are have has had one all were when there can an which their said if do will "
         "each about how up out them then many some so these would other into more her two like him "
         "see time could no make than first been its who now people my made over did down only way "
         "find use may water long little very after words called just where most know").split()

FAMILIES: dict[str, tuple[str, str]] = {       # family -> (config class, model class)
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def tiny_hf_checkpoint(path: Path, family: str, dtype: torch.dtype = torch.float32, seed: int = 0,
                       **config: Any) -> Path:
    """A random ``family`` model of 2 layers x 64 hidden (overridable), saved by transformers'
    ``save_pretrained`` (config.json + model.safetensors) into ``path``."""
    import transformers

    cfg_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    kw: dict[str, Any] = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                              rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    kw.update(config)
    model = model_cls(cfg_cls(**kw)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.1 if model.config.tie_word_embeddings else 1.0))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    model.to(dtype).save_pretrained(str(path))
    return path


def tiny_tokenizer(path: Path, words: Sequence[str] = WORDS, eos: str = "</s>") -> Path:
    """A word-level ``tokenizer.json`` (ids: ``<unk>`` 0, ``eos`` 1, then the distinct ``words``) and
    a ``tokenizer_config.json`` naming the EOS token."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, eos: 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")      # joins words with spaces
    tok.add_special_tokens([eos])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))
    return path


def hf_greedy(path: Path, prompt: list[int], steps: int, dtype: torch.dtype = torch.float32) -> list[int]:
    """``steps`` greedy tokens of the checkpoint at ``path`` run by transformers (eager attention)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype,
                                                           attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = hf(ids).logits[0, -1].float().argmax()
            out.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out
