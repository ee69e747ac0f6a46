"""Weights: deterministic random initialisation, HF-layout safetensors save/load, TP sharding.

Both paths go through one full (unsharded) HF-named state dict, so a rank's shard of a random model
equals the same rank's shard of that model saved and loaded back. Names (HF ``LlamaForCausalLM``):
``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``, ``model.layers.{i}.input_layernorm.weight``,
``model.layers.{i}.post_attention_layernorm.weight``, ``model.norm.weight``, ``lm_head.weight``
(absent when the embeddings are tied); Qwen2 adds ``self_attn.{q,k,v}_proj.bias``, Qwen3
``self_attn.{q,k}_norm.weight``. Which config.json keys are accepted: ``hf_config``. Reading never
touches the network.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os

import torch

from srtscope.engine.config import DTYPES, ModelConfig, RopeScaling
from srtscope.engine.model.hf_config import check_hf_config, hf_model_type

# ModelConfig field <- HF config.json key
_HF_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "max_position": "max_position_embeddings",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
}


# HF dtype names (config ``torch_dtype`` / ``dtype``) -> ours
_HF_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
              "bfloat16": "bfloat16"}
# keys a rope_scaling / rope_parameters dict may hold, per rope type (others are refused)
_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta"},
              "linear": {"rope_type", "type", "rope_theta", "factor"},
              "llama3": {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}}


def hf_config_dict(cfg: ModelConfig, dtype: str | None = None) -> dict:
    """The HF ``config.json`` of ``cfg`` (transformers < 5 layout: top-level ``rope_theta``)."""
    d = {hf: getattr(cfg, ours) for ours, hf in _HF_KEYS.items()}
    model_type, arch = hf_model_type(cfg.qkv_bias, cfg.qk_norm)
    d.update({"architectures": [arch], "model_type": model_type, "hidden_act": "silu",
              "head_dim": cfg.head_dim,
              "torch_dtype": dtype or (cfg.dtype if cfg.dtype != "auto" else "float32")})
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = dataclasses.asdict(cfg.rope_scaling)
    if cfg.eos_token_ids:
        d["eos_token_id"] = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else cfg.eos_token_ids[0]
    return d


def _rope_from_hf(hf: dict) -> dict:
    """``rope_theta`` / ``rope_scaling`` overrides from an HF config: the top-level ``rope_theta`` and
    ``rope_scaling`` (transformers < 5) or ``rope_parameters`` (>= 5). A rope type or key we do not
    implement is a ValueError naming it — never silently ignored."""
    over: dict = {}
    if hf.get("rope_theta") is not None:
        over["rope_theta"] = float(hf["rope_theta"])
    params, where = hf.get("rope_parameters"), "rope_parameters"
    if params is None:
        params, where = hf.get("rope_scaling"), "rope_scaling"
    if params is None:
        return over
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"weights_path: {where} {params!r} is not supported (one dict of scalars expected)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise ValueError(f"weights_path: {where}.rope_type {rope_type!r} is not supported "
                         f"({', '.join(_ROPE_KEYS)})")
    unknown = sorted(set(params) - _ROPE_KEYS[rope_type])
    if unknown:
        raise ValueError(f"weights_path: {where}.{unknown[0]} is not supported for rope_type {rope_type!r}")
    if params.get("rope_theta") is not None:
        over["rope_theta"] = float(params["rope_theta"])
    if rope_type == "linear" and float(params.get("factor", 1.0)) != 1.0:
        over["rope_scaling"] = RopeScaling("linear", factor=float(params["factor"]))
    elif rope_type == "llama3":
        try:
            over["rope_scaling"] = RopeScaling(
                "llama3", factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]))
        except KeyError as exc:
            raise ValueError(f"weights_path: {where}.{exc.args[0]} is missing (rope_type 'llama3')") from None
    return over


def _eos_ids(value: object) -> tuple[int, ...]:
    ids = value if isinstance(value, list) else [value]
    return tuple(int(t) for t in ids if isinstance(t, int) and not isinstance(t, bool))


def model_config_from_hf(path: str, base: ModelConfig | None = None) -> ModelConfig:
    """``base`` with the architecture fields replaced by the folder's ``config.json`` (ValueError,
    one line naming the key, for what the engine does not compute: ``hf_config.check_hf_config``)."""
    base = base or ModelConfig()
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ValueError(f"weights_path: no config.json in {path!r}")
    try:
        with open(file, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"weights_path: cannot read {file!r}: {exc}") from None
    if not isinstance(hf, dict):
        raise ValueError(f"weights_path: {file!r} is not a JSON object")
    over: dict = check_hf_config(hf)
    for ours, key in _HF_KEYS.items():
        if key in hf and hf[key] is not None and ours != "rope_theta":
            over[ours] = type(getattr(base, ours))(hf[key])
    if "num_kv_heads" not in over and "num_heads" in over:
        over["num_kv_heads"] = over["num_heads"]
    over.update(_rope_from_hf(hf))
    if base.dtype == "auto":      # an explicit dtype wins over the checkpoint's
        name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        if _HF_DTYPES.get(str(name)) not in DTYPES:
            raise ValueError(f"weights_path: config dtype {name!r} is not supported ({', '.join(DTYPES)})")
        over["dtype"] = _HF_DTYPES[str(name)]
    eos = _eos_ids(hf.get("eos_token_id"))
    gen = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen):       # as HF generate(): generation_config.json wins over config.json
        with open(gen, encoding="utf-8") as f:
            eos = _eos_ids(json.load(f).get("eos_token_id")) or eos
    if eos and not base.eos_token_ids:
        over["eos_token_ids"] = eos
    return dataclasses.replace(base, **over)


def random_state_dict(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full HF-named float32 weights drawn from ``cfg.seed`` (same seed, same weights, any TP size).

    Scales keep activations O(1) and logits well separated (std ~2), so greedy argmaxes are not
    near-ties that float reassociation (chunking, batching, TP) could flip.
    """
    g = torch.Generator().manual_seed(int(cfg.seed))
    h, i_sz, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def lin(out_f: int, in_f: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) * (scale / in_f ** 0.5)

    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, h, generator=g)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = lin(cfg.num_heads * hd, h)
        sd[p + "self_attn.k_proj.weight"] = lin(cfg.num_kv_heads * hd, h)
        sd[p + "self_attn.v_proj.weight"] = lin(cfg.num_kv_heads * hd, h)
        if cfg.qkv_bias:
            for n, rows in (("q", cfg.num_heads * hd), ("k", cfg.num_kv_heads * hd), ("v", cfg.num_kv_heads * hd)):
                sd[p + f"self_attn.{n}_proj.bias"] = 0.1 * torch.randn(rows, generator=g)
        if cfg.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = 1.0 + 0.1 * torch.randn(hd, generator=g)
            sd[p + "self_attn.k_norm.weight"] = 1.0 + 0.1 * torch.randn(hd, generator=g)
        sd[p + "self_attn.o_proj.weight"] = lin(h, cfg.num_heads * hd, 0.5)
        sd[p + "mlp.gate_proj.weight"] = lin(i_sz, h)
        sd[p + "mlp.up_proj.weight"] = lin(i_sz, h)
        sd[p + "mlp.down_proj.weight"] = lin(h, i_sz, 0.5)
        sd[p + "input_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
        sd[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    sd["model.norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = lin(cfg.vocab_size, h, 2.0)
    return sd


def save_checkpoint(path: str, cfg: ModelConfig, state_dict: dict[str, torch.Tensor] | None = None,
                    dtype: torch.dtype | None = None) -> str:
    """Write ``config.json`` + ``model.safetensors`` (HF-Llama layout) into ``path``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    sd = state_dict if state_dict is not None else random_state_dict(cfg)
    sd = {k: (v.to(dtype) if dtype is not None else v).contiguous().cpu() for k, v in sd.items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    name = str(dtype).replace("torch.", "") if dtype is not None else None
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config_dict(cfg, name), f, indent=2)
    return path


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of the folder's ``*.safetensors`` files (or of one file)."""
    from safetensors.torch import load_file

    files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"weights_path: no *.safetensors files in {path!r}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(f))
    return sd


def load_into(model, sd: dict[str, torch.Tensor]) -> None:
    """Copy this rank's shards of the full HF-named ``sd`` into ``model`` (a LlamaForCausalLM)."""
    cfg = model.cfg
    sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in sd:
            raise ValueError(f"weights: missing tensor {name!r}")
        used.add(name)
        return sd[name].float()

    with torch.no_grad():
        model.embed_tokens.load_full(take("model.embed_tokens.weight"))
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            at = layer.self_attn
            qkv = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            biases = [take(n.removesuffix("weight") + "bias") for n in qkv] if cfg.qkv_bias else None
            at.qkv_proj.load_full([take(n) for n in qkv], biases, names=qkv)
            if at.q_norm is not None and at.k_norm is not None:
                for norm, n in ((at.q_norm, "q_norm"), (at.k_norm, "k_norm")):
                    w = take(p + f"self_attn.{n}.weight")
                    if tuple(w.shape) != tuple(norm.weight.shape):
                        raise ValueError(f"weights: {p}self_attn.{n}.weight: expected shape "
                                         f"{tuple(norm.weight.shape)}, got {tuple(w.shape)}")
                    norm.weight.copy_(w)
            at.o_proj.load_full(take(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj.weight")
            layer.mlp.gate_up_proj.load_full([take(p + "mlp.gate_proj.weight"),
                                              take(p + "mlp.up_proj.weight")])
            layer.mlp.down_proj.load_full(take(p + "mlp.down_proj.weight"))
            layer.input_layernorm.weight.copy_(take(p + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(take(p + "post_attention_layernorm.weight"))
        model.norm.weight.copy_(take("model.norm.weight"))
        if not cfg.tie_word_embeddings:
            model.lm_head.load_full(take("lm_head.weight"))
        elif "lm_head.weight" in sd:
            used.add("lm_head.weight")
    extra = sorted(set(sd) - used)
    if extra:
        raise ValueError(f"weights: unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}")


def build_model(cfg: ModelConfig, tp=None, device: torch.device | str = "cpu"):
    """A ``LlamaForCausalLM`` for ``cfg`` (random from its seed, or from ``cfg.weights_path``)."""
    from srtscope.engine.mem.kv_pool import resolve_dtype
    from srtscope.engine.model.llama import LlamaForCausalLM

    dtype = resolve_dtype(cfg.dtype)
    model = LlamaForCausalLM(cfg, tp, dtype=dtype, device=device)
    sd = read_safetensors(cfg.weights_path) if cfg.weights_path else random_state_dict(cfg)
    load_into(model, sd)
    model.eval()
    return model
