"""Pick and build the attention backend named by ``EngineConfig.attention_backend``.

``auto``: FlashInfer on CUDA when importable and the model dtype is float16/bfloat16, else the
torch-native backend. Asking for ``flashinfer`` where it cannot run is a ``ValueError``.
The choice and its reason are returned so that the engine can say which backend it uses.
"""
from __future__ import annotations

from typing import Any

import torch

from srtscope.engine.attention.base import AttentionBackend
from srtscope.engine.attention.flashinfer_backend import flashinfer_available
from srtscope.engine.attention.torch_native import TorchNativeAttnBackend


def select_attention_backend(requested: str, device: torch.device | str,
                             dtype: torch.dtype) -> tuple[str, str]:
    """(backend name, reason)."""
    device = torch.device(device)
    if requested not in ("auto", "torch_native", "flashinfer"):
        raise ValueError(f"attention_backend: unknown backend {requested!r}")
    if requested == "torch_native":
        return "torch_native", "requested"
    if device.type != "cuda":
        if requested == "flashinfer":
            raise ValueError("attention_backend: flashinfer needs a CUDA device")
        return "torch_native", "auto: no CUDA device"
    ok, why = flashinfer_available()
    if ok and dtype not in (torch.float16, torch.bfloat16):
        ok, why = False, f"model dtype {str(dtype).replace('torch.', '')} (flashinfer wants fp16/bf16)"
    if requested == "flashinfer":
        if not ok:
            raise ValueError(f"attention_backend: flashinfer unusable: {why}")
        return "flashinfer", "requested"
    if ok:
        return "flashinfer", "auto: CUDA and flashinfer importable"
    return "torch_native", f"auto: {why}"


def create_attention_backend(requested: str, kv_pool: Any, num_heads: int, num_kv_heads: int,
                             head_dim: int, device: torch.device | str, dtype: torch.dtype,
                             graph_width: int = 2048) -> tuple[AttentionBackend, str]:
    name, reason = select_attention_backend(requested, device, dtype)
    if name == "flashinfer":
        from srtscope.engine.attention.flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(kv_pool, num_heads, num_kv_heads, head_dim, device,
                                     graph_width=graph_width), reason
    return TorchNativeAttnBackend(kv_pool, num_heads, num_kv_heads, head_dim, device,
                                  graph_width=graph_width), reason
