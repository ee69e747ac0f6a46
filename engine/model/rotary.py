"""Rotary position embeddings, HF-Llama layout (rotate-half, not interleaved), with HF's ``linear``
and ``llama3`` frequency scaling."""
from __future__ import annotations

import math

import torch
from torch import nn

from srtscope.engine.config import RopeScaling


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """``[head_dim / 2]`` float64 inverse frequencies (radians per token), scaled as HF does."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    # llama3 (transformers' _compute_llama3_parameters)
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * out / scaling.factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, out)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 scaling: RopeScaling | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim: rotary embeddings need an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        inv_freq = inv_frequencies(head_dim, theta, scaling)
        t = torch.arange(max_position, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos_cache", emb.cos().to(dtype).to(device), persistent=False)
        self.register_buffer("sin_cache", emb.sin().to(dtype).to(device), persistent=False)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, 1, head_dim]`` cos and sin for ``positions`` (computed once per forward)."""
        return self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)

    def rotate(self, cos_sin: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos_sin
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, heads, head_dim]``, k ``[T, kv_heads, head_dim]``, positions ``[T]``."""
        return self.rotate(self.cos_sin(positions), q, k)
