"""Helpers for the tensor-parallel tests: small workloads and a spawned two-rank gloo check of the
consensus hash (module-level functions, so ``spawn`` can import them)."""
from __future__ import annotations

import random
from types import SimpleNamespace

from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.request import SamplingParams
from srtscope.engine.workloads import WorkItem, Workload


def mixed_workload(n: int = 6, max_new_tokens: int = 6, seed: int = 0) -> Workload:
    """Greedy requests (tag g*) with a shared prefix, plus seeded and unseeded sampled ones (s*)."""
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(24)]
    items = []
    for i in range(n):
        prompt = system + [rng.randrange(256) for _ in range(rng.randint(3, 20))]
        if i % 3 == 2:
            sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=0.8,
                                top_k=40, seed=(i if i % 2 else None))
            tag = f"s{i}"
        else:
            sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
            tag = f"g{i}"
        items.append(WorkItem(prompt, sp, tag=tag))
    return Workload("tp-test", items)


def fake_batch(rank: int) -> SimpleNamespace:
    """A decode batch whose last token differs by rank: the ranks must disagree."""
    req = SimpleNamespace(rid="req-x", origin_input_ids=[1, 2, 3], output_ids=[7, 8 + rank],
                          extend_input_len=0)
    return SimpleNamespace(reqs=[req], forward_mode=ForwardMode.DECODE)


def consensus_rank_main(rank: int, world: int, port: int, out_q) -> None:
    """Spawned rank: one agreeing check (idle step), then a disagreeing one; reports the error."""
    from datetime import timedelta

    import torch.distributed as dist

    from srtscope.engine.distributed.sync import TpDivergence, TpSync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    try:
        sync = TpSync(rank, world, dist.group.WORLD)
        sync.check_consensus(0, None)
        try:
            sync.check_consensus(1, fake_batch(rank))
            out_q.put((rank, None))
        except TpDivergence as exc:
            out_q.put((rank, str(exc)))
    finally:
        dist.destroy_process_group()
