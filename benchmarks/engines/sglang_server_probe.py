"""The rig's ``server-probe`` path (``sglang_rig.py --paths server-probe``): one SGLang server started under
``srtscope capture --backend probe --instrument sglang -o NAME``, each run read by ``srtscope capture
--server URL --probe NAME`` (its built-in load: ``--requests`` completions of ``--tokens`` tokens).

The server is ``sglang_driver.py --serve-child`` (``python -m sglang.launch_server`` with the driver as
``__main__``, so that the scheduler process SGLang spawns gets the faults); the rig switches the active
fault between runs through the driver's control file. The capture's merged probe trace
(``NAME.server<EPOCH>.json.gz``: the scheduler process's spans with the others') is each run's trace; the
driver's fault log gives each fire's perf_counter_ns times (the probe traces' clock).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.engines.server_proc import free_port, stop, wait_up
from benchmarks.engines.sglang_driver import CONTROL_ENV, LOG_ENV, SERVE_CHILD, FaultSwitch, _server_args
from benchmarks.engines.vllm_rig import RunFigures, figures
from srtscope.analyzers.readers import load_timeline

HERE = Path(__file__).resolve().parent
SRTSCOPE = [sys.executable, "-m", "srtscope"]
FLUSH_S = "1"      # the server's processes flush their probe traces every second (the capture waits one)


def _venv_versions(py: Path) -> tuple[str, str]:
    out = subprocess.run([str(py), "-c", "from importlib.metadata import version as v; "
                          "print(v('sglang'), v('torch'))"], capture_output=True, text=True, check=True)
    sglang, torch = out.stdout.split()
    return sglang, torch


def run_server_probe(venv: Path, out: Path, a: argparse.Namespace, runs: str) -> dict:
    """Start the instrumented server, run ``runs`` (``clean,sched,...``) through ``capture --server
    --probe``; the manifest (as the driver's: per run its trace, fault and fires)."""
    py = venv / "bin" / "python"
    if not py.exists() or not (venv / a.model).exists():
        sys.exit(f"sglang_rig: no SGLang venv with the tiny model at {venv} "
                 f"(make it: benchmarks/engines/setup_sglang.sh {venv})")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("srv*.json.gz"):
        old.unlink()
    control, flog = out / ".control", out / "inject.jsonl"
    switch = FaultSwitch(control)
    flog.write_text("")
    set_fault = switch.set
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [str(py), str(HERE / "sglang_driver.py"), SERVE_CHILD, *_server_args(str(venv / a.model), port)]
    cmd = [*SRTSCOPE, "capture", "--backend", "probe", "--instrument", "sglang", "-o", str(out / "srv"), "--", *serve]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1", CONTROL_ENV: str(control),
                LOG_ENV: str(flog), "SRTSCOPE_PROBE_FLUSH_S": FLUSH_S})
    log = out / "server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    done = []
    try:
        wait_up(url + "/health_generate", proc, 600, "sglang_rig", str(log), timeout_s=60)
        warm = [*SRTSCOPE, "capture", "--server", url, "--probe", str(out / "srv"), "--load", str(a.requests),
                "--concurrency", str(a.requests), "--max-tokens", str(a.tokens), "--wait", "120", "--no-diagnose"]
        subprocess.run(warm, env=env, capture_output=True, text=True, timeout=600)       # warm-up, not kept
        load_before = os.getloadavg()[0]
        for i, name in enumerate(x for x in runs.split(",") if x):
            fault = name.rstrip("0123456789")
            every = int(name[len(fault):] or 1)
            delay = a.delay_ms if every == 1 else a.every_delay_ms
            time.sleep(0.5)
            mark = flog.stat().st_size
            set_fault(fault, every, delay if fault != "clean" else 0)
            t = time.perf_counter()
            p = subprocess.run(warm, env=env, capture_output=True, text=True, timeout=600)
            wall = time.perf_counter() - t
            set_fault("clean", 1, 0)
            trace = next((ln.split("written to ", 1)[1].strip() for ln in p.stderr.splitlines()
                          if "written to " in ln), None)
            if p.returncode or trace is None:
                sys.exit(f"sglang_rig: capture --server --probe failed (exit {p.returncode}): "
                         f"{p.stderr.strip().splitlines()[-1:]}")
            kept = out / f"run{i:02d}_{name}.json.gz"
            os.replace(trace, kept)
            with open(flog) as f:
                f.seek(mark)
                fired = [x for x in (json.loads(ln) for ln in f if ln.strip()) if x["fault"] == fault]
            done.append({"run": i, "name": name, "fault": fault, "every": every,
                         "delay_ms": delay if fault != "clean" else 0.0, "fired": len(fired),
                         "inside_fault_ns": sum(x["ns"] for x in fired),
                         "fires_ns": [[x["t0"], x["t1"]] for x in fired],
                         "wall_s": round(wall, 4), "trace": kept.name,
                         "said": [ln for ln in p.stderr.splitlines() if ln.startswith("srtscope:")]})
            print(f"run {i:2d} {name:7s} fired {len(fired):3d}  wall {wall:6.1f} s  {kept.name}", flush=True)
    finally:
        stop(proc)
        switch.close()
        control.unlink(missing_ok=True)
    sglang, torch = _venv_versions(py)
    manifest = {"sglang": sglang, "torch": torch, "mode": "server", "model": a.model, "requests": a.requests,
                "tokens": a.tokens, "delay_kind": "spin", "profiler": "none", "source": "server-probe",
                "capture_command": f"srtscope capture --backend probe --instrument sglang -o {out / 'srv'} -- "
                                   f"python sglang_driver.py {SERVE_CHILD} ...; srtscope capture --server {url} "
                                   f"--probe {out / 'srv'} --load {a.requests} --max-tokens {a.tokens}",
                "cpus": os.cpu_count(), "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                "runs": done}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def diagnose_server_runs(folder: Path, manifest: dict) -> list[tuple[str, RunFigures]]:
    """(run name, figures) per run, from each run's merged probe trace."""
    return [(r["name"], figures(load_timeline(folder / r["trace"]), r["run"], r["fault"],
                                fires=[tuple(x) for x in r["fires_ns"]]))
            for r in manifest["runs"]]
