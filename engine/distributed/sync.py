"""Control plane of a TP run: rank 0 broadcasts new requests, aborts and the stop signal over the
CPU (gloo) group at each ``sched.recv``; every step the ranks compare a hash of their batch.

NOTE: the control collectives use their own gloo group, never the model group: in the overlap loop
the forward (model collectives) runs on a worker thread while the scheduler thread runs these, and
two threads must not interleave collectives on one group.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from srtscope.engine.request import Req

_STOP = object()   # the stop signal (sent as a header flag, never pickled)


class TpStop(Exception):
    """Raised on a follower rank when rank 0 has broadcast the stop signal."""


class TpDivergence(RuntimeError):
    """Ranks chose different batches for the same step."""


@dataclass(frozen=True)
class _NewReq:
    rid: str
    input_ids: list[int]
    params: Any
    max_new_tokens: int
    tag: str


class TpSync:
    """One rank's side of the control plane (``group``: the CPU group; None for tests of one)."""

    def __init__(self, rank: int, world_size: int, group: Any,
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, {world_size}), got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.eos_token_ids = tuple(eos_token_ids)
        self.steps_checked = 0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def _broadcast(self, payload: Any) -> Any:
        """Rank 0's payload on every rank: a 2-int header (stop flag, pickled size), then the
        pickled bytes only when there are any (a step with no news costs one small collective)."""
        import pickle

        import torch.distributed as dist

        if self.is_leader:
            data = b"" if payload is None or payload is _STOP else pickle.dumps(payload)
            head = torch.tensor([int(payload is _STOP), len(data)], dtype=torch.int64)
        else:
            head = torch.zeros(2, dtype=torch.int64)
        dist.broadcast(head, src=0, group=self.group)
        stop, size = int(head[0]), int(head[1])
        if stop:
            return _STOP
        if size == 0:
            return None
        if self.is_leader:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(size, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.group)
        return payload if self.is_leader else pickle.loads(buf.numpy().tobytes())

    def exchange(self, inbox: list[Req], aborts: list[str]) -> tuple[list[Req], list[str]]:
        """Rank 0: send ``inbox`` and ``aborts`` (rids); others: receive them as fresh requests.
        Raises ``TpStop`` on a follower when rank 0 sent the stop signal instead."""
        if self.is_leader:
            msg = None if not (inbox or aborts) else {
                "aborts": list(aborts),
                "reqs": [_NewReq(r.rid, list(r.origin_input_ids), r.sampling_params,
                                 r.max_new_tokens, r.tag) for r in inbox]}
            self._broadcast(msg)
            return inbox, list(aborts)
        msg = self._broadcast(None)
        if msg is _STOP:
            raise TpStop()
        if msg is None:
            return [], []
        reqs = []
        for n in msg["reqs"]:
            req = Req(list(n.input_ids), n.params, rid=n.rid, eos_token_ids=self.eos_token_ids,
                      max_new_tokens=n.max_new_tokens)
            req.tag = n.tag
            reqs.append(req)
        return reqs, list(msg["aborts"])

    def send_stop(self) -> None:
        """Rank 0: tell the followers to leave their loops (they raise ``TpStop``)."""
        if not self.is_leader:
            raise ValueError("rank: only rank 0 sends the stop signal")
        self._broadcast(_STOP)

    def check_consensus(self, step: int, batch: Any) -> None:
        """All-gather this step's batch hash; ``TpDivergence`` on every rank if any differs."""
        import torch.distributed as dist

        h = batch_hash(step, batch)
        mine = torch.tensor([h], dtype=torch.int64)
        parts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.group)
        hashes = [int(p.item()) for p in parts]
        self.steps_checked += 1
        if len(set(hashes)) > 1:
            raise TpDivergence(
                f"TP ranks diverged at step {step}: batch hashes differ across ranks "
                f"({', '.join(f'rank{r}={h & 0xFFFFFFFF:08x}' for r, h in enumerate(hashes))}); "
                f"rank {self.rank} chose {describe_batch(batch)}")


def batch_composition(step: int, batch: Any) -> tuple:
    """What every rank must agree on: step, mode, and per request rid, lengths and last token."""
    if batch is None:
        return (step, "idle")
    rows = tuple((r.rid, len(r.origin_input_ids), len(r.output_ids), r.extend_input_len,
                  r.output_ids[-1] if r.output_ids else -1) for r in batch.reqs)
    return (step, batch.forward_mode.name, rows)


def batch_hash(step: int, batch: Any) -> int:
    """A signed 64-bit hash of ``batch_composition`` (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(repr(batch_composition(step, batch)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def describe_batch(batch: Any) -> str:
    if batch is None:
        return "idle"
    rids = [r.rid for r in batch.reqs]
    shown = ", ".join(rids[:4]) + (", ..." if len(rids) > 4 else "")
    return f"{batch.forward_mode.name.lower()} bs={len(rids)} [{shown}]"
