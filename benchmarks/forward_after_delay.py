"""How much slower the engine's CPU forward runs right after the host did something else.

    python -m benchmarks.forward_after_delay [--layers 16 --hidden 128 --intermediate 352] [--repeats 4]

The what-if keeps device work as measured; on the CPU the "device" is the host core, so a host delay
before a forward may change the forward itself. This measures it: one worker reused (probes off, one
thread), 8 requests x 24 greedy tokens, a delay of each kind injected into ``sched.schedule`` every
step (the engine's ``spin_us`` replaced), and the median decode-step forward
(``forward_batch_generation``, ms) per kind, alternating kinds each repeat:

- ``none``: back to back;
- ``spin 5`` / ``spin 20``: a Python busy-wait of 5 / 20 ms;
- ``sleep 20``: a 20 ms sleep (the core may go idle);
- ``touch 20``: a 20 ms busy-wait that re-reads every weight every 2 ms (keeps the weights cached);
- ``sweep 20``: a 20 ms busy-wait that writes across 64 MB of other memory (pushes them out).

If ``touch`` brings the forward back to ``none``, the slowdown is the weights leaving the cache; if
not, it is something else about the core having done other work.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.what_if_accuracy import model_config
from srtscope.engine.config import EngineConfig, FaultInjection
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler import scheduler as scheduler_module


def _spin(us: int) -> None:
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def _kinds(params: list[torch.Tensor]) -> dict[str, tuple[Callable[[int], None], int]]:
    sweep = bytearray(64 << 20)
    ones = b"\1" * len(range(0, len(sweep), 4096))

    def touch(us: int) -> None:
        end, due = time.perf_counter_ns() + us * 1000, 0
        while (now := time.perf_counter_ns()) < end:
            if now >= due:
                for p in params:
                    p.sum()
                due = time.perf_counter_ns() + 2_000_000

    def sweep_mem(us: int) -> None:
        end = time.perf_counter_ns() + us * 1000
        while time.perf_counter_ns() < end:
            sweep[::4096] = ones

    return {"none": (_spin, 0), "spin 5": (_spin, 5000), "spin 20": (_spin, 20000),
            "sleep 20": (lambda us: time.sleep(us / 1e6), 20000), "touch 20": (touch, 20000),
            "sweep 20": (sweep_mem, 20000)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=352)
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    base = EngineConfig(device="cpu", max_running_requests=8, max_total_tokens=8192, enable_probes=False,
                        model=model_config(a.layers, a.hidden, a.intermediate))
    worker = TpModelWorker(base)
    params = list(worker.model_runner.model.parameters())
    forward_ns: list[int] = []
    inner = worker.forward_batch_generation

    def timed(fb):
        t0 = time.perf_counter_ns()
        out = inner(fb)
        forward_ns.append(time.perf_counter_ns() - t0)
        return out

    worker.forward_batch_generation = timed  # type: ignore[method-assign]
    prompts = [[(11 * i + j) % 250 + 1 for j in range(32)] for i in range(8)]
    kinds = _kinds(params)

    def run(kind: str) -> float:
        fn, us = kinds[kind]
        scheduler_module.spin_us = fn
        forward_ns.clear()
        with Engine(dataclasses.replace(base, inject=FaultInjection(sched_us=us)), worker=worker) as eng:
            eng.generate(prompts, {"max_new_tokens": 24, "ignore_eos": True})
        return statistics.median(forward_ns[1:]) / 1e6        # the decode steps (the first is the prefill)

    run("none")                                               # warm-up
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(a.repeats):
        for k in kinds:
            got[k].append(run(k))
    mb = sum(p.numel() * p.element_size() for p in params) / 1e6
    print(f"# {a.layers} layers x {a.hidden} hidden / {a.intermediate} MLP, {mb:.0f} MB of weights; "
          f"median decode-step forward over {a.repeats} runs")
    ref = statistics.median(got["none"])
    for k, v in got.items():
        m = statistics.median(v)
        print(f"{k:>9}: {m:6.2f} ms ({100 * (m / ref - 1):+5.1f}%)   runs: {' '.join(f'{x:.2f}' for x in v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
