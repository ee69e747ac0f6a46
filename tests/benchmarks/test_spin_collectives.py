"""The what-if benchmark's spinning collectives (benchmarks/spin_collectives.py) give gloo's answers.

Two spawned ranks run a sequence of all-reduces and all-gathers of different sizes through
``SpinPair`` (more than two in a row: the two slot sets are reused), one all-reduce on another group
(it must still go through gloo), and one float64 tensor (refused with a clear error).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from benchmarks.spin_collectives import SpinPair, two_ranks  # noqa: E402

SIZES = [1, 7, 3072, 5, 40_000, 64]        # floats per collective, in call order


def _rank(rank: int, port: int, buf, seq, results) -> None:
    """One rank; puts (rank, (results, other group's sum, float64 error)) or (rank, (error text, ...))."""
    try:
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        other = dist.new_group(backend="gloo")
        SpinPair(buf, seq, rank).install(dist.group.WORLD)
        out = []
        for n in SIZES:
            x = torch.arange(n, dtype=torch.float32) * (rank + 1) + 0.25
            dist.all_reduce(x, group=dist.group.WORLD)
            parts = [torch.empty(n) for _ in range(2)]
            dist.all_gather(parts, torch.full((n,), float(rank)), group=dist.group.WORLD)
            out.append((x.tolist(), [q.tolist() for q in parts]))     # plain lists: the child may exit first
        y = torch.ones(4) * (rank + 1)
        dist.all_reduce(y, group=other)                     # not the model group: gloo
        try:
            dist.all_reduce(torch.ones(3, dtype=torch.float64), group=dist.group.WORLD)
            err = ""
        except ValueError as exc:
            err = str(exc)
        results.put((rank, (out, y.tolist(), err)))
        dist.barrier(group=other)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((rank, (f"{type(exc).__name__}: {exc}", None, None)))


def test_spin_collectives_match_gloo_answers():
    buf, seq = SpinPair.shared(max(SIZES))
    got = two_ranks(_rank, buf, seq, timeout_s=120)
    assert seq.tolist() == [2 * len(SIZES)] * 2          # every model collective went through shared memory
    for rank in (0, 1):
        out, y, err = got[rank]
        assert not isinstance(out, str), out
        for n, (x, parts) in zip(SIZES, out):
            want = torch.arange(n, dtype=torch.float32) * 3 + 0.5    # (rank 0's + rank 1's)
            assert x == want.tolist(), (rank, n)
            assert parts == [[0.0] * n, [1.0] * n], (rank, n)
        assert y == [3.0] * 4
        assert "float32" in err and "float64" in err
