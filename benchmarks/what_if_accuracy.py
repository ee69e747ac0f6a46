"""What-if accuracy: the step time predicted without an injected fault, checked against the engine.

    python -m benchmarks.what_if_accuracy [--delays-ms 5 20] [--repeats 7] [--straggler-ms 0.3 0.6 1.2]
                                          [--tp-repeats 10] [--tp-comm spin|gloo] [--parts tp1 tp2 eager]
                                          [--json PAIRS.json]
                                          [--layers 12 --hidden 384 --intermediate 1024]

The harness is ``inject_accuracy.py``'s: the engine runs in this process (CPU, probes on, one worker
reused), ``--requests`` prompts submitted at once, ``--max-new`` greedy tokens each. For each fault —
``sched``, ``prep`` and ``result`` delayed ``--delays-ms`` per step (``FaultInjection``) on the normal
and the overlap loop — every repeat runs the workload clean, then with the fault (alternating: slow
drift of the machine hits both alike). From the faulty run's probe trace alone,
``diagnose(..., shrink_ns={cause: injected ns})`` predicts the mean step wall time without the fault
(the ``what_if`` entry of the injected cause: ``sched``/``result`` -> sched_cpu, ``prep`` ->
batch_prep; the cut is the injected delays' measured mean, printed against the nominal); the clean run
measures it. Figures are medians over ``--repeats``. Target: within 10% on the normal loop, 15% on the
overlap loop and at tp=2.

The model is shaped for decode: 12 layers x 384 hidden, 1024 MLP (77 MB of float32 weights, more
than this machine's 32 MB L3): its forward streams weights from memory (~17 ms), as a GPU decode step
does, so a host fault before it barely changes it. The engine's tiny default shape (``--layers 16
--hidden 128 --intermediate 352``: 13 MB, a ~7 ms forward that is mostly Python dispatch) is itself
host code: after a 5-20 ms busy-wait or sleep it runs 0.3-1.2 ms (4-17%) slower
(``benchmarks/forward_after_delay.py``), and the normal loop's predictions then miss by about that
much — the machine's doing, which the columns below show.

How a delay is injected (the engine's ``spin_us`` replaced here, the engine untouched): in the normal
loop a busy-wait for the whole delay (``--normal-inject spin``); in the overlap loop a sleep
(``--overlap-inject sleep``): there the CPU forward runs on a thread beside the scheduler's, and a busy
host would take its core — a GPU's kernels never compete with the host for one.

Beside the error the script prints, per case, how much the device work itself changed between the
faulty and the clean runs (``compute`` per step; on the CPU the "device" is the host core, so a
fault can change it), and the error the prediction would have had with the clean run's device work
in place of the faulty run's: a miss there is the model's; a miss only in the first is the machine's.
The clean runs' spread is (p80 - p20) / median of their mean steps.

Forced eager fallback (``--parts eager``; CUDA only, ``--eager-device cpu`` rehearses it): the same
workload with request i asking for ``max_new / 4 + 3 i`` tokens (the batch shrinks step by step),
one worker capturing graphs up to ``--requests`` (clean) and one up to half of it (faulty: the larger
decode batches run eagerly, reason ``bs_over_max``); the prediction is the ``eager_fallback``
what-if: those steps replayed as graphs of the nearest captured size, a replay's launch cost taken
from the faulty trace's own graph steps. Target 10% (a normal loop).

tp=2 (``--straggler-ms``, per collective; 2 x layers + 1 collectives a step): two ranks started once,
each reusing its worker over all runs; rank 1 busy-waits before each collective (``TPState._straggle``
replaced, ``--straggler-inject``), clean and faulty runs alternating; the prediction is the
``straggler`` what-if, and the device work compared is rank 0's. The model's collectives go over
shared memory, each rank spinning until its peer arrives (``--tp-comm spin``,
``benchmarks/spin_collectives.py``): like NCCL's kernels, a late rank's lateness then adds one for
one. With gloo (``--tp-comm gloo``) this does not check the model on 2 cores: a waiting rank sleeps,
the wake-ups cost ~1.4 ms a collective when the ranks arrive together (most of the step), and a
straggler's lateness partly replaces them — a 0.3 ms straggler left the step no slower. The script
prints the saving the model predicts against the delay injected and what the faulty runs lost.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.spin_collectives import SpinPair, two_ranks
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.engine.config import EngineConfig, FaultInjection, ModelConfig
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.engine.scheduler import scheduler as scheduler_module
from srtscope.probes import ranges
from srtscope.probes.recorder import get_recorder

CAUSE = {"sched": "sched_cpu", "prep": "batch_prep", "result": "sched_cpu", "straggler": "straggler",
         "eager": "eager_fallback"}
#: faults injected as host time in one stage (the prediction cuts their measured delays)
HOST_FAULTS = ("sched", "prep", "result")


@dataclasses.dataclass(frozen=True)
class Case:
    loop: str            # normal | overlap
    tp: int
    fault: str           # sched | prep | result | straggler
    us: int              # per step (per collective for the straggler)

    @property
    def name(self) -> str:
        if self.fault == "eager":            # us: the largest captured batch size of the faulty runs
            return f"eager fallback (graphs up to bs {self.us})"
        return f"{self.fault}={self.us / 1000:g}ms"

    @property
    def target(self) -> float:
        return 0.10 if self.loop == "normal" and self.tp == 1 else 0.15


#: ns each injected delay actually took (the prediction cuts the mean of these, not the nominal delay)
INJECTED: list[int] = []


def spin_us(us: int) -> None:
    """Busy-wait ``us`` µs in Python, the whole time (the engine's ``spin_us`` sleeps all but the last
    2 ms of a delay over 3 ms: a sleeping core goes cold and other processes evict its caches). The
    normal loop's injection: nothing else runs in the process meanwhile."""
    if us <= 0:                     # the engine calls it for every stage, 0 where nothing is injected
        return
    t0 = time.perf_counter_ns()
    end = t0 + us * 1000
    while time.perf_counter_ns() < end:
        pass
    INJECTED.append(time.perf_counter_ns() - t0)


