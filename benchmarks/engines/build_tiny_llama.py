"""Build a tiny Llama checkpoint offline (no model hub): random weights, hidden 256, 4 layers,
vocab 32,000, and a WordLevel tokenizer (``w0`` .. ``w31999`` plus ``<unk> <s> </s>``).

    python benchmarks/engines/build_tiny_llama.py OUT_DIR [--layers 4] [--hidden 256] [--intermediate 688]

Runs in the rig's vLLM venv (transformers and tokenizers come with vLLM). The weights are random:
the rig measures where time goes, not what the model says.
"""
from __future__ import annotations

import argparse
from pathlib import Path

VOCAB = 32_000
SPECIALS = ("<unk>", "<s>", "</s>")


def build(out: Path, layers: int = 4, hidden: int = 256, intermediate: int = 688) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    words = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(VOCAB - len(SPECIALS)):
        words[f"w{i}"] = i + len(SPECIALS)
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=2048)
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="a tiny random Llama checkpoint, offline")
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256, help="a multiple of 64 (heads of 64)")
    p.add_argument("--intermediate", type=int, default=688)
    a = p.parse_args()
    if a.layers < 1 or a.hidden < 64 or a.hidden % 64 or a.intermediate < 1:
        p.error("--layers >= 1, --hidden a multiple of 64, --intermediate >= 1")
    print(build(a.out, a.layers, a.hidden, a.intermediate))
