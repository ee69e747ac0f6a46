"""Ground truth on real SGLang: busy-waits injected into SGLang 0.5.23's own functions vs what srtscope says.

    .venv/bin/python -m benchmarks.engines.sglang_rig [--venv /path/to/sglang-venv] [--mode offline|server|both]
                                                      [--delay-ms 15] [--tokens 16] [--traces DIR]

Runs ``sglang_driver.py`` in the SGLang venv (``setup_sglang.sh`` makes it; default ``$SGLANG_VENV`` or
``benchmarks/engines/.venv-sglang``): clean runs alternated with one run per fault (``sched`` in
``get_next_batch_to_run``, ``prep`` at ``ForwardBatch.init_new``, ``result`` in
``process_batch_result``, ``sched4``: a longer busy-wait every 4th ``get_next_batch_to_run``), each
traced by SGLang's own profiler (activities CPU, no stacks), offline (``sgl.Engine``) and as a server
(``python -m sglang.launch_server``, ``/start_profile``). Every trace is then read and diagnosed by
srtscope like any user's trace (``--traces DIR``: diagnose the traces already in DIR instead).

Per faulty run, against the clean runs of the same mode (their median):
- ``named``: the verdict's class / cause (sched, sched4, result -> scheduler / sched_cpu; prep ->
  prep / batch_prep);
- ``inside``: the time measured inside the injected busy-waits that lies in the diagnosed steps, per
  step (read from the trace: each sits in a ``srtscope.rig.inject`` range; the driver's
  ``inject.jsonl`` holds every fire, the finishing turn's after the last forward too);
- ``recovered``: the injected cause's lost time per step less the clean runs' (target: within 15%).
Per clean run: scheduler and prep lost time per step (target: at most 2 ms).
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

from benchmarks.engines.vllm_rig import RunFigures, figures
from srtscope.analyzers.readers import load_timeline

HERE = Path(__file__).resolve().parent
#: the fault -> the class / cause it must be found as
EXPECTED = {"sched": ("scheduler", "sched_cpu"), "prep": ("prep", "batch_prep"),
            "alloc": ("prep", "batch_prep"), "result": ("scheduler", "sched_cpu")}
TARGET = 0.15


def run_driver(venv: Path, out: Path, mode: str, a: argparse.Namespace) -> dict:
    """Run the driver in the SGLang venv; its manifest."""
    py = venv / "bin" / "python"
    model = venv / a.model
    if not py.exists() or not model.exists():
        sys.exit(f"sglang_rig: no SGLang venv with the tiny model at {venv} "
                 f"(make it: benchmarks/engines/setup_sglang.sh {venv})")
    cmd = [str(py), str(HERE / "sglang_driver.py"), "--model", str(model), "--out", str(out), "--mode", mode,
           "--runs", a.runs, "--delay-ms", str(a.delay_ms), "--every-delay-ms", str(a.every_delay_ms),
           "--tokens", str(a.tokens), "--requests", str(a.requests)]
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"sglang_rig: the driver failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "manifest.json").read_text())


@dataclass(frozen=True)
class Check:
    """One faulty run against the clean runs of its mode."""

    name: str
    fig: RunFigures
    named: bool
    inside_ns: float        # per step
    recovered_ns: float     # per step
    err: float


def fault_of(name: str) -> str:
    return name.rstrip("0123456789")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:6.2f}"


def report(manifest: dict, runs: list[tuple[str, RunFigures]]) -> bool:
    print(f"\nSGLang {manifest['sglang']} (CPU, torch {manifest['torch']}), {manifest['mode']}, "
          f"{Path(manifest['model']).name}, {manifest['requests']} requests x {manifest['tokens']} tokens, "
          f"{manifest['delay_kind']} delays, traced by {manifest['profiler']}")
    before, after = manifest["loadavg"]
    print(f"host load average (1 min) {before} before the runs, {after} after, on {manifest['cpus']} cores")
    clean = [f for n, f in runs if n == "clean"]
    print(f"{'run':>3} {'fault':7} {'steps':>5} {'verdict':24} {'inside/step':>11} {'recov/step':>10} {'err':>6}   ms")
    ok = True
    for name, f in runs:
        if name == "clean":
            print(f"{f.run:3d} {name:7} {f.steps:5d} {f.bottleneck + ' / ' + f.cause:24} "
                  f"sched {_ms(f.sched_ns)}  prep {_ms(f.prep_ns)} lost per step")
            continue
        cls, cause = EXPECTED[fault_of(name)]
        base = float(np.median([c.cause_ns.get(cause, 0.0) for c in clean])) if clean else 0.0
        rec = f.cause_ns.get(cause, 0.0) - base
        err = (rec - f.injected_ns) / f.injected_ns if f.injected_ns else float("nan")
        named = (f.bottleneck, f.cause) == (cls, cause)
        good = named and abs(err) <= TARGET
        ok &= good
        print(f"{f.run:3d} {name:7} {f.steps:5d} {f.bottleneck + ' / ' + f.cause:24} {_ms(f.injected_ns):>11} "
              f"{_ms(rec):>10} {err:+6.0%}{'' if good else '   <- off target'}")
    sched = float(np.median([f.sched_ns for f in clean])) if clean else 0.0
    prep = float(np.median([f.prep_ns for f in clean])) if clean else 0.0
    accused = [f.run for f in clean if f.bottleneck in ("scheduler", "prep")]
    ok &= sched <= 2e6 and prep <= 2e6
    print(f"clean ({len(clean)} runs, median): scheduler {_ms(sched)} ms, prep {_ms(prep)} ms lost per step; "
          f"called scheduler or prep: {accused or 'none'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="busy-waits injected into SGLang vs srtscope's diagnosis")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("SGLANG_VENV", HERE / ".venv-sglang")))
    p.add_argument("--out", type=Path, default=Path("runs/engines/sglang"))
    p.add_argument("--traces", type=Path, help="diagnose the driver's traces already in this folder "
                   "(one mode's: its manifest.json)")
    p.add_argument("--mode", choices=("offline", "server", "both"), default="both")
    p.add_argument("--model", default="tiny-llama", help="a model folder inside the venv (setup_sglang.sh "
                   "makes tiny-llama: 4 layers, hidden 256; tiny-llama-decode: 12 layers, hidden 384)")
    p.add_argument("--runs", default="clean,sched,clean,prep,clean,result,clean,sched4,clean")
    p.add_argument("--delay-ms", type=float, default=15.0)
    p.add_argument("--every-delay-ms", type=float, default=60.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=8)
    a = p.parse_args(argv)
    if a.traces:
        folders = [a.traces]
    else:
        modes = ("offline", "server") if a.mode == "both" else (a.mode,)
        folders = []
        for mode in modes:
            run_driver(a.venv.resolve(), (a.out / mode).resolve(), mode, a)
            folders.append(a.out / mode)
    ok = True
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        runs = [(r["name"], figures(load_timeline(folder / r["trace"]), r["run"], r["fault"]))
                for r in manifest["runs"] if r["trace"]]
        ok &= report(manifest, runs)
    print("\ntargets: the injected cause named in every faulty run, recovered within 15% of the time measured "
          "inside the busy-waits; clean: scheduler and prep at most 2 ms per step")
    print("all targets met" if ok else "some targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
