"""Ground truth on a real engine: delays injected into vLLM's own functions vs what srtscope says.

    .venv/bin/python -m benchmarks.engines.vllm_rig [--venv /path/to/vllm-venv] [--delay-ms 20]
                                                    [--tokens 12] [--requests 4] [--traces DIR]

Runs ``vllm_driver.py`` in the vLLM venv (``setup_vllm.sh`` makes it; default ``$VLLM_VENV`` or
``benchmarks/engines/.venv``): clean runs alternated with one run per fault (``sched`` inside
``Scheduler.schedule()``, ``prep`` in ``_prepare_inputs``, ``result`` in the output processor), each
traced by vLLM's own torch profiler with its custom scopes. Every trace is then read and diagnosed
by srtscope like any user's trace (``--traces DIR``: diagnose the traces already in DIR instead).

Per faulty run, against the clean runs (their median: the machine's load drifts and spikes):
- ``named``: the verdict's class / cause (the injected one: scheduler / sched_cpu, prep /
  batch_prep, scheduler / sched_cpu);
- ``injected``: the injected sleep inside the run's steps, per step — read from the trace itself
  (each sleep sits in a ``srtscope.rig.inject`` range); lost time counts whole steps, the time
  before a step's first forward too (analyses/losses.py);
- ``recovered``: the injected cause's lost time per step less the clean runs' (target: within 10%);
- ``what-if``: the faulty run's mean step predicted without the injected cause vs the clean runs'
  measured mean step (target: within 15%).
The sequence runs ``--rounds`` times in one vLLM process (default 5) and the targets are checked on
the medians over the rounds.
Per clean run: scheduler and prep lost time per step (target: at most 2 ms).
``fwd/step`` vs ``clean fwd``: the forward scopes' time per step (the CPU's stand-in for device work)
in the faulty run and the clean runs; ``err@fwd``: the what-if's error with their difference taken
out (the what-if holds device work as measured, and on a loaded CPU the forward right after a host
delay runs slower — a GPU's kernels do not).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.readers import load_timeline

HERE = Path(__file__).resolve().parent
INJECT_RANGE = "srtscope.rig.inject"
CAPTURE_TRACE = "capture.pt.trace.json.gz"
#: the fault -> the cause it must be found as
EXPECTED = {"sched": "sched_cpu", "prep": "batch_prep", "result": "sched_cpu"}
CLASS = {"sched_cpu": "scheduler", "batch_prep": "prep"}


@dataclass(frozen=True)
class RunFigures:
    """One run's figures (ns per step unless named otherwise)."""

    run: int
    fault: str
    steps: int
    bottleneck: str
    cause: str
    sched_ns: float
    prep_ns: float
    cause_ns: dict[str, float]
    injected_ns: float
    step_ns: float
    compute_ns: float
    what_if_ns: dict[str, float]
    warnings: tuple[str, ...]


def figures(tl: Timeline, run: int, fault: str, steps_of: tuple[int, int] | None = None) -> RunFigures:
    """One run's figures from its trace (``steps_of``: the run's steps, first..last, in a trace that
    holds several runs — a capture of the whole driver)."""
    d = diagnose(tl, DiagnoseParams(step_range=steps_of)).to_json()
    steps = max(int(d["steps"]["count"]), 1)
    causes = {k: v / steps for k, v in d["verdict"]["causes_ns"].items()}
    scores = d["verdict"]["scores_ns"]
    per = d["steps"]["per_step"]
    lo, hi = min(x["start_ns"] for x in per), max(x["start_ns"] + x["wall_ns"] for x in per)
    rg = tl.host_ranges
    inj = rg[rg["name"].astype(str).str.startswith(INJECT_RANGE)]
    # lost time counts whole steps (analyses/losses.py), the time before a step's first device work too
    window = (np.array([lo]), np.array([hi]))
    inside = iv.overlap(window, inj["start_ns"].to_numpy(), inj["end_ns"].to_numpy()).sum() if len(inj) else 0
    return RunFigures(run, fault, steps, d["verdict"]["bottleneck"] or "none", d["verdict"]["cause"] or "none",
                      scores.get("scheduler", 0) / steps, scores.get("prep", 0) / steps, causes,
                      float(inside) / steps, float(d["budget"]["mean_step"]["wall_ns"]),
                      float(d["budget"]["mean_step"]["compute_ns"]),
                      {w["cause"]: float(w["step_ns_after"]) for w in d["what_if"]},
                      tuple(w["code"] for w in d["capture"]["warnings"]))


