"""Sampling: greedy, temperature, top-k, top-p, min-p; per-row seeds.

Every row draws by inverse CDF over its filtered, renormalised distribution with one uniform
number ``u``. A seeded row's ``u`` is a hash of ``(seed, output_len)`` computed on the host, so its
draw depends only on those two (and the logits): re-running a step reproduces it, whatever the
batch around it. Unseeded rows take ``u`` from the sampler's generator. Rows with temperature 0 are
greedy (argmax).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from srtscope.engine.forward_batch import SamplingBatchInfo
from srtscope.probes.ranges import stage

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seeded_uniform(seed: int, output_len: int) -> float:
    """A uniform number in [0, 1) determined by ``(seed, output_len)`` alone."""
    h = _splitmix64((_splitmix64(int(seed) & _MASK64) ^ (int(output_len) & _MASK64)) & _MASK64)
    return (h >> 11) * (1.0 / (1 << 53))


def make_sampling_info(temperatures: Sequence[float], top_ps: Sequence[float] | None = None,
                       top_ks: Sequence[int] | None = None, min_ps: Sequence[float] | None = None,
                       seeds: Sequence[int | None] | None = None,
                       output_lens: Sequence[int] | None = None,
                       device: torch.device | str = "cpu") -> SamplingBatchInfo:
    """Validated ``SamplingBatchInfo`` from host lists (``ValueError`` naming the field)."""
    bs = len(temperatures)
    top_ps = [1.0] * bs if top_ps is None else list(top_ps)
    top_ks = [-1] * bs if top_ks is None else list(top_ks)
    min_ps = [0.0] * bs if min_ps is None else list(min_ps)
    seeds = [None] * bs if seeds is None else list(seeds)
    output_lens = [0] * bs if output_lens is None else list(output_lens)
    for name, vals in (("top_ps", top_ps), ("top_ks", top_ks), ("min_ps", min_ps),
                       ("seeds", seeds), ("output_lens", output_lens)):
        if len(vals) != bs:
            raise ValueError(f"{name}: expected {bs} values, got {len(vals)}")
    validate_values(temperatures, top_ps, top_ks, min_ps, output_lens)
    return SamplingBatchInfo(
        temperatures=torch.tensor(temperatures, dtype=torch.float32, device=device),
        top_ps=torch.tensor(top_ps, dtype=torch.float32, device=device),
        top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
        min_ps=torch.tensor(min_ps, dtype=torch.float32, device=device),
        seeds=seeds, output_lens=output_lens,
        is_all_greedy=all(t == 0 for t in temperatures))


def validate_values(temperatures, top_ps, top_ks, min_ps, output_lens=()) -> None:
    for t in temperatures:
        if not (t >= 0.0) or t != t or t == float("inf"):
            raise ValueError(f"temperature: must be a finite number >= 0, got {t}")
    for p in top_ps:
        if not (0.0 < p <= 1.0):
            raise ValueError(f"top_p: must be in (0, 1], got {p}")
    for k in top_ks:
        if int(k) != k or (k == 0):
            raise ValueError(f"top_k: must be a positive integer or -1 (off), got {k}")
    for m in min_ps:
        if not (0.0 <= m <= 1.0):
            raise ValueError(f"min_p: must be in [0, 1], got {m}")
    for n in output_lens:
        if n < 0:
            raise ValueError(f"output_lens: must be >= 0, got {n}")


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(int(seed))

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo | None) -> torch.Tensor:
        return self.sample(logits, info)

    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo | None) -> torch.Tensor:
        """Next token ids ``[bs]`` int64 on the logits' device (no host sync)."""
        with stage("run.sample", bs=int(logits.shape[0])):
            return self._sample(logits, info)

    def _sample(self, logits: torch.Tensor, info: SamplingBatchInfo | None) -> torch.Tensor:
        bs = logits.shape[0]
        if bs == 0:
            return torch.empty(0, dtype=torch.int64, device=logits.device)
        if info is None or info.is_all_greedy:
            return torch.argmax(logits, dim=-1)
        if info.temperatures.shape[0] != bs:
            raise ValueError(f"temperatures: expected {bs} rows, got {info.temperatures.shape[0]}")
        dev = logits.device
        temps = info.temperatures.to(dev, torch.float32)
        greedy_rows = temps <= 0
        logits = logits.float() / torch.where(greedy_rows, torch.ones_like(temps), temps).unsqueeze(1)
        probs = torch.softmax(logits, dim=-1)
        sorted_p, sorted_idx = torch.sort(probs, dim=-1, descending=True)
        vocab = probs.shape[1]
        ranks = torch.arange(vocab, device=dev).unsqueeze(0)
        top_ks = info.top_ks.to(dev, torch.int64)
        k = torch.where(top_ks <= 0, torch.full_like(top_ks, vocab), top_ks).unsqueeze(1)
        drop = ranks >= k
        top_ps = info.top_ps.to(dev, torch.float32).unsqueeze(1)
        drop |= (torch.cumsum(sorted_p, dim=-1) - sorted_p) > top_ps        # keeps the first
        min_ps = info.min_ps.to(dev, torch.float32).unsqueeze(1)
        drop |= sorted_p < min_ps * sorted_p[:, :1]                          # never the first
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        cdf = torch.cumsum(sorted_p, dim=-1)
        u = self._uniforms(info, bs, dev)
        target = (u * cdf[:, -1]).unsqueeze(1)
        pos = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
        # a position past the last kept entry (rounding) falls back to the last kept one
        kept = (~drop).sum(dim=-1, keepdim=True)
        pos = torch.minimum(pos, kept - 1)
        sampled = sorted_idx.gather(1, pos).squeeze(1)
        return torch.where(greedy_rows, torch.argmax(logits, dim=-1), sampled)

    def _uniforms(self, info: SamplingBatchInfo, bs: int, dev: torch.device) -> torch.Tensor:
        seeds = info.seeds
        if not any(s is not None for s in seeds):
            return torch.rand(bs, generator=self.generator, device=self.device).to(dev)
        u = torch.rand(bs, generator=self.generator, device=self.device).to(dev)
        fixed = [(i, seeded_uniform(s, info.output_lens[i])) for i, s in enumerate(seeds) if s is not None]
        idx = torch.tensor([i for i, _ in fixed], dtype=torch.int64)
        val = torch.tensor([x for _, x in fixed], dtype=torch.float32)
        return u.index_put((idx.to(dev),), val.to(dev))
