"""The attention backend interface.

A backend turns one step's ``ForwardBatch`` into its own metadata once per forward
(``init_forward_metadata``), then each layer calls ``forward(q, k, v, layer_id, fb)``: the backend
writes this step's K/V into the paged pool at ``fb.out_cache_loc`` and attends each new token to its
request's context, read through ``fb.req_to_token[fb.req_pool_indices[i], :fb.seq_lens[i]]``.

Shapes: ``q [num_tokens, num_heads, head_dim]``, ``k``/``v`` ``[num_tokens, num_kv_heads, head_dim]``;
the result is ``[num_tokens, num_heads, head_dim]``. Causality: new token ``j`` of request ``i``
sits at position ``prefix_len[i] + j`` and sees context positions ``<=`` that.

CUDA graphs (decode only): ``init_cuda_graph_state(max_bs)`` allocates static buffers,
``init_forward_metadata_capture_cuda_graph(bs, fb)`` points the metadata at them before capture,
``init_forward_metadata_replay_cuda_graph(bs, fb)`` refills them in place before each replay.
"""
from __future__ import annotations

from typing import Any

import torch


class AttentionBackend:
    name = "base"
    supports_cuda_graph = False
    # set by each backend's __init__
    pool: Any
    num_heads: int
    head_dim: int

    def init_forward_metadata(self, fb: Any) -> None:
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                fb: Any) -> torch.Tensor:
        """Write this step's K/V into the pool, then ``attend``. Backends set ``pool``,
        ``num_heads`` and ``head_dim``."""
        if q.shape[0] == 0:
            return q.new_empty(0, self.num_heads, self.head_dim)
        self.pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        kbuf, vbuf = self.pool.get_kv_buffer(layer_id)
        return self.attend(q, kbuf, vbuf, fb)

    def attend(self, q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, fb: Any) -> torch.Tensor:
        """Attention of ``q`` over the layer's pool buffers ``kbuf``/``vbuf`` (K/V already written)."""
        raise NotImplementedError

    # CUDA graph hooks (decode only)
    def init_cuda_graph_state(self, max_bs: int) -> None:
        raise NotImplementedError(f"{self.name} does not support CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: Any) -> None:
        raise NotImplementedError(f"{self.name} does not support CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: Any) -> None:
        raise NotImplementedError(f"{self.name} does not support CUDA graphs")


def batch_lens(fb: Any) -> tuple[list[int], list[int], list[int]]:
    """Host lists (prefix_lens, new_lens, seq_lens) for any non-idle forward mode, without a device
    sync when the ``*_cpu`` lists are filled."""
    bs = fb.batch_size
    seq = list(fb.seq_lens_cpu) if len(fb.seq_lens_cpu) == bs else [int(x) for x in fb.seq_lens.tolist()]
    if fb.forward_mode.is_extend_like:
        if len(fb.extend_seq_lens_cpu) == bs:
            new = list(fb.extend_seq_lens_cpu)
        elif fb.extend_seq_lens is not None:
            new = [int(x) for x in fb.extend_seq_lens.tolist()]
        else:
            raise ValueError("extend_seq_lens: an extend batch needs extend_seq_lens")
        if len(fb.extend_prefix_lens_cpu) == bs:
            pre = list(fb.extend_prefix_lens_cpu)
        else:
            pre = [s - n for s, n in zip(seq, new)]
    else:
        new = [1] * bs
        pre = [s - 1 for s in seq]
    return pre, new, seq