def run_driver(venv: Path, out: Path, a: argparse.Namespace) -> dict:
    """Run the driver in the vLLM venv; with ``a.capture``, under ``srtscope capture --backend torch``
    (one Kineto trace of the whole process, ``OUT/capture.pt.trace.json.gz``) instead of vLLM's
    profiler. NOTE: capture runs the script under srtscope's own interpreter, so vLLM's packages come
    from the venv's site-packages on PYTHONPATH (same Python and torch on both sides)."""
    py = venv / "bin" / "python"
    model = venv / a.model
    if not py.exists() or not model.exists():
        sys.exit(f"vllm_rig: no vLLM venv with the tiny model at {venv} "
                 f"(make it: benchmarks/engines/setup_vllm.sh {venv})")
    runs = ",".join(x for _ in range(a.rounds) for f in ("sched", "prep", "result") for x in ("clean", f)) + ",clean"
    driver = [str(HERE / "vllm_driver.py"), "--model", str(model), "--out", str(out), "--runs", runs,
              "--delay-ms", str(a.delay_ms), "--delay-kind", a.delay_kind, "--tokens", str(a.tokens),
              "--requests", str(a.requests)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if a.capture:
        site = sorted((venv / "lib").glob("python3*/site-packages"))
        env["PYTHONPATH"] = os.pathsep.join([str(p) for p in site[:1]] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "srtscope", "capture", "--backend", "torch", "--out",
               str(out / CAPTURE_TRACE), "--", "python", *driver, "--profiler", "none"]
    else:
        cmd = [str(py), *driver]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"vllm_rig: the driver failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "manifest.json").read_text())


def _ms(ns: float) -> str:
    return f"{ns / 1e6:6.2f}"


@dataclass(frozen=True)
class FaultCheck:
    """One faulty run against the clean runs (their median)."""

    fig: RunFigures
    named: bool
    injected_ns: float      # per step
    recovered_ns: float     # per step
    err: float              # recovered vs injected
    clean_step_ns: float
    what_if_ns: float
    what_if_err: float      # vs the clean step
    clean_fwd_ns: float
    what_if_err_fwd: float  # with the faulty run's slower forward taken out


def check(figs: list[RunFigures], i: int) -> FaultCheck:
    f = figs[i]
    want = EXPECTED[f.fault]
    clean = [c for c in figs if c.fault == "clean"]
    nan = float("nan")
    base = float(np.median([c.cause_ns.get(want, 0.0) for c in clean])) if clean else 0.0
    rec = f.cause_ns.get(want, 0.0) - base
    err = (rec - f.injected_ns) / f.injected_ns if f.injected_ns else nan
    pred = f.what_if_ns.get(want, nan)
    ref = float(np.median([c.step_ns for c in clean])) if clean else nan
    ref_fwd = float(np.median([c.compute_ns for c in clean])) if clean else nan
    # the what-if holds device work as measured; on the CPU the forward right after a host delay
    # runs slower than in the clean runs: werr_fwd is the error with that difference taken out
    return FaultCheck(f, f.cause == want and f.bottleneck == CLASS[want], f.injected_ns, rec, err, ref, pred,
                      (pred - ref) / ref if ref else nan, ref_fwd,
                      (pred - (f.compute_ns - ref_fwd) - ref) / ref if ref else nan)


def report(manifest: dict, figs: list[RunFigures]) -> bool:
    print(f"vLLM {manifest['vllm']} (CPU), {Path(manifest['model']).name}, {manifest['requests']} requests x "
          f"{manifest['tokens']} tokens, in-process engine core, custom scopes, traced by "
          f"{manifest.get('source', 'vLLM torch profiler')}, {manifest.get('delay_kind', 'sleep')} delays")
    if "loadavg" in manifest:
        before, after = manifest["loadavg"]
        print(f"host load average (1 min) {before} before the runs, {after} after, on {manifest['cpus']} cores "
              "shared with other work")
    print(f"\n{'run':>3} {'fault':6} {'steps':>5} {'verdict':24} {'inj/step':>8} {'recov/step':>10} "
          f"{'err':>6} {'clean step':>10} {'what-if':>8} {'err':>6} {'fwd/step':>8} {'clean fwd':>9} "
          f"{'err@fwd':>7}   ms")
    checks: list[FaultCheck] = []
    for i, f in enumerate(figs):
        if f.fault == "clean":
            print(f"{f.run:3d} {f.fault:6} {f.steps:5d} {f.bottleneck + ' / ' + f.cause:24} "
                  f"sched {_ms(f.sched_ns)}  prep {_ms(f.prep_ns)} per step  step {_ms(f.step_ns)}  "
                  f"fwd {_ms(f.compute_ns)}")
            continue
        c = check(figs, i)
        checks.append(c)
        print(f"{f.run:3d} {f.fault:6} {f.steps:5d} {f.bottleneck + ' / ' + f.cause:24} {_ms(c.injected_ns):>8} "
              f"{_ms(c.recovered_ns):>10} {c.err:+6.0%} {_ms(c.clean_step_ns):>10} {_ms(c.what_if_ns):>8} "
              f"{c.what_if_err:+6.0%} {_ms(f.compute_ns):>8} {_ms(c.clean_fwd_ns):>9} {c.what_if_err_fwd:+7.0%}")
    # medians over the rounds: the machine's load drifts, one run is one sample
    ok = True
    print(f"\nmedian over the rounds{'':14} named  recovered err  what-if err  err@fwd")
    for fault in ("sched", "prep", "result"):
        cs = [c for c in checks if c.fig.fault == fault]
        if not cs:
            continue
        named = sum(c.named for c in cs)
        err = float(np.median([c.err for c in cs]))
        werr = float(np.median([c.what_if_err for c in cs]))
        werr_fwd = float(np.median([c.what_if_err_fwd for c in cs]))
        good = named == len(cs) and abs(err) <= 0.10 and abs(werr) <= 0.15
        ok &= good
        print(f"  {fault:6} -> {CLASS[EXPECTED[fault]] + ' / ' + EXPECTED[fault]:24} {named}/{len(cs)}  "
              f"{err:+13.0%}  {werr:+11.0%}  {werr_fwd:+7.0%}{'' if good else '   <- off target'}")
    clean = [f for f in figs if f.fault == "clean"]
    sched = float(np.median([f.sched_ns for f in clean])) if clean else 0.0
    prep = float(np.median([f.prep_ns for f in clean])) if clean else 0.0
    ok &= sched <= 2e6 and prep <= 2e6
    print(f"  clean  ({len(clean)} runs): scheduler {_ms(sched)} ms, prep {_ms(prep)} ms lost per step")
    print("\ntargets (on the medians): injected cause named in every run; recovered within 10% of the injected "
          "time per step; what-if within 15% of the clean step; clean: scheduler and prep at most 2 ms per step")
    print("all targets met" if ok else "some targets missed")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="delays injected into vLLM vs srtscope's diagnosis")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_VENV", HERE / ".venv")))
    p.add_argument("--out", type=Path, default=Path("runs/engines/vllm"))
    p.add_argument("--traces", type=Path, help="diagnose the driver's traces already in this folder")
    p.add_argument("--model", default="tiny-llama-decode", help="a model folder inside the venv (setup_vllm.sh "
                   "makes tiny-llama: 4 layers, hidden 256; tiny-llama-decode: 12 layers, hidden 384)")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--delay-kind", choices=("sleep", "spin"), default="sleep",
                   help="how the injected delay waits: sleep (the default: a busy-wait slows the next forward "
                        "on a shared machine) or spin (a busy-wait: no idle state for the core to fall into)")
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5, help="clean/sched/clean/prep/clean/result rounds")
    p.add_argument("--capture", action="store_true",
                   help="trace with `srtscope capture --backend torch` instead of vLLM's own profiler")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds >= 1")
    if a.traces:
        folder = a.traces
        manifest = json.loads((folder / "manifest.json").read_text())
    else:
        folder = a.out
        manifest = run_driver(a.venv.resolve(), folder.resolve(), a)
    if (folder / CAPTURE_TRACE).exists() and not any(r["trace"] for r in manifest["runs"]):
        # one trace of the whole driver: the warm-up's steps, then each run's, ``tokens`` steps each
        tl = load_timeline(folder / CAPTURE_TRACE)
        n = manifest["tokens"]
        figs = [figures(tl, r["run"], r["fault"], (n * (i + 1), n * (i + 2) - 1))
                for i, r in enumerate(manifest["runs"])]
        manifest["source"] = "srtscope capture --backend torch"
    else:
        figs = [figures(load_timeline(folder / r["trace"]), r["run"], r["fault"])
                for r in manifest["runs"] if r["trace"]]
    return 0 if report(manifest, figs) else 1


if __name__ == "__main__":
    sys.exit(main())