def spin_nogil_us(us: int) -> None:
    """Busy-wait ``us`` µs without holding the GIL (``select`` with no timeout, in a loop)."""
    if us <= 0:
        return
    t0 = time.perf_counter_ns()
    end = t0 + us * 1000
    while time.perf_counter_ns() < end:
        select.select([], [], [], 0)
    INJECTED.append(time.perf_counter_ns() - t0)


def sleep_us(us: int) -> None:
    """Sleep ``us`` µs: the overlap loop's injection. There the forward thread runs beside the
    scheduler's; a busy host would take its core (and the GIL) from the forward, which a GPU's kernels
    never lose — measured: a spinning thread (even one that releases the GIL) slows a CPU forward
    about 2x on a loaded 2-core machine."""
    if us <= 0:                     # the engine calls it for every stage, 0 where nothing is injected
        return
    t0 = time.perf_counter_ns()
    time.sleep(us / 1e6)
    INJECTED.append(time.perf_counter_ns() - t0)


def figures(paths: list[Path], fault: str = "", cut_ns: int = 0, device_rank: int | None = None
            ) -> dict[str, float]:
    """Mean step wall and device work per step (ms; ``device_rank``: that rank's alone); for a faulty
    run the prediction (ms), the cause's host time cut by ``cut_ns`` per step."""
    tl = load_timeline([str(p) for p in paths])
    cause = CAUSE.get(fault, "")
    shrink = {cause: cut_ns} if fault in HOST_FAULTS else None
    d = diagnose(tl, shrink_ns=shrink)
    n = max(d.budget.steps, 1)
    out = {"wall": d.budget.wall_ns / n / 1e6, "device": d.budget.compute_ns / n / 1e6,
           "steps": float(d.budget.steps)}
    if device_rank is not None:
        mine = d.budget.table[d.budget.table["rank"] == device_rank]
        out["device"] = float(mine["compute_ns"].sum()) / max(len(mine), 1) / 1e6
    if fault:
        w = next((x for x in d.what_if if x.cause == cause), None)
        out["pred"] = (w.step_ns_after if w else d.budget.wall_ns / n) / 1e6
    return out


