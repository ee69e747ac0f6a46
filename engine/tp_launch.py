"""Tensor-parallel runs: ``run_tp_workload`` (the engine starts N ranks on this machine) and a
module entry point for ranks that ``torchrun`` starts, on one machine or several:

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank K --master-addr HOST --master-port 29500 \\
        -m srtscope.engine.tp_launch --workload shared-prefix --requests 32 --out runs/tp2

Each rank writes ``probe.rank<r>.json`` and ``chrome.rank<r>.json`` into its own ``--out``; rank 0
also writes ``report.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from srtscope.engine.config import EngineConfig, FaultInjection, ModelConfig
from srtscope.engine.distributed.launch import launch_ranks
from srtscope.engine.workloads import GENERATORS, Workload, make_workload


def run_tp_workload(config: EngineConfig, workload: Workload, out: Path, timeout_s: float = 120.0,
                    kill_rank_at_step: tuple[int, int] | None = None) -> tuple[dict, dict]:
    """Run ``workload`` on ``config.tp_size`` spawned ranks; traces into ``out``.

    Returns (rank 0's ``WorkloadReport.as_dict()``, {"probe": [paths], "chrome": [paths],
    "outputs": {tag: token ids}, "ranks": [per-rank summaries]}). ``timeout_s`` bounds every
    collective and the rendezvous (seconds); ``kill_rank_at_step=(rank, step)`` SIGKILLs that rank
    at that step (fault injection). A failed rank raises ``RuntimeError``.
    """
    if config.tp_size < 2:
        raise ValueError(f"tp_size: run_tp_workload needs >= 2, got {config.tp_size}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = launch_ranks(config, workload, out, timeout_s, kill_rank_at_step)
    lead = summaries[0]
    paths = {"probe": [Path(s["paths"]["probe"]) for s in summaries if s.get("paths")],
             "chrome": [Path(s["paths"]["chrome"]) for s in summaries if s.get("paths")],
             "outputs": lead["outputs"],
             "ranks": [{k: v for k, v in s.items() if k not in ("report", "outputs")}
                       for s in summaries]}
    return lead["report"], paths


def _parse_inject(items: list[str]) -> FaultInjection:
    kw: dict[str, int] = {}
    for item in items:
        key, _, val = item.partition("=")
        if key == "straggler":
            us, _, rank = val.partition("@")
            kw.update(straggler_us=int(us), straggler_rank=int(rank or 0))
        elif key in ("sched", "prep", "result"):
            kw[f"{key}_us"] = int(val)
        else:
            raise ValueError(f"inject: unknown fault {key!r} (sched, prep, result, straggler)")
    return FaultInjection(**kw)


def _workload_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """Generator arguments for about ``--requests`` requests of the chosen workload."""
    n, m = a.requests, a.max_new_tokens
    return {"shared-prefix": {"num_requests": n, "max_new_tokens": m},
            "multi-turn": {"num_sessions": max(1, n // 4), "turns": 4, "max_new_tokens": m},
            "agent-tree": {"num_roots": max(1, round(n / 15)), "max_new_tokens": m},
            "random": {"num_requests": n, "output_len": (1, m)}}[a.workload]


def main(argv: list[str] | None = None) -> int:
    """One rank under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)."""
    from srtscope.engine.distributed.rank import run_rank, spec_from_env

    ap = argparse.ArgumentParser(prog="python -m srtscope.engine.tp_launch", description=main.__doc__)
    ap.add_argument("--workload", default="shared-prefix", choices=list(GENERATORS))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--inject", action="append", default=[], help="e.g. straggler=2000@1 (us@rank)")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    spec = spec_from_env(a.timeout_s)
    config = EngineConfig(model=ModelConfig(seed=a.seed), device=a.device, tp_size=spec.world_size,
                          enable_overlap=a.overlap, seed=a.seed, inject=_parse_inject(a.inject))
    workload = (make_workload(a.workload, seed=a.seed, **_workload_kwargs(a))
                if spec.rank == 0 else None)
    a.out.mkdir(parents=True, exist_ok=True)
    summary = run_rank(config, workload, a.out, spec)
    if spec.rank == 0:
        (a.out / "report.json").write_text(json.dumps(summary["report"], indent=1))
        print(json.dumps(summary["report"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError) as exc:
        sys.stderr.write(f"srtscope tp rank: {type(exc).__name__}: {exc}\n")
        sys.exit(1)
