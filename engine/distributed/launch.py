"""Start N ranks on this machine (torch multiprocessing, spawn) and watch them.

The launcher hosts the rendezvous store on a port the OS picks (port 0), so two runs on one machine
never collide. It waits for every rank's summary; when a rank dies or reports an error it gives
the others a short grace to report theirs, then terminates (then kills) what is left and raises
one ``RuntimeError`` naming the first failure. Ranks exit by themselves when the launcher dies.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from srtscope.engine.config import EngineConfig
from srtscope.engine.distributed.rank import RankSpec, run_rank

FAILURE_GRACE_S = 3.0   # after a first failure, how long the other ranks may take to report


def _rank_entry(config: EngineConfig, workload: Any, out: str, spec: RankSpec, results) -> None:
    try:
        summary = run_rank(config, workload, Path(out), spec)
    except BaseException as exc:  # reported to the launcher, then a non-zero exit
        msg = str(exc).strip().splitlines()
        results.put(("error", spec.rank, f"{type(exc).__name__}: {msg[0] if msg else ''}"))
        raise SystemExit(1) from exc
    results.put(("ok", spec.rank, summary))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch_ranks(config: EngineConfig, workload: Any, out: Path, timeout_s: float = 120.0,
                 kill_rank_at_step: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Run ``config.tp_size`` ranks to completion; their summaries by rank."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    world = config.tp_size
    try:
        pickle.dumps(workload)
    except Exception:
        raise ValueError(f"workload: {getattr(workload, 'name', 'this workload')!r} cannot be sent "
                         "to a spawned rank (it does not pickle: make its follow-ups module-level "
                         "callables, not closures), or start the ranks with torchrun") from None
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    try:
        for r in range(world):
            spec = RankSpec(rank=r, world_size=world, store_port=store.port, timeout_s=timeout_s,
                            parent_pid=os.getpid(),
                            kill_at_step=(kill_rank_at_step[1] if kill_rank_at_step
                                          and kill_rank_at_step[0] == r else -1))
            p = ctx.Process(target=_rank_entry, name=f"srtscope-tp-rank{r}",
                            args=(config, workload if r == 0 else None, str(out), spec, results))
            p.start()
            procs.append(p)
        return _collect(procs, results)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
        del store


def _collect(procs: list, results) -> list[dict[str, Any]]:
    world = len(procs)
    summaries: dict[int, dict] = {}
    errors: dict[int, str] = {}
    first_failure: float | None = None
    while len(summaries) < world:
        try:
            kind, rank, payload = results.get(timeout=0.2)
            if kind == "ok":
                summaries[rank] = payload
            else:
                errors[rank] = payload
        except queue.Empty:
            pass
        for r, p in enumerate(procs):
            if r not in summaries and r not in errors and p.exitcode is not None:
                if p.exitcode != 0 or not _drain_one(results, summaries, errors, r):
                    errors[r] = f"died ({_exit_text(p.exitcode)})"
        if errors:
            first_failure = first_failure or time.monotonic()
            settled = all(r in summaries or r in errors for r in range(world))
            if settled or time.monotonic() - first_failure > FAILURE_GRACE_S:
                break
    if errors:
        # the root cause first: a rank that died on its own, then one that reported an error
        order = sorted(errors, key=lambda r: (not errors[r].startswith("died"), r))
        detail = "; ".join(f"rank {r}: {errors[r]}" for r in order)
        raise RuntimeError(f"tensor-parallel run failed ({len(errors)} of {world} ranks): {detail}")
    return [summaries[r] for r in range(world)]


def _drain_one(results, summaries: dict, errors: dict, rank: int) -> bool:
    """A rank exited 0: its summary may still be in the pipe; wait for it briefly."""
    deadline = time.monotonic() + 2.0
    while rank not in summaries and rank not in errors and time.monotonic() < deadline:
        try:
            kind, r, payload = results.get(timeout=0.1)
        except queue.Empty:
            continue
        (summaries if kind == "ok" else errors)[r] = payload
    return rank in summaries or rank in errors
