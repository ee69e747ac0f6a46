"""A real multi-process vLLM server (API server, engine core, worker) with a delay injected into its
own functions, profiled by ``srtscope capture --server`` the two ways docs/engines.md gives:

- ``profiler``: the server started with vLLM's torch profiler (stacks off), ``capture --server URL
  --trace-dir DIR``: the worker's trace (the scheduler's engine-core process is not in it);
- ``probe``: the server started under ``srtscope capture --backend probe --instrument vllm -o NAME``,
  then ``capture --server URL --probe NAME``: every process's stage spans, cut to the capture.

    .venv/bin/python -m benchmarks.engines.vllm_server_rig [--venv VLLM_VENV] [--paths profiler,probe]
                                                           [--faults clean,sched,alloc] [--delay-ms 20]
    .venv/bin/python -m benchmarks.engines.vllm_server_rig --rediagnose sample_traces/vllm
        (no server: the kept ``vllm_server_probe_*`` traces diagnosed again, against their manifest's
        time inside each fault)

Per server (one per path and fault; ``server_faults/sitecustomize.py`` injects the fault in every
process, once per engine step): the verdict's class / cause of the capture's diagnosis, the lost
time per step of the fault's class less the clean server's on the same path (``(handoff)``: the part
of the host's that is the hand-off between the engine core and its worker, the engine core blocked on
it in ``sync.wait`` while it runs no stage), against the injected
delay per step (the fault fires in each ``Scheduler.schedule()`` call, one per step; the delay is a
sleep, measured inside the fault by the server's own fault log: its time inside the fault over the
scheduler's calls, one a step), and the
one-line notes ``--server`` printed.
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

HERE = Path(__file__).resolve().parent
SRTSCOPE = [sys.executable, "-m", "srtscope"]
EXPECT = {"sched": ("scheduler", "sched_cpu"), "alloc": ("prep", "batch_prep"), "prep": ("prep", "batch_prep"),
          "result": ("scheduler", "sched_cpu"), "every4": ("scheduler", "sched_cpu")}


def _fault_measure(log: Path) -> float:
    """The time inside the fault per engine step (ms): the server processes' fault log, its time
    inside the fault over the scheduler's calls (one a step; the capture's load is the server's only
    traffic)."""
    last: dict[int, dict] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            d = json.loads(line)
            last[d["pid"]] = d
    inside = sum(d["inside_ms"] for d in last.values())
    calls = max((d.get("schedule_calls", 0) for d in last.values()), default=0)
    return inside / calls if calls else 0.0


def one(a: argparse.Namespace, path: str, fault: str) -> dict:
    """Start a server for (path, fault), profile it with --server, diagnose; its figures."""
    py = a.venv / "bin" / "python"
    out = (a.out / f"{path}_{fault}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(a.venv / a.model), "--port",
             str(port), "--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "8",
             "--kv-cache-memory-bytes", str(256 << 20), "--served-model-name", "tiny"]
    trace_dir = out / "vt"
    trace_dir.mkdir(exist_ok=True)
    if path == "profiler":
        serve += ["--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir),
                                                   "torch_profiler_with_stack": False})]
        cmd = serve
    else:
        cmd = [*SRTSCOPE, "capture", "--backend", "probe", "--instrument", "vllm", "-o", str(out / "srv"), "--",
               *serve]
    flog = out / "faults.jsonl"
    flog.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE / "server_faults"), "SRTSCOPE_RIG_FAULT": fault,
                "SRTSCOPE_RIG_DELAY_MS": str(a.delay_ms), "SRTSCOPE_RIG_FAULT_LOG": str(flog),
                "SRTSCOPE_RIG_STALL_MS": str(a.stall_ms),
                "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"})
    load_before = os.getloadavg()[0]
    with open(out / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_up(url + "/v1/models", proc, a.start_timeout, "vllm_server_rig")
        cap = [*SRTSCOPE, "capture", "--server", url, "--load", str(a.load), "--concurrency", "8",
               "--max-tokens", str(a.tokens), "--wait", "120",
               *(["--trace-dir", str(trace_dir)] if path == "profiler" else ["--probe", str(out / "srv")])]
        t0 = time.monotonic()
        p = subprocess.run(cap, capture_output=True, text=True, timeout=600)
        took = time.monotonic() - t0
    finally:
        stop(proc)
    if p.returncode:
        return {"path": path, "fault": fault, "error": p.stderr.strip().splitlines()[-1:]}
    if path == "profiler":
        traces = [ln.split("the server wrote ", 1)[1].strip() for ln in p.stderr.splitlines()
                  if "the server wrote " in ln and "front end" not in ln]
    else:
        traces = [ln.split("written to ", 1)[1].strip() for ln in p.stderr.splitlines() if "written to " in ln]
    d = subprocess.run([*SRTSCOPE, "diagnose", *traces, "--json", "--no-cache"], capture_output=True, text=True,
                       timeout=600)
    if d.returncode or not traces:
        return {"path": path, "fault": fault, "error": (d.stderr or p.stderr).strip().splitlines()[-1:]}
    return {**_figures(json.loads(d.stdout), path, fault),
            "inside_ms": round(_fault_measure(flog), 2), "capture_s": round(took, 1),
            "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)], "cpus": os.cpu_count(),
            "command": " ".join(cap),
            "traces": traces, "said": [ln for ln in p.stderr.splitlines() if ln.startswith("srtscope:")]}


def _figures(doc: dict, path: str, fault: str) -> dict:
    """A diagnosis's figures per step (ms): the verdict, the lost time per class, the hand-off."""
    steps = max(int(doc["steps"]["count"]), 1)
    v = doc["verdict"]
    return {"path": path, "fault": fault, "steps": steps, "verdict": f"{v['bottleneck']} / {v['cause']}",
            "scores_ms": {k: round(x / steps / 1e6, 2) for k, x in v["scores_ns"].items()},
            # the engine core blocked on its worker while the worker runs no stage: a part of the host's
            "handoff_ms": round(doc["bubbles"]["by_cause"].get("handoff", 0) / steps / 1e6, 2)}


