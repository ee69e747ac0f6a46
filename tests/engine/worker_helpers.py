"""Test helpers: a minimal slot bookkeeping that builds ForwardBatches for the worker, and a plain
full-sequence causal reference forward of the same HF-named weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from srtscope.engine.config import ModelConfig
from srtscope.engine.forward_batch import ForwardBatch, ForwardMode


class MiniBatcher:
    """Rows of a req_to_token table and a bump allocator of KV slots (slot 0 never handed out)."""

    def __init__(self, max_reqs: int, context_len: int, device="cpu") -> None:
        self.req_to_token = torch.zeros(max_reqs, context_len, dtype=torch.int32, device=device)
        self.next_slot = 1
        self.lens: dict[int, int] = {}
        self.device = device

    def _alloc(self, n: int) -> torch.Tensor:
        locs = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int64)
        self.next_slot += n
        return locs

    def extend(self, chunks: dict[int, list[int]], mode=ForwardMode.EXTEND, sampling=None) -> ForwardBatch:
        """``chunks``: request row -> new token ids (appended after its current length)."""
        ids, pos, locs, seq, pre, new = [], [], [], [], [], []
        for row, toks in chunks.items():
            start = self.lens.get(row, 0)
            loc = self._alloc(len(toks))
            self.req_to_token[row, start:start + len(toks)] = loc.to(torch.int32)
            self.lens[row] = start + len(toks)
            ids += toks
            pos += list(range(start, start + len(toks)))
            locs.append(loc)
            seq.append(start + len(toks))
            pre.append(start)
            new.append(len(toks))
        d = self.device
        return ForwardBatch(
            forward_mode=mode, batch_size=len(chunks),
            input_ids=torch.tensor(ids, dtype=torch.int64, device=d),
            positions=torch.tensor(pos, dtype=torch.int64, device=d),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=d),
            req_pool_indices=torch.tensor(list(chunks), dtype=torch.int64, device=d),
            req_to_token=self.req_to_token,
            out_cache_loc=torch.cat(locs).to(d),
            sampling=sampling, seq_lens_cpu=seq,
            extend_prefix_lens=torch.tensor(pre, dtype=torch.int64, device=d),
            extend_seq_lens=torch.tensor(new, dtype=torch.int64, device=d),
            extend_prefix_lens_cpu=pre, extend_seq_lens_cpu=new,
            sample_rows=list(range(len(chunks))))

    def decode(self, toks: dict[int, int], sampling=None) -> ForwardBatch:
        fb = self.extend({r: [t] for r, t in toks.items()}, sampling=sampling)
        fb.forward_mode = ForwardMode.DECODE
        fb.extend_prefix_lens = fb.extend_seq_lens = None
        fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu = [], []
        return fb


def reference_logits(sd: dict[str, torch.Tensor], cfg: ModelConfig, ids: list[int],
                     inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Plain causal forward of the full sequence, float32: logits at every position [T, vocab].
    ``inv_freq``: rotary inverse frequencies (float64) instead of ``cfg.rope_theta``'s."""
    t = len(ids)
    hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    x = sd["model.embed_tokens.weight"][torch.tensor(ids)]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))

    inv = (1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
           if inv_freq is None else inv_freq)
    ang = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    cos = torch.cat([ang, ang], -1).cos().float()[:, None]
    sin = torch.cat([ang, ang], -1).sin().float()[:, None]

    def rope(z):
        z2 = torch.cat([-z[..., hd // 2:], z[..., :hd // 2]], -1)
        return z * cos + z2 * sin

    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = rms(x, sd[p + "input_layernorm.weight"])
        q = rope((a @ sd[p + "self_attn.q_proj.weight"].T).view(t, nh, hd))
        k = rope((a @ sd[p + "self_attn.k_proj.weight"].T).view(t, nkv, hd))
        v = (a @ sd[p + "self_attn.v_proj.weight"].T).view(t, nkv, hd)
        k = k.repeat_interleave(nh // nkv, 1)
        v = v.repeat_interleave(nh // nkv, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
        s = s.masked_fill(~causal, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", s, v).reshape(t, nh * hd)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].T
        m = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = m @ sd[p + "mlp.gate_proj.weight"].T
        u = m @ sd[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"])
    head = sd["lm_head.weight"] if "lm_head.weight" in sd else sd["model.embed_tokens.weight"]
    return x @ head.T


def tp_rank_main(rank: int, world: int, port: int, cfg_kwargs: dict, prompts: dict, steps: int,
                 out_q) -> None:
    """One TP rank (spawned): gloo group, a worker, an extend then greedy decodes; puts
    (rank, [logits per step], comm spans) on ``out_q``."""
    import torch.distributed as dist

    from srtscope.engine.config import EngineConfig
    from srtscope.engine.runner.tp_worker import TpModelWorker
    from srtscope.probes import ranges
    from srtscope.probes import recorder as rec

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        ranges.enable(nvtx=False)
        cfg = EngineConfig(tp_size=world, device="cpu", **cfg_kwargs)
        w = TpModelWorker(cfg, rank=rank, tp_size=world, group=dist.group.WORLD)
        mb = MiniBatcher(8, cfg.context_length)
        res = w.forward_batch_generation(mb.extend(prompts))
        logits = [res.logits.clone()]
        for _ in range(steps):
            res = w.forward_batch_generation(
                mb.decode({r: int(t) for r, t in zip(prompts, res.next_token_ids.tolist())}))
            logits.append(res.logits.clone())
        empty = torch.empty(0, dtype=torch.int64)
        w.forward_batch_generation(ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty, empty,
                                                mb.req_to_token, empty))
        comm = [(s[0], s[5]) for s in rec._DEFAULT.raw_spans() if s[0] == "comm.all_reduce"]
        out_q.put((rank, [lg.numpy() for lg in logits], comm))
        # NOTE: both ranks done before either tears its group down: a rank that destroyed its gloo
        # group while the other still held the connection aborted at exit now and then
        # ("terminate called without an active exception", exit code -6)
        dist.barrier()
    finally:
        dist.destroy_process_group()
