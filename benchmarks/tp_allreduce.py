"""All-reduce time per decode step and its share of the step at tp=2 (gloo on the CPU here,
NCCL on GPUs), from each rank's probe trace; tp=1 decode step time alongside.

    python -m benchmarks.tp_allreduce [--requests 1 16] [--max-new 32] [--device cpu]

Per rank: decode steps (``loop.step`` with mode=decode), median step time, median summed
``comm.all_reduce`` time inside a step and collectives per step, and the share of decode step time
spent in them; "ctrl ms": ``sched.recv`` + ``sched.schedule`` per step (the request broadcast and
the batch-hash all-gather over the CPU group live there). Across ranks, per matched collective
(k-th on rank 0 with k-th on rank 1): the shorter of the two durations ("transfer") and the
difference ("wait" — one rank arriving first).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.tp_launch import run_tp_workload
from srtscope.engine.workloads import run_workload, shared_prefix


def _spans(path: Path) -> list[tuple[str, int, int, int, dict]]:
    doc = json.loads(path.read_text())
    sp, names = doc["spans"], doc["strings"]
    return [(names[n], s, e, t, a or {}) for n, s, e, t, a in
            zip(sp["name"], sp["start_ns"], sp["end_ns"], sp["tid"], sp["attrs"])]


def decode_figures(spans: list) -> dict[str, float]:
    """Decode-step figures of one rank (times in ms)."""
    steps = [(s, e) for n, s, e, _, a in spans if n == "loop.step" and a.get("mode") == "decode"]
    comm = sorted((s, e) for n, s, e, _, _ in spans if n == "comm.all_reduce")
    starts = np.array([s for s, _ in comm], dtype=np.int64)
    ctrl = sorted((s, e) for n, s, e, _, _ in spans if n in ("sched.recv", "sched.schedule"))
    cstarts = np.array([s for s, _ in ctrl], dtype=np.int64)
    per_step, counts, ctrl_step = [], [], []
    for s, e in steps:
        lo, hi = np.searchsorted(starts, s), np.searchsorted(starts, e)
        per_step.append(sum(ce - cs for cs, ce in comm[lo:hi]))
        counts.append(hi - lo)
        lo, hi = np.searchsorted(cstarts, s), np.searchsorted(cstarts, e)
        ctrl_step.append(sum(ce - cs for cs, ce in ctrl[lo:hi]))
    step_ns = [e - s for s, e in steps]
    return {"decode_steps": len(steps),
            "step_ms_p50": statistics.median(step_ns) / 1e6 if steps else 0.0,
            "allreduce_ms_per_step_p50": statistics.median(per_step) / 1e6 if steps else 0.0,
            "collectives_per_step": statistics.median(counts) if steps else 0,
            "ctrl_ms_per_step_p50": statistics.median(ctrl_step) / 1e6 if steps else 0.0,
            "share": sum(per_step) / sum(step_ns) if steps else 0.0}


def matched(spans0: list, spans1: list) -> dict[str, float]:
    d0 = [e - s for n, s, e, _, _ in spans0 if n == "comm.all_reduce"]
    d1 = [e - s for n, s, e, _, _ in spans1 if n == "comm.all_reduce"]
    n = min(len(d0), len(d1))
    a, b = np.array(d0[:n]), np.array(d1[:n])
    return {"collectives": n, "transfer_us_p50": float(np.median(np.minimum(a, b))) / 1e3,
            "wait_us_p50": float(np.median(np.abs(a - b))) / 1e3}


def tp1_step_ms(config: EngineConfig, workload) -> float:
    """Median tp=1 decode step (ms) with as many threads as each tp=2 rank gets."""
    import os

    import torch

    from srtscope.probes.recorder import Recorder, get_recorder, set_recorder

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    set_recorder(Recorder())
    with Engine(config) as eng:
        run_workload(eng, workload)
    steps = [s for s in get_recorder().raw_spans()
             if s[0] == "loop.step" and (s[5] or {}).get("mode") == "decode"]
    return statistics.median(s[2] - s[1] for s in steps) / 1e6 if steps else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    print(f"{'bs':>4} {'rank':>4} {'steps':>5} {'step ms':>8} {'AR ms/step':>10} {'AR/step':>7} "
          f"{'AR share':>8} {'ctrl ms':>7} {'tp1 step ms':>11} {'transfer us':>11} {'wait us':>8}")
    for n in a.requests:
        wl = shared_prefix(num_requests=n, system_len=64, user_len=(8, 32), max_new_tokens=a.max_new)
        base = EngineConfig(device=a.device, max_total_tokens=4096)
        t1 = tp1_step_ms(base, wl)
        with tempfile.TemporaryDirectory() as tmp:
            cfg = EngineConfig(device=a.device, max_total_tokens=4096, tp_size=2)
            _, paths = run_tp_workload(cfg, wl, Path(tmp))
            spans = [_spans(Path(p)) for p in paths["probe"]]
        m = matched(spans[0], spans[1])
        for r, sp in enumerate(spans):
            f = decode_figures(sp)
            print(f"{n:>4} {r:>4} {f['decode_steps']:>5} {f['step_ms_p50']:>8.3f} "
                  f"{f['allreduce_ms_per_step_p50']:>10.3f} {f['collectives_per_step']:>7} "
                  f"{f['share']:>8.1%} {f['ctrl_ms_per_step_p50']:>7.3f} {t1:>11.3f} {m['transfer_us_p50']:>11.1f} "
                  f"{m['wait_us_p50']:>8.1f}")


if __name__ == "__main__":
    main()