def model_config(layers: int, hidden: int, intermediate: int) -> ModelConfig:
    """The benchmark's decoder: heads of 64 and 2 kv heads (``hidden`` a multiple of 128, so tp=2 splits
    both)."""
    if hidden % 128:
        raise ValueError(f"--hidden must be a multiple of 128, got {hidden}")
    return ModelConfig(num_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                       num_heads=hidden // 64, num_kv_heads=2)


# ---------------------------------------------------------------- tp=1: in process

INJECT = {"spin": spin_us, "spin-nogil": spin_nogil_us, "sleep": sleep_us}
PARTS = ("tp1", "tp2", "eager")


def run_once(worker: TpModelWorker, base: EngineConfig, prompts: list[list[int]], max_new: int,
             overlap: bool, fault: str = "", us: int = 0, inject: str = "spin") -> dict[str, float]:
    inj = FaultInjection(**({f"{fault}_us": us} if fault else {}))
    cfg = dataclasses.replace(base, enable_overlap=overlap, inject=inj)
    rec = get_recorder()
    rec.clear()
    scheduler_module.spin_us = INJECT[inject]
    INJECTED.clear()
    with tempfile.TemporaryDirectory() as tmp, Engine(cfg, worker=worker) as eng:
        eng.generate(prompts, {"max_new_tokens": max_new, "ignore_eos": True})
        paths = eng.write_traces(tmp)
        rec.clear()
        cut = int(statistics.mean(INJECTED)) if INJECTED else 0
        out = figures([Path(paths["probe"])], fault, cut)
        if fault:
            out["overshoot"] = (cut - us * 1000) / (us * 1000)
        return out


def run_tp1(cases: list[Case], a: argparse.Namespace, log) -> dict[Case, list[tuple[dict, dict]]]:
    torch.set_num_threads(a.threads)
    base = EngineConfig(device="cpu", max_running_requests=max(8, a.requests), max_total_tokens=8192,
                        enable_probes=True, model=model_config(a.layers, a.hidden, a.intermediate))
    worker = TpModelWorker(base)
    prompts = [[(11 * i + j) % 250 + 1 for j in range(a.prompt_len)] for i in range(a.requests)]
    got: dict[Case, list[tuple[dict, dict]]] = {c: [] for c in cases}
    try:
        for loop in ("normal", "overlap"):
            mine = [c for c in cases if c.loop == loop]
            inject = a.normal_inject if loop == "normal" else a.overlap_inject
            run_once(worker, base, prompts, 4, loop == "overlap")           # warm-up
            for rep in range(a.repeats):
                for c in mine:
                    clean = run_once(worker, base, prompts, a.max_new, loop == "overlap")
                    faulty = run_once(worker, base, prompts, a.max_new, loop == "overlap", c.fault, c.us,
                                      inject)
                    got[c].append((faulty, clean))
                log(f"{loop} repeat {rep + 1}/{a.repeats}")
    finally:
        ranges.disable()
    return got


# ---------------------------------------------------------------- forced eager fallback: CUDA only

def run_eager(a: argparse.Namespace, log) -> dict[Case, list[tuple[dict, dict]]]:
    """Graphs captured up to ``--requests`` (clean) against up to half of it (faulty: the larger decode
    batches fall back to eager launches); request i asks for ``max_new / 4 + 3 i`` tokens, so the batch
    shrinks step by step and the faulty runs keep graph steps too. Two workers, same weights."""
    small = max(1, a.requests // 2)
    case = Case("normal", 1, "eager", small)
    cfgs = {bs: EngineConfig(device=a.eager_device, max_running_requests=max(8, a.requests), max_total_tokens=8192,
                             enable_probes=True, cuda_graph_max_bs=bs,
                             model=model_config(a.layers, a.hidden, a.intermediate))
            for bs in (a.requests, small)}
    workers = {bs: TpModelWorker(cfg) for bs, cfg in cfgs.items()}
    prompts = [[(11 * i + j) % 250 + 1 for j in range(a.prompt_len)] for i in range(a.requests)]
    params = [{"max_new_tokens": max(2, a.max_new // 4) + 3 * i, "ignore_eos": True} for i in range(a.requests)]

    def once(bs: int) -> dict[str, float]:
        rec = get_recorder()
        rec.clear()
        with tempfile.TemporaryDirectory() as tmp, Engine(cfgs[bs], worker=workers[bs]) as eng:
            eng.generate(prompts, params)
            paths = eng.write_traces(tmp)
            rec.clear()
            return figures([Path(paths["probe"])], "eager" if bs == small else "")

    got: dict[Case, list[tuple[dict, dict]]] = {case: []}
    try:
        once(a.requests), once(small)                                   # warm-up
        for rep in range(a.repeats):
            clean = once(a.requests)
            got[case].append((once(small), clean))
            log(f"eager fallback repeat {rep + 1}/{a.repeats}")
    finally:
        ranges.disable()
    return got


# ---------------------------------------------------------------- tp=2: two ranks, reused workers

def _tp_rank(rank: int, port: int, plan: list[int], out: str, model: ModelConfig, requests: int, prompt_len: int,
             max_new: int, inject: str, pin: bool, spin: tuple[torch.Tensor, torch.Tensor] | None,
             results: Any) -> None:
    """One rank: its worker built once, then one engine run per entry of ``plan`` (straggler µs);
    ``spin``: shared buffers for ``SpinPair`` (the model's collectives spin), None: gloo."""
    import torch.distributed as dist

    from srtscope.engine.distributed.rank import RankSpec, init_groups
    from srtscope.engine.distributed.sync import TpStop, TpSync
    from srtscope.engine.model.parallel import TPState
    from srtscope.engine.request import SamplingParams
    from srtscope.engine.workloads import WorkItem, Workload, run_workload
    from srtscope.probes.recorder import Recorder, set_recorder

    try:
        delay = INJECT[inject]
        TPState._straggle = lambda self: delay(self.straggler_us) if self.rank == self.straggler_rank else None
        torch.set_num_threads(1)
        cores = sorted(os.sched_getaffinity(0))
        if pin and len(cores) >= 2:     # this rank and the threads it starts (gloo's) on one core of its own
            os.sched_setaffinity(0, {cores[rank]})
        spec = RankSpec(rank=rank, world_size=2, store_port=port, timeout_s=120.0)
        rec = Recorder(rank=rank, world_size=2)
        set_recorder(rec)
        group, cpu = init_groups(spec, "cpu")
        if spin is not None:
            SpinPair(*spin, rank=rank).install(group)
        cfg = EngineConfig(device="cpu", tp_size=2, max_running_requests=max(8, requests), max_total_tokens=8192,
                           enable_probes=True, model=model)
        worker = TpModelWorker(cfg, rank=rank, tp_size=2, group=group)
        worker.tp.straggler_rank = 1
        params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
        wl = Workload("what-if", [WorkItem([(11 * i + j) % 250 + 1 for j in range(prompt_len)], params)
                                  for i in range(requests)])
        for i, us in enumerate(plan):
            worker.tp.straggler_us = us
            rec.clear()
            sync = TpSync(rank, 2, cpu)
            with Engine(cfg, worker=worker, tp_sync=sync) as eng:
                if rank == 0:
                    run_workload(eng, wl)
                    sync.send_stop()
                else:
                    try:
                        while True:
                            eng.step()
                    except TpStop:
                        pass
                eng.write_traces(Path(out) / f"run{i}", rank=rank)
            rec.clear()
            dist.barrier(group=cpu)
        results.put((rank, "ok"))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((rank, f"{type(exc).__name__}: {exc}"))
        raise


def run_tp2(cases: list[Case], a: argparse.Namespace, log) -> dict[Case, list[tuple[dict, dict]]]:
    plan: list[int] = [0]                                   # warm-up
    for _ in range(a.tp_repeats):
        for c in cases:
            plan += [0, c.us]
    model = model_config(a.layers, a.hidden, a.intermediate)
    # the largest collective: the prefill's hidden states, or its logits' shards, of every prompt token
    spin = (SpinPair.shared(2 * a.requests * a.prompt_len * max(model.hidden_size, model.vocab_size))
            if a.tp_comm == "spin" else None)
    got: dict[Case, list[tuple[dict, dict]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="srtscope-whatif-tp-") as tmp:
        status = two_ranks(_tp_rank, plan, tmp, model, a.requests, a.prompt_len, a.max_new, a.straggler_inject,
                           a.pin_ranks, spin, timeout_s=1800)
        if any(v != "ok" for v in status.values()):
            raise RuntimeError(f"tp=2 runs failed: {status}")
        k = 1
        for _ in range(a.tp_repeats):
            for c in cases:
                # device work: rank 0's (the straggler's busy-wait is inside rank 1's forward)
                clean = figures(sorted((Path(tmp) / f"run{k}").glob("probe.rank*.json")), device_rank=0)
                faulty = figures(sorted((Path(tmp) / f"run{k + 1}").glob("probe.rank*.json")), c.fault, c.us,
                                 device_rank=0)
                got[c].append((faulty, clean))
                k += 2
    log("tp=2 done")
    return got


# ---------------------------------------------------------------- report

def summarise(c: Case, pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    med = lambda side, k: statistics.median(p[side][k] for p in pairs)  # noqa: E731
    q = statistics.quantiles([p[1]["wall"] for p in pairs], n=5) if len(pairs) >= 2 else [0, 0, 0, 0]
    meas, pred = med(1, "wall"), med(0, "pred")
    dev_f, dev_c = med(0, "device"), med(1, "device")
    return {"faulty": med(0, "wall"), "pred": pred, "meas": meas, "err": (pred - meas) / meas,
            "dev": dev_f / dev_c - 1, "err_dev": (pred - dev_f + dev_c - meas) / meas,
            "noise": (q[3] - q[0]) / meas, "steps": med(0, "steps"),
            "overshoot": med(0, "overshoot") if "overshoot" in pairs[0][0] else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[5.0, 20.0])
    ap.add_argument("--straggler-ms", type=float, nargs="*", default=[0.3, 0.6, 1.2],
                    help="per collective (2 x layers + 1 of them per step)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tp-repeats", type=int, default=10)
    ap.add_argument("--layers", type=int, default=12, help="decoder layers (the engine's default model has 2)")
    ap.add_argument("--hidden", type=int, default=384, help="a multiple of 128 (the engine default is 128)")
    ap.add_argument("--intermediate", type=int, default=1024, help="MLP size (the engine default is 352)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--normal-inject", choices=sorted(INJECT), default="spin", help="how a delay is injected")
    ap.add_argument("--overlap-inject", choices=sorted(INJECT), default="sleep", help="how a delay is injected")
    ap.add_argument("--straggler-inject", choices=sorted(INJECT), default="spin", help="how a straggler's delay is "
                    "injected")
    ap.add_argument("--tp-comm", choices=("spin", "gloo"), default="spin",
                    help="tp=2 model collectives: shared memory, spinning like a GPU's (default), or gloo")
    ap.add_argument("--pin-ranks", action="store_true", help="tp=2: each rank on a core of its own")
    ap.add_argument("--eager-device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu rehearses the eager-fallback runs without a GPU (nothing is captured there)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                    help="tp1: host delays at tp=1; tp2: the straggler at tp=2; eager: forced eager fallback "
                         "(CUDA only, skipped without it)")
    ap.add_argument("--json", type=Path, help="also write every pair's figures here")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    log = lambda msg: print(f"  [{time.perf_counter() - t0:5.0f} s] {msg}", flush=True)  # noqa: E731
    cases = [] if "tp1" not in a.parts else [Case(loop, 1, f, int(ms * 1000)) for loop in ("normal", "overlap")
                                             for f in HOST_FAULTS for ms in a.delays_ms]
    tp_cases = [] if "tp2" not in a.parts else [Case("normal", 2, "straggler", int(ms * 1000))
                                                for ms in a.straggler_ms]
    print(f"# what-if accuracy: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {a.requests} requests x "
          f"{a.max_new} tokens, {a.layers} layers x {a.hidden} hidden / {a.intermediate} MLP; median of "
          f"{a.repeats} (tp=2: {a.tp_repeats}) alternating clean/faulty runs", flush=True)
    got = run_tp1(cases, a, log) if cases else {}
    if tp_cases:
        got.update(run_tp2(tp_cases, a, log))
    if "eager" in a.parts and (torch.cuda.is_available() or a.eager_device == "cpu"):
        eager = run_eager(a, log)
        got.update(eager)
        cases += list(eager)
        if a.eager_device == "cpu":
            print("forced eager fallback on the CPU is a rehearsal: nothing is captured, nothing falls back; "
                  "its row checks nothing", flush=True)
    elif "eager" in a.parts:
        print("forced eager fallback: needs CUDA; skipped", flush=True)
    rows = [(c, summarise(c, got[c])) for c in cases + tp_cases]
    if a.json:
        a.json.write_text(json.dumps([{"case": dataclasses.asdict(c), "pairs": [{"faulty": f, "clean": k}
                                                                               for f, k in got[c]]}
                                      for c in cases + tp_cases], indent=1))
    print(f"\nload {os.getloadavg()[0]:.1f} at the end\n")
    print("| loop | tp | fault | faulty step | predicted without it | measured without it | error | target "
          "| device work, faulty vs clean | error with clean device work | clean runs' spread "
          "| injected, actual vs nominal |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, r in rows:
        ok = lambda e, t=c.target: "" if abs(e) <= t else " **missed**"  # noqa: E731
        # tp=2: rank 0's device work (the straggler's busy-wait is inside rank 1's forward)
        dev = f"{100 * r['dev']:+.1f}% | {100 * r['err_dev']:+.1f}%{ok(r['err_dev'])}"
        inj = f"{100 * r['overshoot']:+.1f}%" if c.fault in HOST_FAULTS else "n/a"
        print(f"| {c.loop} | {c.tp} | {c.name} | {r['faulty']:.2f} ms | {r['pred']:.2f} ms | {r['meas']:.2f} ms "
              f"| {100 * r['err']:+.1f}%{ok(r['err'])} | {100 * c.target:.0f}% | {dev} | {100 * r['noise']:.0f}% "
              f"| {inj} |")
    for label, k in (("error", "err"), ("error with clean device work", "err_dev")):
        for part, sel in (("tp=1", [x for x in rows if x[0].tp == 1]), ("tp=2", [x for x in rows if x[0].tp == 2])):
            if not sel:
                continue
            c, r = max(sel, key=lambda x: abs(x[1][k]) / x[0].target)
            met = sum(abs(x[1][k]) <= x[0].target for x in sel)
            print(f"{part}, worst case ({label}, error / target): {c.loop} loop, {c.name}: {100 * r[k]:+.1f}% "
                  f"(target {100 * c.target:.0f}%); {met}/{len(sel)} within target")
    for c, _ in rows:
        if c.fault == "straggler":      # what the model gives back against what was injected and what came back
            injected = c.us * (2 * a.layers + 1) / 1000
            gave = statistics.median(f["wall"] - f["pred"] for f, _ in got[c])
            came = statistics.median(f["wall"] - k["wall"] for f, k in got[c])
            print(f"tp=2 {c.name}: predicted saving {gave:.2f} ms a step; injected {injected:.2f} ms a forward; "
                  f"faulty minus clean {came:+.2f} ms (median of the pairs)")
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
