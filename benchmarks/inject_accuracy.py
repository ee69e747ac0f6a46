"""Ground truth, measured: does the diagnosis recover a host delay we inject ourselves?

    python -m benchmarks.inject_accuracy [--delays-ms 5 20] [--requests 8] [--max-new 24] [--repeats 5]
                                         [--layers 16]  # the default model has 2: a ~1 ms forward

The engine (CPU, probes on, one worker reused) runs the same greedy workload — ``--requests``
prompts submitted at once, ``--max-new`` tokens each — with ``--inject <stage>=US`` in each stage
(``sched``: inside ``sched.schedule``; ``prep``: inside ``prep.batch``; ``result``: inside
``sched.result``; one busy-wait per step), at each delay, in the normal and the overlap loop, plus
one run per loop without injection (the baseline; with ``--repeats N``, each figure is the median
of N runs: the run with the median bubble total). Each probe trace is read and diagnosed by
``srtscope.analyzers`` as any trace would be.

Per run:
- ``in_window``: injected time inside the device's active window (first forward start to last
  forward end — the window bubbles are measured in; the first steps' sched/prep and the last
  result fall outside it);
- ``hidden``: the part of the injected busy-waits that overlaps device activity (the forward
  spans, the CPU run's stand-ins for device work) — measured in the same run. In the overlap loop
  the forward of step t runs while the host schedules t+1; in the normal loop it is ~0;
- ``expected`` = in_window - hidden: what should show up as bubbles of the injected class;
- ``recovered``: bubble time of the injected stage's class (scheduler for sched/result, prep for
  prep) in the diagnosis less the baseline's; ``total Δ``: all bubbles less the baseline's;
- ``named``: whether the verdict's bottleneck is the injected class.

Targets: normal loop — the injected class named and recovered within 10% of in_window; overlap
loop — recovered within 10% of in_window of ``expected`` (only the unhidden rest is bubbles).
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from typing import Any

import torch

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.engine.config import EngineConfig, FaultInjection, ModelConfig
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.probes import ranges
from srtscope.probes.recorder import get_recorder
from srtscope.probes.stages import Stage

STAGES = {"sched": (Stage.SCHED_SCHEDULE.value, "scheduler"),
          "prep": (Stage.PREP_BATCH.value, "prep"),
          "result": (Stage.SCHED_RESULT.value, "scheduler")}
FORWARD = (Stage.RUN_EAGER.value, Stage.RUN_GRAPH_REPLAY.value)
TOLERANCE = 0.10


@dataclasses.dataclass(frozen=True)
class Run:
    """One diagnosed run; times in ns."""

    loop: str
    stage: str | None
    delay_ns: int
    steps: int
    window_ns: int
    by_class: dict[str, int]
    bubbles_ns: int
    bottleneck: str
    injected: tuple[tuple[int, int], ...]   # (start, end) of each injected busy-wait


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def run_once(worker: TpModelWorker, base: EngineConfig, prompts: list[list[int]], max_new: int,
             overlap: bool, stage: str | None, delay_us: int) -> tuple[Run, list]:
    inj = FaultInjection(**({f"{stage}_us": delay_us} if stage else {}))
    cfg = dataclasses.replace(base, enable_overlap=overlap, inject=inj)
    rec = get_recorder()
    rec.clear()
    with tempfile.TemporaryDirectory() as tmp, Engine(cfg, worker=worker) as eng:
        eng.generate(prompts, {"max_new_tokens": max_new, "ignore_eos": True})
        spans = rec.spans()
        paths = eng.write_traces(tmp)
        diag = diagnose(load_timeline([str(paths["probe"])])).to_json()
    rec.clear()
    main = [s for s in spans if s.name == Stage.LOOP_STEP.value]
    tid = main[0].tid
    loops = sorted((s for s in main if s.tid == tid), key=lambda s: s.start_ns)
    injected: list[tuple[int, int]] = []
    if stage:
        name = STAGES[stage][0]
        d = delay_us * 1000
        for lp in loops:   # one injected range per iteration that ran the stage (None: it did not)
            hit = [s for s in spans if s.name == name and s.tid == tid and "part" not in s.attrs
                   and lp.start_ns <= s.start_ns < lp.end_ns]
            injected.append((hit[0].start_ns, hit[0].start_ns + d) if hit else (0, 0))
    b = diag["bubbles"]
    return Run("overlap" if overlap else "normal", stage, delay_us * 1000, len(loops),
               int(b["window_ns"]), {k: int(v) for k, v in b["by_class"].items()}, int(b["total_ns"]),
               diag["verdict"]["bottleneck"], tuple(injected)), spans


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def figures(run: Run, spans: list, baseline: Run) -> dict[str, Any]:
    busy = _union([(s.start_ns, s.end_ns) for s in spans if s.name in FORWARD])
    w0, w1 = busy[0][0], busy[-1][1]
    assert run.stage is not None
    in_window = sum(_overlap(a, b, w0, w1) for a, b in run.injected if b)
    hidden = sum(_overlap(a, b, c, d) for a, b in run.injected if b for c, d in busy)
    cls = STAGES[run.stage][1]
    return {"in_window": in_window, "hidden": hidden, "expected": in_window - hidden,
            "recovered": run.by_class[cls] - baseline.by_class[cls],
            "total_delta": run.bubbles_ns - baseline.bubbles_ns, "named": run.bottleneck == cls,
            "class": cls}


def _median_run(runs: list[tuple[Run, list]]) -> tuple[Run, list]:
    """The run whose bubble total is the median (keeps one run's spans for its figures)."""
    ordered = sorted(runs, key=lambda r: r[0].bubbles_ns)
    return ordered[len(ordered) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[5.0, 20.0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16, help="decoder layers of the tiny model (the engine default is 2)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    base = EngineConfig(device="cpu", max_running_requests=max(8, args.requests),
                        max_total_tokens=8192, enable_probes=True,
                        model=ModelConfig(num_layers=args.layers))
    worker = TpModelWorker(base)
    prompts = [[(11 * i + j) % 250 + 1 for j in range(args.prompt_len)] for i in range(args.requests)]
    rows = []
    try:
        for overlap in (False, True):
            run_once(worker, base, prompts, 4, overlap, None, 0)            # warm-up
            baseline, _ = _median_run([run_once(worker, base, prompts, args.max_new, overlap, None, 0)
                                       for _ in range(args.repeats)])
            rows.append((baseline, None))
            for stage in STAGES:
                for ms in args.delays_ms:
                    us = int(ms * 1000)
                    run, spans = _median_run([run_once(worker, base, prompts, args.max_new, overlap,
                                                       stage, us) for _ in range(args.repeats)])
                    rows.append((run, figures(run, spans, baseline)))
    finally:
        ranges.disable()
    ms = 1e6
    print(f"\ninjected host delay vs the diagnosis (CPU, {args.requests} requests x {args.max_new} "
          f"tokens, {args.layers} layers, torch threads={args.threads}, median of {args.repeats}); "
          f"times in ms over the whole run")
    print(f"{'loop':<8}{'inject':<15}{'steps':>6}{'verdict':>10}{'named':>7}{'in_window':>10}"
          f"{'hidden':>8}{'expected':>9}{'recovered':>10}{'total Δ':>9}{'error':>8}  check")
    ok_all = True
    for run, f in rows:
        if f is None:
            print(f"{run.loop:<8}{'none':<15}{run.steps:>6}{run.bottleneck:>10}{'':>7}{'':>10}{'':>8}"
                  f"{'':>9}{'':>10}{'':>9}{'':>8}  baseline: bubbles {run.bubbles_ns / ms:.1f} "
                  f"(scheduler {run.by_class['scheduler'] / ms:.1f}, prep {run.by_class['prep'] / ms:.1f}"
                  f") of a {run.window_ns / ms:.1f} window")
            continue
        if run.loop == "normal":
            err = (f["recovered"] - f["in_window"]) / f["in_window"]
            ok = f["named"] and abs(err) <= TOLERANCE
            check = f"{f['class']} named, recovered within {TOLERANCE:.0%} of in_window"
        else:
            err = (f["recovered"] - f["expected"]) / f["in_window"]
            ok = abs(err) <= TOLERANCE
            check = f"{f['class']} bubbles = expected within {TOLERANCE:.0%} of in_window"
        ok_all &= ok
        label = f"{run.stage}={run.delay_ns // 1000}us"
        print(f"{run.loop:<8}{label:<15}{run.steps:>6}{run.bottleneck:>10}{'yes' if f['named'] else 'no':>7}"
              f"{f['in_window'] / ms:>10.1f}{f['hidden'] / ms:>8.1f}{f['expected'] / ms:>9.1f}"
              f"{f['recovered'] / ms:>10.1f}{f['total_delta'] / ms:>9.1f}{err:>+8.1%}  "
              f"{'ok' if ok else 'MISS'}: {check}")
    print(f"\nall checks {'met' if ok_all else 'NOT met'}; {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
