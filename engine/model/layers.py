"""Tensor-parallel-ready layers: RMSNorm, column/row-parallel linears, vocab-parallel embedding
and LM head. Each holds only its rank's shard; ``TPState`` does the collectives (none at tp=1).

Sharding (Megatron style, as SGLang):
- column-parallel ``[out/tp, in]``: each rank computes its slice of the output, no communication;
- row-parallel ``[out, in/tp]``: each rank's partial product, then an all-reduce (sum);
- vocab-parallel embedding: rank r holds rows ``[r*V/tp, (r+1)*V/tp)``, ids outside are zeroed,
  then an all-reduce; the LM head computes its vocab slice and the logits are all-gathered.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from srtscope.engine.model.parallel import TPState, shard_range


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T (+ b)`` with W (and b) split by output rows; ``output_sizes`` lists merged
    sub-matrices (e.g. q, k, v) so that each is sharded separately and concatenated per rank."""

    def __init__(self, in_features: int, output_sizes: list[int], tp: TPState,
                 dtype: torch.dtype, device, bias: bool = False) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        for s in self.output_sizes:
            shard_range(s, tp.rank, tp.size, "output size")
        self.local_sizes = [s // tp.size for s in self.output_sizes]
        self.weight = _param((sum(self.local_sizes), in_features), dtype, device)
        self.bias = _param((sum(self.local_sizes),), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def _shards(self, parts: list[torch.Tensor], shape_of, names: list[str] | None) -> torch.Tensor:
        shards = []
        for i, (full, size) in enumerate(zip(parts, self.output_sizes)):
            if tuple(full.shape) != shape_of(size):
                what = f" {names[i]!r}" if names else ""
                raise ValueError(f"weights:{what} expected shape {shape_of(size)}, got {tuple(full.shape)}")
            a, b = shard_range(size, self.tp.rank, self.tp.size)
            shards.append(full[a:b])
        return torch.cat(shards, 0)

    def load_full(self, parts: list[torch.Tensor], biases: list[torch.Tensor] | None = None,
                  names: list[str] | None = None) -> None:
        """Load from the full (unsharded) sub-matrices, one per ``output_sizes`` entry (and their
        biases when the layer has them); ``names`` (the tensors' checkpoint names) go into errors."""
        self.weight.data.copy_(self._shards(parts, lambda n: (n, self.in_features), names).to(self.weight.dtype))
        if self.bias is not None:
            if biases is None:
                raise ValueError("weights: this layer has biases but none were given")
            bnames = [n.removesuffix(".weight") + ".bias" for n in names] if names else None
            self.bias.data.copy_(self._shards(biases, lambda n: (n,), bnames).to(self.bias.dtype))


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r W_r^T)`` with W split by input columns."""

    def __init__(self, in_features: int, out_features: int, tp: TPState,
                 dtype: torch.dtype, device) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.out_features = out_features
        shard_range(in_features, tp.rank, tp.size, "input size")
        self.weight = _param((out_features, in_features // tp.size), dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(F.linear(x, self.weight))

    def load_full(self, full: torch.Tensor, name: str = "") -> None:
        if tuple(full.shape) != (self.out_features, self.in_features):
            what = f" {name!r}" if name else ""
            raise ValueError(f"weights:{what} expected shape {(self.out_features, self.in_features)}, "
                             f"got {tuple(full.shape)}")
        a, b = shard_range(self.in_features, self.tp.rank, self.tp.size)
        self.weight.data.copy_(full[:, a:b].to(self.weight.dtype))


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, tp: TPState, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.tp = tp
        self.vocab = vocab
        self.hidden = hidden
        self.start, self.end = shard_range(vocab, tp.rank, tp.size, "vocab_size")
        self.weight = _param((self.end - self.start, hidden), dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        mask = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(mask, 0)
        out = F.embedding(local, self.weight).masked_fill(mask.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)

    def load_full(self, full: torch.Tensor) -> None:
        if tuple(full.shape) != (self.vocab, self.hidden):
            raise ValueError(f"weights: expected shape {(self.vocab, self.hidden)}, got "
                             f"{tuple(full.shape)}")
        self.weight.data.copy_(full[self.start:self.end].to(self.weight.dtype))


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocab slice, all-gathered to ``[n, vocab]``."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        return self.tp.all_gather_last_dim(logits)
