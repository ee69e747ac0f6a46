"""Tensor-parallel state and collectives.

With ``tp_size == 1`` nothing here touches ``torch.distributed``: the collectives return their
input unchanged and emit no probe. With ``tp_size > 1`` they run over ``group`` (gloo on the CPU,
NCCL on CUDA), each inside a ``comm.all_reduce`` range carrying ``bytes`` and ``dtype`` — and, on
CUDA with probes on, a ``device_ns`` attribute (ns) from ``timer`` (``probes.cuda_timer.DeviceTimer``,
shared with the model runner), filled in once its events complete.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from srtscope.probes.cuda_timer import DeviceTimer
from srtscope.probes.ranges import is_enabled, stage


@dataclass
class TPState:
    rank: int = 0
    size: int = 1
    group: Any = None
    straggler_rank: int = -1   # fault injection: this rank sleeps before each collective
    straggler_us: int = 0
    # device times of the collectives' spans (the worker passes the runner's timer)
    timer: DeviceTimer = field(default_factory=DeviceTimer)
    in_graph_capture: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tp_size: must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank: must be in [0, {self.size}), got {self.rank}")

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def _straggle(self) -> None:
        if self.straggler_us > 0 and self.rank == self.straggler_rank:
            time.sleep(self.straggler_us / 1e6)

    def _timed(self, name: str, x: torch.Tensor, fn) -> Any:
        attrs = {"bytes": int(x.numel() * x.element_size()), "dtype": str(x.dtype).replace("torch.", "")}
        if self.in_graph_capture:   # host ranges inside a captured graph fire only at capture
            return fn()
        with stage(name, **attrs) as r:
            if x.is_cuda and is_enabled():
                with self.timer.measure(attrs=getattr(r, "attrs", None)):
                    return fn()
            return fn()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the TP group (in place when distributed); identity when tp_size == 1."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        self._straggle()

        def run() -> torch.Tensor:
            dist.all_reduce(x, group=self.group)
            return x

        return self._timed("comm.all_reduce", x, run)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's shard along the last dimension (rank order)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        self._straggle()
        x = x.contiguous()

        def run() -> torch.Tensor:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x, group=self.group)
            return torch.cat(parts, dim=-1)

        # all-gather is reported as a collective too; the taxonomy has one comm stage
        return self._timed("comm.all_reduce", x, run)

    def resolve_device_times(self, synchronize: bool = False) -> None:
        """Fill ``device_ns`` into the collectives' spans whose events have completed."""
        self.timer.collect(synchronize)


def shard_range(total: int, rank: int, size: int, what: str = "dimension") -> tuple[int, int]:
    """[start, end) of ``rank``'s equal shard of ``total``."""
    if total % size != 0:
        raise ValueError(f"tp_size: {what}={total} is not divisible by tp_size={size}")
    per = total // size
    return rank * per, (rank + 1) * per
