"""A torch-native paged attention backend (CPU and GPU).

Requests are processed in groups, each as one padded batch: queries scattered to
``[b, max_new, heads, dim]``, each request's context gathered from the pool through
``req_to_token`` into ``[b, max_seq, kv_heads, dim]``, and one ``scaled_dot_product_attention``
with a boolean mask (causal with the cached prefix as offset, padding masked out). Groups bound the
score tensor's size, so a long prefill next to many short ones does not blow up memory. Decode is
the special case of one new token per request; under a CUDA graph it runs on static buffers
(context width ``graph_width``) that ``init_forward_metadata_replay_cuda_graph`` refills in place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from srtscope.engine.attention.base import AttentionBackend, batch_lens
from srtscope.engine.forward_batch import ForwardMode

try:  # enable_gqa arrived in torch 2.5
    F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2),
                                   torch.zeros(1, 1, 1, 2), enable_gqa=True)
    _HAS_GQA = True
except Exception:  # pragma: no cover - old torch
    _HAS_GQA = False


@dataclass
class _Group:
    row_start: int
    row_end: int
    tok_start: int
    tok_end: int
    max_new: int
    kv_idx: torch.Tensor          # [b, W] int64 pool slots (0 where masked)
    mask: torch.Tensor            # [b, 1, Lq, W] bool, True = attend
    tok_req: torch.Tensor | None  # [T_g] local row of each token (None: one token per row)
    tok_j: torch.Tensor | None    # [T_g] index of each token among its row's new tokens


@dataclass
class TorchNativeMetadata:
    groups: list[_Group] = field(default_factory=list)


class TorchNativeAttnBackend(AttentionBackend):
    name = "torch_native"
    supports_cuda_graph = True

    def __init__(self, kv_pool: Any, num_heads: int, num_kv_heads: int, head_dim: int,
                 device: torch.device | str = "cpu", graph_width: int = 2048,
                 max_score_elems: int = 1 << 24) -> None:
        self.pool = kv_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.device = torch.device(device)
        self.scale = 1.0 / math.sqrt(head_dim)
        self.graph_width = graph_width
        self.max_score_elems = max_score_elems
        self._graph_md: dict[int, TorchNativeMetadata] = {}
        self._ar_cache: torch.Tensor | None = None

    # ------------------------------------------------------------------ metadata
    def _arange(self, n: int) -> torch.Tensor:
        ar = self._ar_cache
        if ar is None or ar.shape[0] < n:
            ar = self._ar_cache = torch.arange(max(n, 1024), device=self.device)
        return ar[:n]

    def _plan_groups(self, new: list[int], seq: list[int]) -> list[tuple[int, int]]:
        groups: list[tuple[int, int]] = []
        start, lq, w = 0, 0, 0
        per = self.num_heads
        for i, (n, s) in enumerate(zip(new, seq)):
            nlq, nw = max(lq, n), max(w, s)
            if i > start and (i - start + 1) * nlq * nw * per > self.max_score_elems:
                groups.append((start, i))
                start, nlq, nw = i, n, s
            lq, w = nlq, nw
        if start < len(new):
            groups.append((start, len(new)))
        return groups

    def init_forward_metadata(self, fb: Any) -> None:
        if fb.forward_mode == ForwardMode.IDLE or fb.batch_size == 0:
            fb.attn_metadata = TorchNativeMetadata()
            return
        pre, new, seq = batch_lens(fb)
        md = TorchNativeMetadata()
        seq_lens = fb.seq_lens.to(self.device, torch.int64)
        rpi = fb.req_pool_indices.to(self.device, torch.int64)
        if fb.forward_mode.is_extend_like and fb.extend_prefix_lens is not None:
            prefix = fb.extend_prefix_lens.to(self.device, torch.int64)
        else:
            prefix = torch.tensor(pre, dtype=torch.int64, device=self.device) \
                if fb.forward_mode.is_extend_like else seq_lens - 1
        tok = 0
        for a, b in self._plan_groups(new, seq):
            lq = max(new[a:b])
            w = max(seq[a:b])
            n_tok = sum(new[a:b])
            kv_idx, mask = self._context(fb.req_to_token, rpi[a:b], seq_lens[a:b], prefix[a:b], lq, w)
            if lq == 1 and n_tok == b - a:
                tok_req = tok_j = None
            else:
                lens = torch.tensor(new[a:b], dtype=torch.int64, device=self.device)
                rows = self._arange(b - a)
                tok_req = torch.repeat_interleave(rows, lens, output_size=n_tok)
                starts = torch.cumsum(lens, 0) - lens
                tok_j = self._arange(n_tok) - starts[tok_req]
            md.groups.append(_Group(a, b, tok, tok + n_tok, lq, kv_idx, mask, tok_req, tok_j))
            tok += n_tok
        fb.attn_metadata = md

    def _context(self, req_to_token: torch.Tensor, rpi: torch.Tensor, seq_lens: torch.Tensor,
                 prefix: torch.Tensor, lq: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        ar_w = self._arange(w)
        valid = ar_w.unsqueeze(0) < seq_lens.unsqueeze(1)                      # [b, W]
        kv_idx = req_to_token[:, :w][rpi].to(torch.int64).masked_fill(~valid, 0)
        qpos = prefix.unsqueeze(1) + self._arange(lq).unsqueeze(0)             # [b, Lq]
        mask = (ar_w.view(1, 1, w) <= qpos.unsqueeze(2)) & valid.unsqueeze(1)  # [b, Lq, W]
        return kv_idx, mask.unsqueeze(1)

    # ------------------------------------------------------------------ forward
    def attend(self, q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, fb: Any) -> torch.Tensor:
        md: TorchNativeMetadata = fb.attn_metadata
        if len(md.groups) == 1 and md.groups[0].tok_req is None:
            return self._attend_group(q, kbuf, vbuf, md.groups[0])
        out = torch.empty_like(q)
        for g in md.groups:
            out[g.tok_start:g.tok_end] = self._attend_group(q[g.tok_start:g.tok_end], kbuf, vbuf, g)
        return out

    def _attend_group(self, q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, g: _Group
                      ) -> torch.Tensor:
        b = g.kv_idx.shape[0]
        h, d = self.num_heads, self.head_dim
        if g.tok_req is None:
            qp = q.view(b, 1, h, d)
        else:
            qp = q.new_zeros(b, g.max_new, h, d)
            qp[g.tok_req, g.tok_j] = q
        b_w = g.kv_idx.shape
        flat = g.kv_idx.reshape(-1)
        # index_select is several times faster than advanced indexing on the CPU
        kk = kbuf.index_select(0, flat).view(*b_w, *kbuf.shape[1:]).to(q.dtype).transpose(1, 2)
        vv = vbuf.index_select(0, flat).view(*b_w, *vbuf.shape[1:]).to(q.dtype).transpose(1, 2)
        qq = qp.transpose(1, 2)                            # [b, h, Lq, d]
        if h != self.num_kv_heads:
            if _HAS_GQA:
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=g.mask, scale=self.scale,
                                                   enable_gqa=True)
            else:  # pragma: no cover
                rep = h // self.num_kv_heads
                o = F.scaled_dot_product_attention(qq, kk.repeat_interleave(rep, 1),
                                                   vv.repeat_interleave(rep, 1),
                                                   attn_mask=g.mask, scale=self.scale)
        else:
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=g.mask, scale=self.scale)
        o = o.transpose(1, 2)                              # [b, Lq, h, d]
        if g.tok_req is None:
            return o.reshape(b, h, d)
        return o[g.tok_req, g.tok_j]

    # ------------------------------------------------------------------ CUDA graphs (decode)
    def init_cuda_graph_state(self, max_bs: int) -> None:
        w = self.graph_width
        self._g_kv_idx = torch.zeros(max_bs, w, dtype=torch.int64, device=self.device)
        self._g_mask = torch.zeros(max_bs, 1, 1, w, dtype=torch.bool, device=self.device)
        self._g_mask[:, :, :, 0] = True

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: Any) -> None:
        md = TorchNativeMetadata([_Group(0, bs, 0, bs, 1, self._g_kv_idx[:bs], self._g_mask[:bs],
                                         None, None)])
        self._graph_md[bs] = md
        fb.attn_metadata = md

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: Any) -> None:
        w = self.graph_width
        seq_lens = fb.seq_lens[:bs].to(torch.int64)
        kv_idx, mask = self._context(fb.req_to_token, fb.req_pool_indices[:bs].to(torch.int64),
                                     seq_lens, seq_lens - 1, 1, min(w, fb.req_to_token.shape[1]))
        ww = kv_idx.shape[1]
        self._g_kv_idx[:bs, :ww].copy_(kv_idx)
        self._g_mask[:bs, :, :, :ww].copy_(mask)
        if ww < w:
            self._g_mask[:bs, :, :, ww:] = False
        fb.attn_metadata = self._graph_md.get(bs)
