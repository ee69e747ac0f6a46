"""FlashInfer attention backend (CUDA only, optional extra ``gpu``).

Imports cleanly without CUDA or flashinfer: ``flashinfer_available()`` says whether it can be used.
Paged KV with page size 1: the pool's ``[size, kv_heads, dim]`` buffers are viewed as
``[size, 1, kv_heads, dim]`` pages (NHD). Extend/mixed batches use the paged prefill wrapper
(causal; FlashInfer aligns a request's last query with its last key, which is the prefix offset);
decode batches use the decode wrapper, with CUDA-graph wrappers on static index buffers per
captured batch size, re-planned before each replay.
"""
from __future__ import annotations

from typing import Any

import torch

from srtscope.engine.attention.base import AttentionBackend, batch_lens
from srtscope.engine.forward_batch import ForwardMode

_WORKSPACE_BYTES = 128 * 1024 * 1024


def flashinfer_available() -> tuple[bool, str]:
    """(usable, why not) — needs CUDA and an importable ``flashinfer``."""
    try:
        if not torch.cuda.is_available():
            return False, "no CUDA"
    except Exception:  # pragma: no cover
        return False, "no CUDA"
    try:
        import flashinfer  # type: ignore  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return False, f"flashinfer not importable ({type(exc).__name__})"
    return True, ""


class FlashInferMetadata:
    __slots__ = ("wrapper", "decode")

    def __init__(self, wrapper: Any, decode: bool) -> None:
        self.wrapper = wrapper
        self.decode = decode


class FlashInferAttnBackend(AttentionBackend):
    name = "flashinfer"
    supports_cuda_graph = True

    def __init__(self, kv_pool: Any, num_heads: int, num_kv_heads: int, head_dim: int,
                 device: torch.device | str = "cuda", graph_width: int = 2048) -> None:
        import flashinfer  # type: ignore

        self.fi = flashinfer
        self.pool = kv_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.device = torch.device(device)
        self.graph_width = graph_width
        self.workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self._tensor_cores())
        self._graph_wrappers: dict[int, Any] = {}
        self._ar: torch.Tensor | None = None

    def _tensor_cores(self) -> bool:
        return self.num_heads // self.num_kv_heads >= 4

    def _indices(self, fb: Any, bs: int, seq: list[int] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """CSR page table: indptr [bs+1] int32, indices [sum seq] int32, last_page_len [bs] (1s)."""
        seq_lens = fb.seq_lens[:bs].to(torch.int32)
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        indptr[1:] = torch.cumsum(seq_lens, 0)
        w = max(seq) if seq else int(fb.seq_lens[:bs].max().item())
        ar = torch.arange(w, device=self.device)
        rows = fb.req_to_token[:, :w][fb.req_pool_indices[:bs].to(torch.int64)]
        valid = ar.unsqueeze(0) < seq_lens.unsqueeze(1)
        indices = rows[valid].to(torch.int32)        # row-major: each request's slots in order
        last = torch.ones(bs, dtype=torch.int32, device=self.device)
        return indptr, indices, last

    def init_forward_metadata(self, fb: Any) -> None:
        if fb.forward_mode == ForwardMode.IDLE or fb.batch_size == 0:
            fb.attn_metadata = None
            return
        bs = fb.batch_size
        pre, new, seq = batch_lens(fb)
        indptr, indices, last = self._indices(fb, bs, seq)
        dtype = self.pool.dtype
        if fb.forward_mode == ForwardMode.DECODE:
            self.decode.plan(indptr, indices, last, self.num_heads, self.num_kv_heads,
                             self.head_dim, 1, pos_encoding_mode="NONE",
                             q_data_type=dtype, kv_data_type=dtype)
            fb.attn_metadata = FlashInferMetadata(self.decode, True)
        else:
            qo = torch.tensor([0] + new, dtype=torch.int32).cumsum(0).to(torch.int32)
            self.prefill.plan(qo.to(self.device), indptr, indices, last, self.num_heads,
                              self.num_kv_heads, self.head_dim, 1, causal=True,
                              q_data_type=dtype, kv_data_type=dtype)
            fb.attn_metadata = FlashInferMetadata(self.prefill, False)

    def attend(self, q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, fb: Any) -> torch.Tensor:
        cache = (kbuf.unsqueeze(1), vbuf.unsqueeze(1))   # [pages, page_size=1, kvh, d]
        md: FlashInferMetadata = fb.attn_metadata
        return md.wrapper.run(q.contiguous(), cache)

    # ------------------------------------------------------------------ CUDA graphs (decode)
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self._max_bs = max_bs
        self._g_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._g_last = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self._g_indices = torch.zeros(max_bs * self.graph_width, dtype=torch.int32,
                                      device=self.device)

    def _plan_graph(self, wrapper: Any, bs: int, indptr, indices, last) -> None:
        dtype = self.pool.dtype
        wrapper.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, 1,
                     pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: Any) -> None:
        wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self._tensor_cores(),
            paged_kv_indptr_buffer=self._g_indptr[:bs + 1],
            paged_kv_indices_buffer=self._g_indices,
            paged_kv_last_page_len_buffer=self._g_last[:bs])
        # capture-time plan: every row a single token in the dummy slot
        indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(bs, dtype=torch.int32, device=self.device)
        self._plan_graph(wrapper, bs, indptr, indices, self._g_last[:bs])
        self._graph_wrappers[bs] = wrapper
        fb.attn_metadata = FlashInferMetadata(wrapper, True)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: Any) -> None:
        seq = list(fb.seq_lens_cpu) if len(fb.seq_lens_cpu) == bs else None
        indptr, indices, last = self._indices(fb, bs, seq)
        wrapper = self._graph_wrappers[bs]
        self._plan_graph(wrapper, bs, indptr, indices, last)
        fb.attn_metadata = FlashInferMetadata(wrapper, True)
