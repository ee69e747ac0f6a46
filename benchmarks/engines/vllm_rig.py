"""Ground truth on a real engine: delays injected into vLLM's own functions vs what srtscope says.

    .venv/bin/python -m benchmarks.engines.vllm_rig [--venv /path/to/vllm-venv] [--delay-ms 20]
                                                    [--tokens 12] [--requests 4] [--traces DIR]

Runs ``vllm_driver.py`` in the vLLM venv (``setup_vllm.sh`` makes it; default ``$VLLM_VENV`` or
``benchmarks/engines/.venv``): clean runs alternated with one run per fault (``sched`` inside
``Scheduler.schedule()``, ``prep`` in ``_prepare_inputs``, ``result`` in the output processor,
``alloc`` in ``KVCacheManager.allocate_slots``, ``every4``: an intermittent stall in every 4th
``Scheduler.schedule()``), traced by each capture path of ``--paths``:
- ``vllm``: vLLM's own torch profiler with its custom scopes, one trace per run;
- ``torch``: ``srtscope capture --backend torch`` (a Kineto trace of the whole driver, vLLM's
  custom scopes on);
- ``torch-instrument``: the same with ``--instrument vllm`` (srtscope's stage ranges as well);
- ``probe``: ``srtscope capture --backend probe --instrument vllm`` (no profiler: the stage spans).
A whole-driver capture is cut into its runs by steps (the warm-up's ``--tokens`` steps, then each
run's). Every trace is read and diagnosed by srtscope like any user's trace (``--traces DIR``:
diagnose the traces already in DIR, one folder per path, instead).

Per faulty run, against the clean runs (their median: the machine's load drifts and spikes):
- ``named``: the verdict's class / cause (the injected one: scheduler / sched_cpu, prep /
  batch_prep, scheduler / sched_cpu);
- ``injected``: the injected sleep inside the run's steps, per step — read from the trace itself
  (each sleep sits in a ``srtscope.rig.inject`` range; a probe trace has none: the driver's own
  measure of the time inside the faults); lost time counts whole steps, the time before a step's
  first forward too (analyses/losses.py);
- ``recovered``: the injected cause's lost time per step less the clean runs' (target: within 10%);
  for an intermittent fault (``every4``: fired in under half the steps), less its class's median
  per step over the run's own steps without the fault (marked ``*``): per step, the stall is
  counted against what srtscope puts on the scheduler in that step, under that run's load;
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
CAPTURE_TRACE = "capture.json.gz"
FAULTS = ("sched", "prep", "result", "alloc", "every4")
PATHS = ("vllm", "torch", "torch-instrument", "probe")
#: the fault -> the cause it must be found as
EXPECTED = {"sched": "sched_cpu", "prep": "batch_prep", "result": "sched_cpu", "alloc": "batch_prep",
            "every4": "sched_cpu"}
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
    #: per step of the run: (scheduler, prep) lost time, ns (the step's parts: the scheduler's with
    #: the engine's sync.wait), and whether a fault fired in it
    per_step: tuple[tuple[float, float], ...] = ()
    fired: tuple[bool, ...] = ()


def figures(tl: Timeline, run: int, fault: str, steps_of: tuple[int, int] | None = None,
            inside_ns: float | None = None, fires: list[tuple[int, int]] | None = None,
            fired_steps: list[int] | None = None) -> RunFigures:
    """One run's figures from its trace (``steps_of``: the run's steps, first..last, in a trace that
    holds several runs — a capture of the whole driver). The time inside the injected faults: their
    ``srtscope.rig.inject`` ranges in the trace, else ``fires`` (start, end on the trace's clock) in
    the run's steps, else ``inside_ns``; the steps a fault fired in likewise, else ``fired_steps``
    (the run's steps, by the driver's count)."""
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
    if len(inj):
        inside = iv.overlap(window, inj["start_ns"].to_numpy(), inj["end_ns"].to_numpy()).sum()
    elif fires:
        inside = iv.overlap(window, np.array([f[0] for f in fires]), np.array([f[1] for f in fires])).sum()
    else:
        inside = inside_ns or 0.0
    parts = [x["parts_ns"] for x in per]
    s0 = np.array([x["start_ns"] for x in per], np.int64)
    if len(inj) or fires:
        ranges = iv.union(inj["start_ns"].to_numpy(), inj["end_ns"].to_numpy()) if len(inj) else \
            iv.union(np.array([f[0] for f in fires]), np.array([f[1] for f in fires]))
        fired = tuple(bool(v) for v in iv.overlap(ranges, s0, s0 + np.array([x["wall_ns"] for x in per])) > 0)
    else:
        fired = tuple(i in set(fired_steps or ()) for i in range(len(per)))
    return RunFigures(run, fault, steps, d["verdict"]["bottleneck"] or "none", d["verdict"]["cause"] or "none",
                      scores.get("scheduler", 0) / steps, scores.get("prep", 0) / steps, causes,
                      float(inside) / steps, float(d["budget"]["mean_step"]["wall_ns"]),
                      float(d["budget"]["mean_step"]["compute_ns"]),
                      {w["cause"]: float(w["step_ns_after"]) for w in d["what_if"]},
                      tuple(w["code"] for w in d["capture"]["warnings"]),
                      tuple((float(x.get("scheduler", 0) + x.get("sync", 0)), float(x.get("prep", 0))) for x in parts),
                      fired)


def run_driver(venv: Path, out: Path, a: argparse.Namespace, path: str) -> dict:
    """Run the driver in the vLLM venv, traced by capture path ``path`` (``PATHS``): vLLM's profiler
    (a trace per run), or ``srtscope capture`` of the whole driver into ``OUT/capture.json.gz``
    (the probe backend: ``OUT/capture.pid<N>.json.gz``). The capture runs the venv's own
    interpreter, which imports srtscope from the capture's import path (no install there)."""
    py = venv / "bin" / "python"
    model = venv / a.model
    if not py.exists() or not model.exists():
        sys.exit(f"vllm_rig: no vLLM venv with the tiny model at {venv} "
                 f"(make it: benchmarks/engines/setup_vllm.sh {venv})")
    faults = [f for f in a.faults.split(",") if f]
    runs = ",".join(x for _ in range(a.rounds) for f in faults for x in ("clean", f)) + ",clean"
    driver = [str(HERE / "vllm_driver.py"), "--model", str(model), "--out", str(out), "--runs", runs,
              "--delay-ms", str(a.delay_ms), "--delay-kind", a.delay_kind, "--tokens", str(a.tokens),
              "--requests", str(a.requests), "--profiler", "vllm" if path == "vllm" else "none"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    out.mkdir(parents=True, exist_ok=True)
    if path == "vllm":
        cmd = [str(py), *driver]
    else:
        backend = "probe" if path == "probe" else "torch"
        inst = ["--instrument", "vllm"] if path in ("probe", "torch-instrument") else []
        cmd = [sys.executable, "-m", "srtscope", "capture", "--backend", backend, *inst, "--out",
               str(out / CAPTURE_TRACE), "--", str(py), *driver]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"vllm_rig: the driver failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["source"] = {"vllm": "vLLM torch profiler", "torch": "srtscope capture --backend torch",
                          "torch-instrument": "srtscope capture --backend torch --instrument vllm",
                          "probe": "srtscope capture --backend probe --instrument vllm"}[path]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def whole_trace(folder: Path) -> Path | None:
    """A whole-driver capture's trace in ``folder``: the torch backend's, the probe backend's merged
    one, or its single process's."""
    if (folder / CAPTURE_TRACE).exists():
        return folder / CAPTURE_TRACE
    procs = sorted(folder.glob("capture.pid*.json.gz"))
    return procs[0] if len(procs) == 1 else None


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
    placed: bool            # the fault's time in its own class: recovered within 15%, and the other
                            # host class (scheduler <-> prep) up by under 15% of it on the clean runs
    own_baseline: bool = False   # recovered against the run's own steps without the fault


def own_baseline(f: RunFigures, cls: str) -> float | None:
    """An intermittent fault's baseline: the median lost time of ``cls`` (scheduler / prep) per step
    over the run's own steps the fault did not fire in — under the run's own load, which drifts
    from one run to the next on a shared machine (the clean runs' median drifted 1.6 to 13.6 ms a
    step under load, read as the stall's own time). None when the fault fired in over half the
    steps (a steady fault: the clean runs are the baseline) or no step tells."""
    if not f.per_step or len(f.fired) != len(f.per_step) or not any(f.fired):
        return None
    k = 0 if cls == "scheduler" else 1
    quiet = [x[k] for x, fired in zip(f.per_step, f.fired) if not fired]
    if len(quiet) < 2 or len(quiet) < len(f.per_step) / 2:
        return None
    return float(np.median(quiet))


def check(figs: list[RunFigures], i: int) -> FaultCheck:
    f = figs[i]
    want = EXPECTED[f.fault]
    clean = [c for c in figs if c.fault == "clean"]
    nan = float("nan")
    base = float(np.median([c.cause_ns.get(want, 0.0) for c in clean])) if clean else 0.0
    own = own_baseline(f, CLASS[want])
    if own is not None:
        base = own
    rec = f.cause_ns.get(want, 0.0) - base
    err = (rec - f.injected_ns) / f.injected_ns if f.injected_ns else nan
    pred = f.what_if_ns.get(want, nan)
    ref = float(np.median([c.step_ns for c in clean])) if clean else nan
    ref_fwd = float(np.median([c.compute_ns for c in clean])) if clean else nan
    # the what-if holds device work as measured; on the CPU the forward right after a host delay
    # runs slower than in the clean runs: werr_fwd is the error with that difference taken out
    other = "prep_ns" if CLASS[want] == "scheduler" else "sched_ns"
    leak = getattr(f, other) - (float(np.median([getattr(c, other) for c in clean])) if clean else 0.0)
    placed = abs(err) <= 0.15 and leak <= 0.15 * f.injected_ns
    return FaultCheck(f, f.cause == want and f.bottleneck == CLASS[want], f.injected_ns, rec, err, ref, pred,
                      (pred - ref) / ref if ref else nan, ref_fwd,
                      (pred - (f.compute_ns - ref_fwd) - ref) / ref if ref else nan, placed, own is not None)


@dataclass(frozen=True)
class PathSummary:
    """One capture path's figures over its rounds: per fault, (named runs, placed runs, runs,
    recovered errors);
    the clean runs' scheduler and prep lost time per step (ns), and their verdicts."""

    path: str
    faults: dict[str, tuple[int, int, int, list[float]]]
    clean_sched_ns: list[float]
    clean_prep_ns: list[float]
    clean_verdicts: list[str]


def report(manifest: dict, figs: list[RunFigures], path: str = "vllm") -> tuple[bool, PathSummary]:
    print(f"\n== {path}: vLLM {manifest['vllm']} (CPU), {Path(manifest['model']).name}, {manifest['requests']} "
          f"requests x {manifest['tokens']} tokens, in-process engine core, custom scopes, traced by "
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
              f"{_ms(c.recovered_ns) + ('*' if c.own_baseline else ' '):>10} {c.err:+6.0%} "
              f"{_ms(c.clean_step_ns):>10} {_ms(c.what_if_ns):>8} "
              f"{c.what_if_err:+6.0%} {_ms(f.compute_ns):>8} {_ms(c.clean_fwd_ns):>9} {c.what_if_err_fwd:+7.0%}")
    # medians over the rounds: the machine's load drifts, one run is one sample
    ok = True
    per_fault: dict[str, tuple[int, int, int, list[float]]] = {}
    print(f"\nmedian over the rounds{'':14} named placed  recovered err  what-if err  err@fwd")
    for fault in FAULTS:
        cs = [c for c in checks if c.fig.fault == fault]
        if not cs:
            continue
        named = sum(c.named for c in cs)
        err = float(np.median([c.err for c in cs]))
        werr = float(np.median([c.what_if_err for c in cs]))
        werr_fwd = float(np.median([c.what_if_err_fwd for c in cs]))
        placed = sum(c.placed for c in cs)
        per_fault[fault] = (named, placed, len(cs), [c.err for c in cs])
        good = named == len(cs) and abs(err) <= 0.15
        ok &= good
        print(f"  {fault:6} -> {CLASS[EXPECTED[fault]] + ' / ' + EXPECTED[fault]:24} {named}/{len(cs)}  "
              f"{placed}/{len(cs)}  "
              f"{err:+13.0%}  {werr:+11.0%}  {werr_fwd:+7.0%}{'' if good else '   <- off target'}")
    clean = [f for f in figs if f.fault == "clean"]
    sched = float(np.median([f.sched_ns for f in clean])) if clean else 0.0
    prep = float(np.median([f.prep_ns for f in clean])) if clean else 0.0
    ok &= sched <= 2e6 and prep <= 2e6
    print(f"  clean  ({len(clean)} runs): scheduler {_ms(sched)} ms, prep {_ms(prep)} ms lost per step")
    print("\ntargets (on the medians): injected cause named in every run; recovered within 15% of the injected "
          "time per step; clean: scheduler and prep at most 2 ms per step (the what-if is shown, not a target)")
    print("all targets met" if ok else "some targets missed")
    return ok, PathSummary(path, per_fault, [f.sched_ns for f in clean], [f.prep_ns for f in clean],
                           [f"{f.bottleneck}/{f.cause}" for f in clean])


def _spread(xs: list[float], scale: float = 1.0, fmt: str = "{:+.0%}") -> str:
    if not xs:
        return "-"
    v = [x * scale for x in xs]
    return f"{fmt.format(float(np.median(v)))} [{fmt.format(min(v))}..{fmt.format(max(v))}]"


def summary(rows: list[PathSummary]) -> None:
    """One table: per fault and capture path, runs named / runs and the recovered error's median
    [min..max]; the clean runs' scheduler and prep loss per step (ms) and verdicts."""
    print("\n== per fault and capture path: runs named (the verdict's class / cause), runs placed (the fault's "
          "time in its own class, within 15%, not in the other host class), recovered vs inside the fault "
          "(median [min..max])")
    print(f"{'fault':8} {'expected':24} " + " ".join(f"{r.path:>30}" for r in rows))
    for fault in FAULTS:
        cells = []
        for r in rows:
            if fault not in r.faults:
                cells.append(f"{'-':>30}")
                continue
            named, placed, n, errs = r.faults[fault]
            cells.append(f"{f'{named}/{n} {placed}/{n} ' + _spread(errs):>30}")
        if any(fault in r.faults for r in rows):
            print(f"{fault:8} {CLASS[EXPECTED[fault]] + ' / ' + EXPECTED[fault]:24} " + " ".join(cells))
    for label, attr in (("clean sched ms/step", "clean_sched_ns"), ("clean prep ms/step", "clean_prep_ns")):
        print(f"{label:33} " + " ".join(f"{_spread(getattr(r, attr), 1e-6, '{:.1f}'):>30}" for r in rows))
    for r in rows:
        counts: dict[str, int] = {}
        for v in r.clean_verdicts:
            counts[v] = counts.get(v, 0) + 1
        print(f"clean verdicts, {r.path}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))


def diagnose_folder(folder: Path, manifest: dict) -> list[RunFigures]:
    """The runs' figures: one trace per run (vLLM's profiler), or one whole-driver capture cut into
    the warm-up's steps and then each run's ``tokens`` steps."""
    whole = whole_trace(folder)
    if whole is not None and not any(r["trace"] for r in manifest["runs"]):
        tl = load_timeline(whole)
        n = manifest["tokens"]
        total = int(diagnose(tl, DiagnoseParams()).to_json()["steps"]["count"])
        if total != n * (len(manifest["runs"]) + 1):
            print(f"vllm_rig: {whole.name} holds {total} steps, not {n} x {len(manifest['runs']) + 1} "
                  "(warm-up and runs): the runs are cut by step index all the same", file=sys.stderr)
        return [figures(tl, r["run"], r["fault"], (n * (i + 1), n * (i + 2) - 1), r.get("inside_ms", 0) * 1e6,
                        fired_steps=r.get("fired_steps"))
                for i, r in enumerate(manifest["runs"])]
    return [figures(load_timeline(folder / r["trace"]), r["run"], r["fault"])
            for r in manifest["runs"] if r["trace"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="delays injected into vLLM vs srtscope's diagnosis")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_VENV", HERE / ".venv")))
    p.add_argument("--out", type=Path, default=Path("runs/engines/vllm"))
    p.add_argument("--traces", type=Path, help="diagnose the driver's traces already in this folder "
                   "(one subfolder per capture path)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"capture paths, of {', '.join(PATHS)}")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"faults, of {', '.join(FAULTS)}")
    p.add_argument("--model", default="tiny-llama-decode", help="a model folder inside the venv (setup_vllm.sh "
                   "makes tiny-llama: 4 layers, hidden 256; tiny-llama-decode: 12 layers, hidden 384)")
    p.add_argument("--delay-ms", type=float, default=20.0, help="sched, prep and result faults' delay "
                   "(alloc: 15 ms, every4: 60 ms every 4th step; vllm_driver.py)")
    p.add_argument("--delay-kind", choices=("sleep", "spin"), default="sleep",
                   help="how the injected delay waits: sleep (the default: a busy-wait slows the next forward "
                        "on a shared machine) or spin (a busy-wait: no idle state for the core to fall into)")
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2, help="rounds of clean/fault pairs, per path")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds >= 1")
    paths = [x for x in a.paths.split(",") if x]
    bad = [x for x in paths if x not in PATHS] + [f for f in a.faults.split(",") if f and f not in FAULTS]
    if bad:
        p.error(f"unknown path or fault: {', '.join(bad)}")
    ok, rows = True, []
    for path in paths:
        if a.traces:
            folder = a.traces / path
            if not (folder / "manifest.json").exists():
                continue
            manifest = json.loads((folder / "manifest.json").read_text())
        else:
            folder = a.out / path
            manifest = run_driver(a.venv.resolve(), folder.resolve(), a, path)
        good, row = report(manifest, diagnose_folder(folder, manifest), path)
        ok &= good
        rows.append(row)
    summary(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
