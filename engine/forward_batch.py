"""ForwardBatch: one step's flattened device tensors, built from a ScheduleBatch, consumed by the
worker, dropped after the forward. Never holds a Req.

Layout (num_tokens = sum of new tokens over the batch; bs = number of requests):
- ``input_ids``, ``positions``, ``out_cache_loc``: [num_tokens], int64 — row-major by request
- ``seq_lens``: [bs] int64 — full length after this step (prefix + new tokens)
- ``req_pool_indices``: [bs] int64 — rows of ``req_to_token``
- ``req_to_token``: [max_requests, context_length] int32 — the pool's table (a reference, not a copy)
- extend only: ``extend_prefix_lens`` / ``extend_seq_lens`` [bs] (cached prefix / new tokens),
  with ``*_cpu`` Python lists of the same
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

from srtscope.probes.stages import StepMode


class ForwardMode(IntEnum):
    EXTEND = 1   # prefill (possibly with a cached prefix, possibly a chunk)
    DECODE = 2   # one new token per request
    MIXED = 3    # a prefill chunk together with decode requests (decode rows extend by 1)
    IDLE = 4     # nothing to run (TP ranks with no work still join collectives)

    @property
    def is_extend_like(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    @property
    def label(self) -> str:
        """The ``mode`` attribute of probe ranges (``probes.stages.StepMode`` values)."""
        return _LABELS[self]


_LABELS = {m: StepMode(m.name.lower()).value for m in ForwardMode}


@dataclass
class SamplingBatchInfo:
    """Per-row sampling parameters as tensors of shape [bs] on the batch's device.

    ``seeds[i]`` (None = unseeded) with ``output_lens[i]`` makes a seeded row's draw depend only on
    (seed, position in the output), so chunking, retraction and overlap do not change it.
    """

    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor           # int64; <= 0 means no top-k
    min_ps: torch.Tensor
    seeds: list[int | None]
    output_lens: list[int]
    is_all_greedy: bool


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    req_to_token: torch.Tensor
    out_cache_loc: torch.Tensor
    sampling: SamplingBatchInfo | None = None
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    # rows whose last token's logits are sampled (a chunked request's chunk is not sampled)
    sample_rows: list[int] | None = None
    attn_metadata: Any = None   # filled by the attention backend's init_forward_metadata
    step: int = -1              # engine step number, for probes

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
