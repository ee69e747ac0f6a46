"""Paged KV buffers (page size 1: one slot per token).

``k_buffer[layer]`` / ``v_buffer[layer]`` are ``[size, num_kv_heads, head_dim]`` tensors. Slot 0 is
reserved: padded rows of a CUDA-graph batch write their K/V there and nothing real ever reads it.
The allocator (``engine/mem``'s slot allocator) hands out slots 1..size-1; this class only stores.
"""
from __future__ import annotations

import torch

# "auto" is float32 here: a checkpoint's own dtype replaces it before (weights.model_config_from_hf)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "auto": torch.float32}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype: unknown dtype {dtype!r} ({', '.join(_DTYPES)})") from None


class KVPool:
    DUMMY_SLOT = 0

    def __init__(self, size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: str | torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        if size < 2:
            raise ValueError(f"size: need at least 2 slots (slot 0 is the dummy), got {size}")
        for name, val in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim)):
            if val < 1:
                raise ValueError(f"{name}: must be >= 1, got {val}")
        self.size = size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = resolve_dtype(dtype)
        self.device = torch.device(device)
        self.k_buffer = [torch.zeros(size, num_kv_heads, head_dim, dtype=self.dtype,
                                     device=self.device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(size, num_kv_heads, head_dim, dtype=self.dtype,
                                     device=self.device) for _ in range(num_layers)]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V rows ``[n, num_kv_heads, head_dim]`` into slots ``loc`` ``[n]``."""
        if loc.dtype != torch.int64:
            loc = loc.to(torch.int64)
        if k.dtype != self.dtype:
            k = k.to(self.dtype)
            v = v.to(self.dtype)
        self.k_buffer[layer_id].index_copy_(0, loc, k)
        self.v_buffer[layer_id].index_copy_(0, loc, v)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    @property
    def bytes(self) -> int:
        per = self.size * self.num_kv_heads * self.head_dim * self.k_buffer[0].element_size()
        return 2 * self.num_layers * per
