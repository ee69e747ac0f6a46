"""What an HF ``config.json`` may say for the engine to load the checkpoint: the model types
(``llama``, ``mistral`` without a sliding window, ``qwen2``, ``qwen3``), the keys each may hold, and
the values of those that change the math. Anything else is refused with one line naming the key: a
key the loader does not know may change the model's math (an activation, a sliding window, a bias, a
quantisation), so none is ever ignored.

The architecture sizes and rope keys are read by ``weights.model_config_from_hf``; this module
checks the rest and gives the ``ModelConfig`` fields that tell the model types apart.
"""
from __future__ import annotations

from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# read into ModelConfig by weights.model_config_from_hf (sizes, rope, dtype, EOS)
READ_KEYS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
    "rms_norm_eps", "tie_word_embeddings", "torch_dtype", "dtype", "eos_token_id", "head_dim"})

# keys that do not change a forward pass: bookkeeping, special token ids, training-only settings
# (dropout, initialisation, pretraining_tp's sliced matmuls that sum to the same product) and the
# generation defaults older configs carry (requests bring their own sampling parameters)
INERT_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "bos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "initializer_range", "use_cache", "attention_dropout",
    "pretraining_tp", "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_bfloat16", "tf_legacy_loss", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size", "chunk_size_feed_forward",
    "pruned_heads", "problem_type", "id2label", "label2id", "prefix", "task_specific_params",
    "finetuning_task", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "is_llama_config", "transformers.js_config"})      # nanotron's marker (SmolLM2); transformers.js' export hints

_SLIDING = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
# keys that change the math, per model type; their values are checked below
_CHECKED = {
    "llama": frozenset({"hidden_act", "attention_bias", "mlp_bias", "sliding_window", "rope_interleaved"}),
    "mistral": frozenset({"hidden_act", "sliding_window"}),       # Llama's math when sliding_window is null
    "qwen2": frozenset({"hidden_act", "use_mrope"}) | _SLIDING,
    "qwen3": frozenset({"hidden_act", "attention_bias", "use_mrope"}) | _SLIDING,
}
_SILU = ("silu", "swish")          # the same function in transformers' ACT2FN


def _refuse(text: str) -> ValueError:
    return ValueError(f"weights_path: config.json {text}")


def _sliding_layers(hf: dict[str, Any]) -> int:
    """How many layers use sliding-window attention, as transformers decides it for Qwen2/Qwen3:
    ``layer_types`` when given, else layers from ``max_window_layers`` on when
    ``use_sliding_window`` is set and ``sliding_window`` is not null."""
    types = hf.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in ("full_attention", "sliding_attention") for t in types):
            raise _refuse(f"layer_types={types!r} is not supported (full_attention / sliding_attention)")
        return sum(t == "sliding_attention" for t in types)
    if not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
        return 0
    layers = int(hf.get("num_hidden_layers") or 0)
    return max(0, layers - int(hf.get("max_window_layers") or 0))


def check_hf_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields that tell the model type apart (``qkv_bias``, ``qk_norm``,
    ``head_size``), after refusing (ValueError, one line naming the key) every key that is unknown
    or set to something the engine does not compute."""
    mtype = hf.get("model_type") or "llama"
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise _refuse(f"model_type {mtype!r} is not supported ({', '.join(SUPPORTED_MODEL_TYPES)})")
    checked = _CHECKED[mtype]
    for key in hf:
        if not (key.startswith("_") or key in READ_KEYS or key in INERT_KEYS or key in checked):
            raise _refuse(f"key {key!r} is not known to the {mtype} loader (it may change the model's "
                          f"math, so it is not ignored)")
    act = hf.get("hidden_act", "silu")
    if act not in _SILU:
        raise _refuse(f"hidden_act={act!r} is not supported (silu only)")
    for key in ("attention_bias", "mlp_bias"):
        if key in checked and hf.get(key):
            raise _refuse(f"{key}=true is not supported ({mtype} without {key.split('_')[0]} biases only)")
    if hf.get("use_mrope"):              # Qwen2.5 text configs say false; true is the VL models' 3-D rope
        raise _refuse("use_mrope=true (multimodal rope) is not supported")
    if hf.get("rope_interleaved"):       # nanotron's flag (SmolLM2 says false): rotary on adjacent pairs
        raise _refuse("rope_interleaved=true is not supported (rotary on the two halves of each head only)")
    if mtype in ("llama", "mistral") and hf.get("sliding_window") is not None:
        raise _refuse(f"sliding_window={hf['sliding_window']!r} (sliding-window attention, e.g. a Mistral "
                      f"checkpoint) is not supported")
    if mtype in ("qwen2", "qwen3"):
        n = _sliding_layers(hf)
        if n:
            raise _refuse(f"sliding-window attention (sliding_window={hf.get('sliding_window')!r} in {n} "
                          f"layer(s), from use_sliding_window / max_window_layers / layer_types) is not "
                          f"supported")
    out: dict[str, Any] = {"qkv_bias": mtype == "qwen2", "qk_norm": mtype == "qwen3", "head_size": 0}
    head_dim = hf.get("head_dim")
    if head_dim is not None:
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1:
            raise _refuse(f"head_dim={head_dim!r} is not a positive integer")
        out["head_size"] = head_dim
    return out


def hf_model_type(qkv_bias: bool, qk_norm: bool) -> tuple[str, str]:
    """``(model_type, architecture)`` of HF's class for these ModelConfig flags (ValueError when
    no HF model type has both)."""
    if qkv_bias and qk_norm:
        raise ValueError("qkv_bias with qk_norm: no HF model type has both")
    if qkv_bias:
        return "qwen2", "Qwen2ForCausalLM"
    if qk_norm:
        return "qwen3", "Qwen3ForCausalLM"
    return "llama", "LlamaForCausalLM"
