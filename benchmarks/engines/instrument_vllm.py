"""Real vLLM under ``srtscope capture --instrument vllm``: delays injected into vLLM's own functions
(the rig's ``vllm_driver.py``, one fault per capture) vs what srtscope says of the stage ranges it
put around vLLM's functions — no vLLM profiler involved (``--backend probe``).

    python benchmarks/engines/instrument_vllm.py --python VENV/bin/python --model VENV/tiny-llama \\
        --out /tmp/instr [--faults clean,sched,prep,result,clean] [--delay-ms 20] [--tokens 24]

Per capture: the verdict's class / cause; the injected delay per measured step (the driver's
``fired`` count x delay / steps); ``recovered``: the injected cause's class's lost time per step,
less the clean captures' mean (target: within 10% of injected); ``what-if``: the faulty mean step
predicted without that cause vs the clean captures' mean step (target: within 15%; the what-if
keeps the measured forward time, and on a CPU the forward after a 20 ms sleep runs slower than in
a clean run — the ``compute`` column shows by how much). The driver
generates twice (a warm-up, then the run); only the run's steps (the last ``--tokens``) are
diagnosed (``--steps``). srtscope must be importable by ``--python``: this script puts the
repository first on its PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = HERE / "vllm_driver.py"
SRTSCOPE = [sys.executable, "-m", "srtscope"]
#: injected fault -> (class, cause) it must be named as: sched.result is the scheduler's stage
EXPECT = {"sched": ("scheduler", "sched_cpu"), "prep": ("prep", "batch_prep"),
          "result": ("scheduler", "sched_cpu")}


def capture(a: argparse.Namespace, fault: str, name: str) -> tuple[dict, dict]:
    """One driver run under the capture; (its diagnosis of the measured steps, its manifest)."""
    out = a.out / name
    drv_out = a.out / f"drv_{name}"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [*SRTSCOPE, "capture", "--backend", "probe", "--instrument", "vllm", "--out", str(out), "--",
           a.python, str(a.driver), "--model", a.model, "--out", str(drv_out), "--runs", fault,
           "--profiler", "none", "--requests", str(a.requests), "--tokens", str(a.tokens),
           "--delay-ms", str(a.delay_ms)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    traces = sorted(a.out.glob(f"{name}.pid*.json.gz"))
    if p.returncode != 0 or not traces:
        sys.exit(f"{name}: capture failed (exit {p.returncode}): {p.stderr[-2000:]}")
    trace = a.out / f"{name}.json.gz" if len(traces) > 1 else traces[-1]
    full = _diagnose(trace, None)
    first = max(full["steps"]["count"] - a.tokens, 0)
    return _diagnose(trace, f"{first}:"), json.loads((drv_out / "manifest.json").read_text())


def _diagnose(trace: Path, steps: str | None) -> dict:
    cmd = [*SRTSCOPE, "diagnose", str(trace), "--json", "--no-cache"] + (["--steps", steps] if steps else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"diagnose {trace}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:7.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", required=True, help="the vLLM venv's interpreter")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--faults", default="clean,sched,prep,result,clean")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--driver", type=Path, default=DRIVER, help="the rig's vllm_driver.py")
    a = p.parse_args(argv)
    if not a.driver.is_file():
        sys.exit(f"{a.driver} not found: this check runs the rig's driver")
    a.out.mkdir(parents=True, exist_ok=True)
    faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    runs = []
    for i, fault in enumerate(faults):
        diag, manifest = capture(a, fault, f"{i:02d}_{fault}")
        runs.append((fault, diag, manifest))
    clean = [d for f, d, _ in runs if f == "clean"]
    if not clean:
        sys.exit("--faults needs at least one clean capture")
    clean_step = mean(d["budget"]["mean_step"]["wall_ns"] for d in clean)
    print(f"vLLM {runs[0][2].get('vllm')}, {a.requests} requests x {a.tokens} tokens, delay {a.delay_ms:g} ms, "
          f"OMP_NUM_THREADS=1, loadavg {runs[0][2].get('loadavg')}")
    print(f"{'capture':14} {'steps':>5} {'verdict':26} {'step ms':>8} {'compute':>8} {'injected':>8} "
          f"{'recovered':>9} {'err':>6} {'what-if':>8} {'clean':>7} {'err':>6}  sched/prep ms per step")
    ok = True
    for i, (fault, d, manifest) in enumerate(runs):
        b, v = d["budget"], d["verdict"]
        n = max(b["steps"], 1)
        per = {c: b["bubbles_ns"].get(c, 0) / n for c in ("scheduler", "prep")}
        line = (f"{i:02d}_{fault:10} {b['steps']:5d} {v['bottleneck'] + ' / ' + v['cause']:26} "
                f"{_ms(b['mean_step']['wall_ns']):>8} {_ms(b['mean_step']['compute_ns']):>8}")
        if fault in EXPECT:
            cls, cause = EXPECT[fault]
            run = manifest["runs"][0]
            injected = run["delay_ms"] * 1e6 * run["fired"] / n
            base = mean(c["budget"]["bubbles_ns"].get(cls, 0) / max(c["budget"]["steps"], 1) for c in clean)
            rec = b["bubbles_ns"].get(cls, 0) / n - base
            wi = [w for w in d["what_if"] if w["cause"] == cause]
            pred = wi[0]["step_ns_after"] if wi else b["mean_step"]["wall_ns"]
            named = (v["bottleneck"], v["cause"]) == (cls, cause)
            err, werr = (rec - injected) / injected, (pred - clean_step) / clean_step
            ok &= named and abs(err) <= 0.10 and abs(werr) <= 0.15
            line += (f" {_ms(injected):>8} {_ms(rec):>9} {100 * err:+5.1f}% {_ms(pred):>8} {_ms(clean_step):>7} "
                     f"{100 * werr:+5.1f}%" + ("" if named else "  (not named)"))
        else:
            line += " " * 58
            ok &= per["scheduler"] <= 2e6 and per["prep"] <= 2e6
        print(line + f"  {per['scheduler'] / 1e6:.2f} / {per['prep'] / 1e6:.2f}")
    print("targets: injected cause named; recovered within 10%; what-if within 15% of the clean step; "
          "clean: scheduler and prep under 2 ms a step -> " + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
