"""Build a tiny Llama checkpoint offline (no model hub): random weights, hidden 256, 4 layers,
vocab 32,000, and a WordLevel tokenizer (``w0`` .. ``w31999`` plus ``<unk> <s> </s>``).

    python benchmarks/engines/build_tiny_llama.py OUT_DIR

Runs in the rig's vLLM venv (transformers and tokenizers come with vLLM). The weights are random:
the rig measures where time goes, not what the model says.
"""
from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 32_000
SPECIALS = ("<unk>", "<s>", "</s>")


def build(out: Path) -> Path:
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
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_tiny_llama.py OUT_DIR")
    print(build(Path(sys.argv[1])))