def rediagnosed(folder: Path) -> list[dict]:
    """The kept server traces of ``folder`` (``vllm_server_probe_<fault>.json.gz``, ``make_server.sh``)
    diagnosed again, each with its manifest's time inside the fault and load."""
    rows = []
    for r in json.loads((folder / "manifest_server.json").read_text()):
        trace = folder / f"vllm_server_probe_{r['fault']}.json.gz"
        d = subprocess.run([*SRTSCOPE, "diagnose", str(trace), "--json", "--no-cache"], capture_output=True,
                           text=True, timeout=600)
        if d.returncode:
            rows.append({"path": r["path"], "fault": r["fault"], "error": d.stderr.strip().splitlines()[-1:]})
            continue
        rows.append({**_figures(json.loads(d.stdout), r["path"], r["fault"]), "inside_ms": r["inside_ms"],
                     "loadavg": r.get("loadavg"), "said": []})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_VENV", HERE / ".venv")))
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--out", type=Path, default=Path("runs/engines/vllm_server"))
    p.add_argument("--paths", default="profiler,probe")
    p.add_argument("--faults", default="clean,sched,alloc,every4")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--stall-ms", type=float, default=60.0, help="every4: the stall in every 4th step")
    p.add_argument("--load", type=int, default=16)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--start-timeout", type=float, default=400.0)
    p.add_argument("--rediagnose", type=Path, default=None,
                   help="start no server: diagnose the kept traces of this folder again (sample_traces/vllm)")
    a = p.parse_args(argv)
    a.venv = a.venv.resolve()
    if a.rediagnose is not None:
        rows = rediagnosed(a.rediagnose)
    else:
        rows = [one(a, path, fault) for path in a.paths.split(",") for fault in a.faults.split(",")]
        (a.out / "figures.json").write_text(json.dumps(rows, indent=1))
    clean = {r["path"]: r for r in rows if r["fault"] == "clean" and "error" not in r}
    print(f"{'path':9} {'fault':6} {'steps':>5} {'verdict':26} {'inside':>7} {'recovered':>9} {'err':>6} "
          f"{'sched':>6} {'prep':>6} {'host':>6} {'(handoff)':>9}  ms/step")
    ok = True
    for r in rows:
        if "error" in r:
            print(f"{r['path']:9} {r['fault']:6} error: {r['error']}")
            ok = False
            continue
        sc = r["scores_ms"]
        line = (f"{r['path']:9} {r['fault']:6} {r['steps']:5d} {r['verdict']:26} {r['inside_ms']:7.2f} ")
        if r["fault"] in EXPECT:
            cls, cause = EXPECT[r["fault"]]
            base = clean.get(r["path"], {}).get("scores_ms", {}).get(cls, 0.0)
            rec = sc.get(cls, 0.0) - base
            err = (rec - r["inside_ms"]) / r["inside_ms"] if r["inside_ms"] else float("nan")
            named = r["verdict"] == f"{cls} / {cause}"
            ok &= named and abs(err) <= 0.15
            line += f"{rec:9.2f} {err:+6.0%} "
        else:
            line += f"{'':9} {'':6} "
        print(line + f"{sc.get('scheduler', 0):6.2f} {sc.get('prep', 0):6.2f} {sc.get('host', 0):6.2f} "
              f"{r.get('handoff_ms', 0):9.2f}")
        for s in r["said"]:
            if "worker process" in s or "--probe:" in s:
                print(f"{'':17}{s[:160]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
