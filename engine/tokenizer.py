"""Tokenizers: byte-level by default; a local HF ``tokenizers`` folder when one is configured.

Byte-level: ids 0..255 are the UTF-8 bytes, then BOS/EOS/PAD from ``engine.config``. ``encode``
adds no special tokens (the caller decides about BOS); ``decode`` drops ids that are not bytes and
replaces invalid UTF-8. Nothing here touches the network.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from srtscope.engine.config import BOS_ID, EOS_ID, PAD_ID


class ByteTokenizer:
    """UTF-8 bytes as token ids."""

    kind = "byte"

    def __init__(self) -> None:
        self.bos_token_id: int | None = BOS_ID
        self.eos_token_id: int = EOS_ID
        self.pad_token_id: int = PAD_ID
        self.vocab_size: int = max(BOS_ID, EOS_ID, PAD_ID) + 1

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text: expected str, got {type(text).__name__}")
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local HF tokenizer folder (``tokenizer.json``, optionally ``tokenizer_config.json`` /
    ``special_tokens_map.json`` / ``config.json`` naming the BOS/EOS tokens)."""

    kind = "hf"

    def __init__(self, path: str) -> None:
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ValueError(f"tokenizer_path: no tokenizer.json at {path!r}")
        try:
            from tokenizers import Tokenizer  # type: ignore
        except ImportError as exc:  # pragma: no cover - the package is a dependency
            raise ValueError("tokenizer_path: the 'tokenizers' package is not installed") from exc
        self._tok = Tokenizer.from_file(file)
        folder = os.path.dirname(file)
        meta: dict[str, Any] = {}
        for name in ("config.json", "special_tokens_map.json", "tokenizer_config.json"):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                with open(p, encoding="utf-8") as f:
                    try:
                        meta.update({k: v for k, v in json.load(f).items() if v is not None})
                    except (json.JSONDecodeError, AttributeError):
                        pass
        self.bos_token_id = self._special_id(meta, "bos")
        eos = self._special_id(meta, "eos")
        if eos is None:
            for cand in ("</s>", "<|endoftext|>", "<eos>", "<|eot_id|>"):
                eos = self._tok.token_to_id(cand)
                if eos is not None:
                    break
        if eos is None:
            raise ValueError(f"tokenizer_path: cannot find an EOS token in {path!r}")
        self.eos_token_id: int = int(eos)
        self.pad_token_id = self._special_id(meta, "pad")
        self.vocab_size: int = int(self._tok.get_vocab_size(with_added_tokens=True))

    def _special_id(self, meta: dict[str, Any], which: str) -> int | None:
        val = meta.get(f"{which}_token_id")
        if isinstance(val, list):
            val = val[0] if val else None
        if isinstance(val, int):
            return val
        tok = meta.get(f"{which}_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str):
            return self._tok.token_to_id(tok)
        return None

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text: expected str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        n = self.vocab_size   # ids the model can sample beyond the tokenizer's vocab are dropped
        return self._tok.decode([int(i) for i in ids if 0 <= int(i) < n], skip_special_tokens=True)


def get_tokenizer(model_config: Any) -> ByteTokenizer | HFTokenizer:
    """The byte tokenizer, or the HF tokenizer at ``model_config.tokenizer_path``."""
    path = getattr(model_config, "tokenizer_path", None)
    tok: HFTokenizer | ByteTokenizer
    if path:
        tok = HFTokenizer(path)
        vocab = getattr(model_config, "vocab_size", None)
        if vocab is not None and tok.vocab_size > vocab:
            raise ValueError(f"tokenizer_path: tokenizer has {tok.vocab_size} tokens, more than "
                             f"model vocab_size={vocab}")
        return tok
    tok = ByteTokenizer()
    vocab = getattr(model_config, "vocab_size", None)
    if vocab is not None and vocab < tok.vocab_size:
        raise ValueError(f"vocab_size: {vocab} is too small for the byte tokenizer "
                         f"(needs >= {tok.vocab_size})")
    return tok
