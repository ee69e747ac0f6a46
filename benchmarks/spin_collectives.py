"""Two ranks' model collectives over shared memory, each rank spinning until its peer arrives.

A GPU-like transport for the CPU benchmarks: NCCL's kernels wait on the device for a late peer and
move the data as soon as it arrives, so a straggler's lateness adds to the step one for one and
ranks that arrive together pay almost nothing. gloo on a 2-core machine behaves otherwise: a waiting
rank sleeps, and the wake-ups of both ranks and their transport threads cost ~1.4 ms a collective
when the ranks arrive together — more than a late rank's lateness, which partly replaces them.

``python -m benchmarks.spin_collectives [--floats 3072] [--n 400]`` times both transports: two ranks,
``--n`` back-to-back all-reduces of ``--floats`` float32 values each, median µs per all-reduce.

``SpinPair(buf, seq, rank).install(group)`` routes ``torch.distributed.all_reduce`` and
``all_gather`` on ``group`` (the engine's model group) through shared memory; other groups (the
engine's control group) keep their backend. ``buf`` (2 x 2 x ``floats``, float32) and ``seq`` (2,
int64) come from ``SpinPair.shared(floats)`` in the parent, shared with both rank processes.

Protocol, collective k (both ranks call the same collectives in the same order): write the input into
slot ``[k % 2, rank]``, publish ``seq[rank] = k``, spin until ``seq[peer] >= k``, read both slots.
Two slot sets suffice: a rank that passed collective k-1 knows its peer has finished reading k-2.
NOTE: this relies on x86's store order (data stored before the counter is seen before it).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT_S = 120.0


class SpinPair:
    def __init__(self, buf: torch.Tensor, seq: torch.Tensor, rank: int) -> None:
        if rank not in (0, 1):
            raise ValueError(f"rank must be 0 or 1, got {rank}")
        self.buf, self.rank, self.peer = buf, rank, 1 - rank
        self.seq = seq.numpy()
        self.k = 0

    @staticmethod
    def shared(floats: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(buf, seq) in shared memory, for ``floats`` float32 values per collective at most."""
        return torch.zeros(2, 2, floats).share_memory_(), torch.zeros(2, dtype=torch.int64).share_memory_()

    def _meet(self, x: torch.Tensor) -> torch.Tensor:
        """Publish ``x`` for collective k and wait for the peer's: the slot set of k (2 x n)."""
        n = x.numel()
        if x.dtype != self.buf.dtype or n > self.buf.shape[2]:
            raise ValueError(f"spin collectives take float32 up to {self.buf.shape[2]} values, "
                             f"got {x.dtype} x {n}")
        self.k += 1
        slots = self.buf[self.k % 2, :, :n]
        slots[self.rank].copy_(x.reshape(-1))
        self.seq[self.rank] = self.k
        deadline = time.monotonic() + TIMEOUT_S
        while self.seq[self.peer] < self.k:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {self.peer} did not reach collective {self.k} in {TIMEOUT_S:.0f} s")
        return slots

    def all_reduce(self, x: torch.Tensor) -> None:
        slots = self._meet(x)
        x.copy_((slots[0] + slots[1]).view_as(x))        # the same order on both ranks: equal sums

    def all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        slots = self._meet(x)
        for i, p in enumerate(parts):
            p.copy_(slots[i].view_as(x))

    def install(self, model_group: Any) -> None:
        """Route ``dist.all_reduce`` (sums) and ``dist.all_gather`` on ``model_group`` here."""
        reduce, gather = dist.all_reduce, dist.all_gather

        def all_reduce(x, op=dist.ReduceOp.SUM, group=None, async_op=False):
            if group is not model_group or op != dist.ReduceOp.SUM or async_op:
                return reduce(x, op=op, group=group, async_op=async_op)
            self.all_reduce(x)
            return None

        def all_gather(parts, x, group=None, async_op=False):
            if group is not model_group or async_op:
                return gather(parts, x, group=group, async_op=async_op)
            self.all_gather(parts, x)
            return None

        dist.all_reduce = all_reduce        # type: ignore[assignment]
        dist.all_gather = all_gather        # type: ignore[assignment]


def two_ranks(target: Any, *args: Any, timeout_s: float = 300.0) -> dict[int, Any]:
    """Run ``target(rank, store_port, *args, results)`` in two spawned processes (a TCPStore for them is
    served from here); each puts ``(rank, value)`` on ``results``. Returns rank -> value."""
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, store.port, *args, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=timeout_s) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return got


def _timing_rank(rank: int, port: int, floats: int, n: int, buf: torch.Tensor, seq: torch.Tensor,
                 results: Any) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    x = torch.ones(floats)
    out = {}
    for name in ("gloo", "spin"):
        if name == "spin":
            SpinPair(buf, seq, rank).install(dist.group.WORLD)
        took = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            dist.all_reduce(x, group=dist.group.WORLD)
            took.append(time.perf_counter_ns() - t0)
        out[name] = statistics.median(took) / 1e3
    results.put((rank, out))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="median all-reduce time, gloo vs spinning shared memory")
    ap.add_argument("--floats", type=int, default=3072, help="float32 values per all-reduce (3072 = 12 KB)")
    ap.add_argument("--n", type=int, default=400)
    a = ap.parse_args(argv)
    buf, seq = SpinPair.shared(a.floats)
    got = two_ranks(_timing_rank, a.floats, a.n, buf, seq)
    for name in ("gloo", "spin"):
        print(f"{name}: " + ", ".join(f"rank {r} {got[r][name]:.1f} µs" for r in sorted(got))
              + f" per all-reduce of {a.floats * 4 / 1024:g} KiB (median of {a.n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
