"""A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; with Qwen2's
q/k/v biases (``qkv_bias``) and Qwen3's per-head q/k RMSNorm before rotary (``qk_norm``) and a head
size free of ``hidden_size / num_heads`` (``head_size``).

Tensor-parallel ready: q/k/v and gate/up are column-parallel (merged per rank), o and down are
row-parallel with an all-reduce, the embedding and LM head are vocab-parallel. Attention goes
through a backend (``engine.attention``) that writes this step's K/V into the paged pool and reads
each request's context through ``req_to_token``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from srtscope.engine.config import ModelConfig
from srtscope.engine.model.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from srtscope.engine.model.parallel import TPState, shard_range
from srtscope.engine.model.rotary import RotaryEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPState, rotary: RotaryEmbedding,
                 dtype: torch.dtype, device) -> None:
        super().__init__()
        shard_range(cfg.num_heads, tp.rank, tp.size, "num_heads")
        shard_range(cfg.num_kv_heads, tp.rank, tp.size, "num_kv_heads")
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_heads // tp.size
        self.num_kv_heads = cfg.num_kv_heads // tp.size
        hd = self.head_dim
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd],
            tp, dtype, device, bias=cfg.qkv_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None
        self.o_proj = RowParallelLinear(cfg.num_heads * hd, cfg.hidden_size, tp, dtype, device)
        self.rotary = rotary
        self._split = [self.num_heads * hd, self.num_kv_heads * hd, self.num_kv_heads * hd]

    def forward(self, cos_sin: tuple, x: torch.Tensor, fb: Any, attn: Any) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self._split, dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary.rotate(cos_sin, q, k)
        o = attn.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPState, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(
            cfg.hidden_size, [cfg.intermediate_size, cfg.intermediate_size], tp, dtype, device)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, tp, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPState, rotary: RotaryEmbedding,
                 dtype: torch.dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(cfg, layer_id, tp, rotary, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(cfg, tp, dtype, device)

    def forward(self, cos_sin: tuple, x: torch.Tensor, fb: Any, attn: Any) -> torch.Tensor:
        x = x + self.self_attn(cos_sin, self.input_layernorm(x), fb, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPState | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        tp = tp or TPState()
        self.cfg = cfg
        self.tp = tp
        self.dtype = dtype
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta,
                                      dtype=dtype, device=device, scaling=cfg.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype, device)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i, tp, self.rotary, dtype, device)
                                     for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def num_local_heads(self) -> int:
        return self.cfg.num_heads // self.tp.size

    @property
    def num_local_kv_heads(self) -> int:
        return self.cfg.num_kv_heads // self.tp.size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any, attn: Any
                ) -> torch.Tensor:
        """Final-normed hidden states ``[num_tokens, hidden]``."""
        x = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(positions)
        for layer in self.layers:
            x = layer(cos_sin, x, fb, attn)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, vocab]`` logits (float32), gathered across TP ranks."""
        return self.lm_head.compute_logits(hidden).float()
