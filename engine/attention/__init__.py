"""Attention backends: the interface, a torch-native paged backend, FlashInfer (CUDA, optional)."""
from srtscope.engine.attention.base import AttentionBackend
from srtscope.engine.attention.factory import create_attention_backend, select_attention_backend

__all__ = ["AttentionBackend", "create_attention_backend", "select_attention_backend"]
