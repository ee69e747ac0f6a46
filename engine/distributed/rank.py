"""One tensor-parallel rank: process groups, an Engine over a TP worker, the leader or follower
loop, and this rank's traces.

Every rank runs the same scheduler. Rank 0 (the leader) drives the workload; its new requests reach
the others at each ``sched.recv``; the followers step until rank 0 broadcasts the stop signal.
Sampling: every rank samples the full (all-gathered) logits with the same sampler seed
(``EngineConfig.seed``) and per-request seeds, so the tokens agree without a broadcast; the per-step
batch hash includes each request's last token, so a disagreement is a ``TpDivergence`` error.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.distributed.sync import TpStop, TpSync


@dataclass(frozen=True)
class RankSpec:
    """Where and how one rank joins. ``store_port`` None: ``env://`` (torchrun's variables)."""

    rank: int
    world_size: int
    store_host: str = "127.0.0.1"
    store_port: int | None = None
    timeout_s: float = 120.0        # gloo/NCCL collective and rendezvous timeout, seconds
    parent_pid: int = 0             # > 0: exit when that process is gone (no orphans)
    kill_at_step: int = -1          # fault injection: SIGKILL this rank at that step (tests)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: must be in [0, {self.world_size}), got {self.rank}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")


def spec_from_env(timeout_s: float = 120.0) -> RankSpec:
    """The rank torchrun started: RANK and WORLD_SIZE (MASTER_ADDR/MASTER_PORT used by env://)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"environment: {', '.join(missing)} not set (start this under torchrun)")
    return RankSpec(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                    timeout_s=timeout_s)


def init_groups(spec: RankSpec, device: str) -> tuple[Any, Any]:
    """(model group, CPU control group): NCCL (CUDA) or gloo for the model, gloo for control."""
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    timeout = timedelta(seconds=spec.timeout_s)
    if spec.store_port is None:
        dist.init_process_group(backend, init_method="env://", rank=spec.rank,
                                world_size=spec.world_size, timeout=timeout)
    else:
        store = dist.TCPStore(spec.store_host, spec.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=spec.rank, world_size=spec.world_size,
                                timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    return dist.group.WORLD, cpu_group


def _watch_parent(parent_pid: int) -> None:
    """Exit this rank when its launcher is gone (os.getppid changes to the reaper)."""
    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                sys.stderr.write("srtscope tp rank: launcher process is gone; exiting\n")
                os._exit(3)
            time.sleep(0.5)
    threading.Thread(target=run, name="srtscope-parent-watch", daemon=True).start()


def run_rank(config: EngineConfig, workload: Any, out: Path, spec: RankSpec) -> dict[str, Any]:
    """Run this rank to the end of the workload; returns a summary (rank 0: with the report)."""
    import torch.distributed as dist

    from srtscope.engine.engine import Engine
    from srtscope.engine.runner.tp_worker import TpModelWorker
    from srtscope.engine.scheduler.scheduler import eos_token_ids_of
    from srtscope.engine.workloads import run_workload
    from srtscope.probes.recorder import Recorder, set_recorder
    from srtscope.probes.torch_capture import from_env

    if config.tp_size != spec.world_size:
        raise ValueError(f"tp_size: config says {config.tp_size}, the launcher started "
                         f"{spec.world_size} ranks")
    if spec.rank == 0 and workload is None:
        raise ValueError("workload: rank 0 needs one")
    if spec.parent_pid:
        _watch_parent(spec.parent_pid)
    device = config.resolved_device()
    if device == "cpu":   # NOTE: ranks share the cores; more threads each only oversubscribe
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
    set_recorder(Recorder(rank=spec.rank, world_size=spec.world_size))
    model_group, cpu_group = init_groups(spec, device)
    try:
        worker = TpModelWorker(config, rank=spec.rank, tp_size=spec.world_size, group=model_group)
        # under `srtscope capture --backend torch`, each rank writes its own Kineto trace
        sync = TpSync(spec.rank, spec.world_size, cpu_group,
                      eos_token_ids=eos_token_ids_of(worker, config))
        with from_env(rank=spec.rank), Engine(config, worker=worker, tp_sync=sync) as engine:
            if spec.kill_at_step >= 0:
                _arm_kill(engine, spec.kill_at_step)
            summary: dict[str, Any] = {"rank": spec.rank, "world_size": spec.world_size}
            if spec.rank == 0:
                report = run_workload(engine, workload)
                sync.send_stop()
                summary["report"] = report.as_dict()
                summary["outputs"] = report.outputs
            else:
                try:
                    while True:
                        engine.step()
                except TpStop:
                    pass
            engine.check_invariants()     # the idle invariant, on every rank
            summary.update(steps=engine.scheduler.step, consensus_checks=sync.steps_checked,
                           invariants_ok=True)
            paths = engine.write_traces(out, rank=spec.rank) if config.enable_probes else {}
            summary["paths"] = {k: str(v) for k, v in paths.items()}
        return summary
    finally:
        dist.destroy_process_group()


def _arm_kill(engine: Any, at_step: int) -> None:
    """Fault injection: this rank SIGKILLs itself when its scheduler reaches ``at_step``."""
    step = engine.step

    def killing_step() -> bool:
        if engine.scheduler.step >= at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return step()
    engine.step = killing_step
