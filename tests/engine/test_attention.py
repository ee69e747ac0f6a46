"""Attention backends: torch-native grouping, factory choice, FlashInfer import guard."""
from __future__ import annotations

import importlib

import pytest
import torch

from srtscope.engine.attention.factory import create_attention_backend, select_attention_backend
from srtscope.engine.attention.torch_native import TorchNativeAttnBackend
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.mem.kv_pool import KVPool
from tests.engine.worker_helpers import MiniBatcher


def _naive(q, kbuf, vbuf, rows_slots, prefix_lens, new_lens, scale):
    """Per-token loop reference."""
    outs, t = [], 0
    h, kvh = q.shape[1], kbuf.shape[1]
    for slots, pre, n in zip(rows_slots, prefix_lens, new_lens):
        for j in range(n):
            ctx = slots[:pre + j + 1]
            k = kbuf[ctx].repeat_interleave(h // kvh, 1)    # [L, h, d]
            v = vbuf[ctx].repeat_interleave(h // kvh, 1)
            s = torch.einsum("hd,lhd->hl", q[t], k) * scale
            outs.append(torch.einsum("hl,lhd->hd", s.softmax(-1), v))
            t += 1
    return torch.stack(outs)


@pytest.mark.parametrize("max_elems", [1 << 24, 64])   # one group / one request per group
def test_torch_native_matches_naive_with_prefixes(max_elems):
    g = torch.Generator().manual_seed(0)
    pool = KVPool(512, 1, 2, 16, torch.float32, "cpu")
    be = TorchNativeAttnBackend(pool, 4, 2, 16, "cpu", max_score_elems=max_elems)
    mb = MiniBatcher(8, 256)
    # cached prefixes: write random K/V for them first
    mb.extend({0: [0] * 5, 2: [0] * 9})
    for s in range(1, mb.next_slot):
        pool.k_buffer[0][s] = torch.randn(2, 16, generator=g)
        pool.v_buffer[0][s] = torch.randn(2, 16, generator=g)
    fb = mb.extend({0: [1] * 3, 1: [1] * 6, 2: [1], 5: [1] * 2}, mode=ForwardMode.MIXED)
    T = fb.num_tokens
    q = torch.randn(T, 4, 16, generator=g)
    k = torch.randn(T, 2, 16, generator=g)
    v = torch.randn(T, 2, 16, generator=g)
    be.init_forward_metadata(fb)
    if max_elems == 64:
        assert len(fb.attn_metadata.groups) == 4
    out = be.forward(q, k, v, 0, fb)
    rows = [mb.req_to_token[r, :n].long() for r, n in zip(fb.req_pool_indices.tolist(), fb.seq_lens_cpu)]
    ref = _naive(q, pool.k_buffer[0], pool.v_buffer[0], rows, fb.extend_prefix_lens_cpu,
                 fb.extend_seq_lens_cpu, 16 ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    # K/V of the new tokens landed in their slots
    torch.testing.assert_close(pool.k_buffer[0][fb.out_cache_loc], k)


def test_factory_on_cpu():
    assert select_attention_backend("auto", "cpu", torch.float32)[0] == "torch_native"
    assert select_attention_backend("torch_native", "cpu", torch.float32) == ("torch_native", "requested")
    with pytest.raises(ValueError, match="attention_backend"):
        select_attention_backend("flashinfer", "cpu", torch.float16)
    with pytest.raises(ValueError, match="attention_backend"):
        select_attention_backend("triton", "cpu", torch.float16)
    pool = KVPool(8, 1, 1, 8, torch.float32, "cpu")
    be, why = create_attention_backend("auto", pool, 2, 1, 8, "cpu", torch.float32)
    assert be.name == "torch_native" and "no CUDA" in why


def test_flashinfer_module_imports_without_cuda():
    mod = importlib.import_module("srtscope.engine.attention.flashinfer_backend")
    ok, why = mod.flashinfer_available()
    if not torch.cuda.is_available():
        assert not ok and "CUDA" in why


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flashinfer_matches_torch_native_on_cuda():
    mod = importlib.import_module("srtscope.engine.attention.flashinfer_backend")
    ok, why = mod.flashinfer_available()
    if not ok:
        pytest.skip(why)
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = KVPool(1024, 1, 2, 64, torch.float16, "cuda")
    fi = mod.FlashInferAttnBackend(pool, 8, 2, 64, "cuda")
    tn = TorchNativeAttnBackend(pool, 8, 2, 64, "cuda")
    mb = MiniBatcher(8, 512, device="cuda")
    mb.extend({0: [0] * 30, 1: [0] * 3})
    pool.k_buffer[0].normal_(generator=g)
    pool.v_buffer[0].normal_(generator=g)
    for _mode, fb in ((ForwardMode.MIXED, mb.extend({0: [1] * 7, 1: [1], 3: [1] * 12}, mode=ForwardMode.MIXED)),
                      (ForwardMode.DECODE, mb.decode({0: 1, 1: 1, 3: 1}))):
        T = fb.num_tokens
        q = torch.randn(T, 8, 64, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(T, 2, 64, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(T, 2, 64, device="cuda", dtype=torch.float16, generator=g)
        fi.init_forward_metadata(fb)
        a = fi.forward(q, k, v, 0, fb)
        tn.init_forward_metadata(fb)
        b = tn.forward(q, k, v, 0, fb)
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
