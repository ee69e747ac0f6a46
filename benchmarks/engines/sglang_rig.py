"""Ground truth on real SGLang: busy-waits injected into SGLang 0.5.23's own functions vs what srtscope says,
on every capture path.

    .venv/bin/python -m benchmarks.engines.sglang_rig [--venv /path/to/sglang-venv] [--paths P,...]
                                                      [--faults sched,prep,...] [--delay-ms 15] [--tokens 16]
                                                      [--traces DIR]

Runs ``sglang_driver.py`` in the SGLang venv (``setup_sglang.sh`` makes it; default ``$SGLANG_VENV`` or
``benchmarks/engines/.venv-sglang``): clean runs alternated with one run per fault (``sched`` in
``get_next_batch_to_run``, ``prep`` in ``ForwardBatch.init_new``, ``result`` in
``process_batch_result``, ``alloc`` in the KV slot allocation of ``prepare_for_decode``, ``sched4``: a
longer busy-wait every 4th ``get_next_batch_to_run``), traced by each capture path of ``--paths``:
- ``sglang-offline`` / ``sglang-server``: SGLang's own profiler (activities CPU, no stacks), a trace per
  run, ``sgl.Engine`` / ``python -m sglang.launch_server`` with ``/start_profile``. ``alloc`` is not run
  there: SGLang's trace has no span of ``prepare_for_decode`` (inside ``get_next_batch_to_run``);
- ``torch-instrument``: ``srtscope capture --backend torch --instrument sglang -- <driver>`` offline (the
  scheduler process profiles itself: its trace is the one diagnosed);
- ``probe``: ``srtscope capture --backend probe --instrument sglang -- <driver>`` offline (the processes'
  stage spans, merged);
- ``server-probe``: a server started under ``srtscope capture --backend probe --instrument sglang -o NAME``
  (``sglang_server_probe.py``), each run read by ``srtscope capture --server URL --probe NAME``.
A whole-driver capture is cut into its runs at the driver's idle pauses between them (the warm-up first).
Every trace is read and diagnosed by srtscope like any user's trace (``--traces DIR``: diagnose the traces
already in DIR, one folder per path, instead).

Per faulty run, against the clean runs of the same path (their median):
- ``named``: the verdict's class / cause (sched, sched4, result -> scheduler / sched_cpu; prep, alloc ->
  prep / batch_prep);
- ``inside``: the time measured inside the injected busy-waits that lies in the diagnosed steps, per
  step (each sits in a ``srtscope.rig.inject`` range of a Kineto trace; a probe trace has none: the
  driver logs each fire's perf_counter_ns times, the probe traces' clock);
- ``recovered``: the injected cause's lost time per step less the clean runs' (target: within 15%).
Per clean run: scheduler and prep lost time per step (target: at most 2 ms), and never accused.
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
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.readers.errors import TraceError

HERE = Path(__file__).resolve().parent
PATHS = ("sglang-offline", "sglang-server", "torch-instrument", "probe", "server-probe")
FAULTS = ("sched", "prep", "result", "alloc", "sched4")
#: the fault -> the class / cause it must be found as
EXPECTED = {"sched": ("scheduler", "sched_cpu"), "prep": ("prep", "batch_prep"),
            "alloc": ("prep", "batch_prep"), "result": ("scheduler", "sched_cpu")}
#: paths whose traces cannot tell a fault apart (the reason is printed)
UNSEEN = {("sglang-offline", "alloc"): "SGLang's profiler has no span of prepare_for_decode",
          ("sglang-server", "alloc"): "SGLang's profiler has no span of prepare_for_decode"}
CAPTURE = "capture.json.gz"
TARGET = 0.15
#: a pause between two steps longer than this ends a run (the driver idles --pause-s between runs)
RUN_GAP_NS = 200_000_000


def run_list(a: argparse.Namespace, path: str) -> str:
    faults = [f for f in a.faults.split(",") if f and (path, f.rstrip("0123456789")) not in UNSEEN]
    return ",".join(x for f in faults for x in ("clean", f)) + ",clean"


def _driver_cmd(venv: Path, out: Path, a: argparse.Namespace, path: str, mode: str, profiler: str) -> list[str]:
    return [str(venv / "bin" / "python"), str(HERE / "sglang_driver.py"), "--model", str(venv / a.model),
            "--out", str(out), "--mode", mode, "--runs", run_list(a, path), "--delay-ms", str(a.delay_ms),
            "--every-delay-ms", str(a.every_delay_ms), "--tokens", str(a.tokens), "--requests", str(a.requests),
            "--profiler", profiler]


def run_driver(venv: Path, out: Path, a: argparse.Namespace, path: str) -> dict:
    """Run the driver in the SGLang venv on capture path ``path``; its manifest (``source``: the path)."""
    if not (venv / "bin" / "python").exists() or not (venv / a.model).exists():
        sys.exit(f"sglang_rig: no SGLang venv with the tiny model at {venv} "
                 f"(make it: benchmarks/engines/setup_sglang.sh {venv})")
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the probe backend's processes flush every second: the driver's last pause holds one flush (SGLang's
    # scheduler process is killed at shutdown, before an exit flush)
    env.update({"OMP_NUM_THREADS": "1", "SRTSCOPE_PROBE_FLUSH_S": "1"})
    if path.startswith("sglang-"):
        cmd = _driver_cmd(venv, out, a, path, path.split("-")[1], "sglang")
    else:
        backend = "torch" if path == "torch-instrument" else "probe"
        cmd = [sys.executable, "-m", "srtscope", "capture", "--backend", backend, "--instrument", "sglang",
               "--out", str(out / CAPTURE), "--", *_driver_cmd(venv, out, a, path, "offline", "none")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"sglang_rig: the driver failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["source"] = path
    manifest["capture_command"] = " ".join(cmd[:8]) + (" -- <driver>" if not path.startswith("sglang-") else "")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def scheduler_trace(folder: Path) -> tuple[Path, Timeline] | None:
    """The whole-driver capture's trace that holds the scheduler's steps: the probe backend's merged
    trace, else the process trace (torch backend: one per process) with the most steps."""
    if (folder / CAPTURE).exists() and not list(folder.glob("capture.pid*.json.gz")):
        return folder / CAPTURE, load_timeline(folder / CAPTURE)
    best: tuple[int, Path, Timeline] | None = None
    for p in sorted(folder.glob("capture*.json.gz")):
        if ".server" in p.name:
            continue
        try:
            tl = load_timeline(p)
        except TraceError:          # a process with no forward (the driver's own: no device stand-in)
            continue
        n = int(diagnose(tl, DiagnoseParams()).to_json()["steps"]["count"]) if len(tl.host_ranges) else 0
        if best is None or n > best[0]:
            best = (n, p, tl)
    return (best[1], best[2]) if best is not None and best[0] else None


def run_spans(per_step: list[dict], runs: int) -> list[tuple[int, int]]:
    """(first, last) step index of each of ``runs`` runs: steps cut where one ends more than
    ``RUN_GAP_NS`` before the next starts (the driver's pauses), the warm-up's steps first."""
    groups: list[list[int]] = []
    for i, s in enumerate(per_step):
        if not groups or s["start_ns"] - (per_step[i - 1]["start_ns"] + per_step[i - 1]["wall_ns"]) > RUN_GAP_NS:
            groups.append([])
        groups[-1].append(i)
    if len(groups) != runs + 1:
        sys.exit(f"sglang_rig: the capture holds {len(groups)} runs of steps, not the warm-up and {runs}")
    return [(g[0], g[-1]) for g in groups[1:]]


def diagnose_folder(folder: Path, manifest: dict) -> list[tuple[str, RunFigures]]:
    """(run name, figures) per run: one trace per run (SGLang's profiler), or one whole-driver capture
    cut into its runs."""
    runs = manifest["runs"]
    if any(r["trace"] for r in runs):
        return [(r["name"], figures(load_timeline(folder / r["trace"]), r["run"], r["fault"]))
                for r in runs if r["trace"]]
    got = scheduler_trace(folder)
    if got is None:
        sys.exit(f"sglang_rig: no trace with the scheduler's steps in {folder}")
    _, tl = got
    per = diagnose(tl, DiagnoseParams()).to_json()["steps"]["per_step"]
    spans = run_spans(per, len(runs))
    return [(r["name"], figures(tl, r["run"], r["fault"], span, fires=[tuple(x) for x in r.get("fires_ns", [])]))
            for r, span in zip(runs, spans)]


def fault_of(name: str) -> str:
    return name.rstrip("0123456789")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:6.2f}"


@dataclass(frozen=True)
class PathRow:
    """One path's figures: per run name, (named, recovered error); the clean runs'."""

    path: str
    faults: dict[str, list[tuple[bool, float]]]
    clean_sched_ns: list[float]
    clean_prep_ns: list[float]
    accused: int


def report(manifest: dict, runs: list[tuple[str, RunFigures]]) -> tuple[bool, PathRow]:
    path = manifest.get("source", f"sglang-{manifest['mode']}")
    print(f"\n== {path}: SGLang {manifest['sglang']} (CPU, torch {manifest['torch']}), {manifest['mode']}, "
          f"{Path(manifest['model']).name}, {manifest['requests']} requests x {manifest['tokens']} tokens, "
          f"{manifest['delay_kind']} delays, traced by "
          f"{manifest.get('capture_command') if manifest['profiler'] == 'none' else manifest['profiler']}")
    before, after = manifest["loadavg"]
    print(f"host load average (1 min) {before} before the runs, {after} after, on {manifest['cpus']} cores")
    clean = [f for n, f in runs if n == "clean"]
    print(f"{'run':>3} {'fault':7} {'steps':>5} {'verdict':24} {'inside/step':>11} {'recov/step':>10} {'err':>6}   ms")
    ok = True
    per: dict[str, list[tuple[bool, float]]] = {}
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
        per.setdefault(name, []).append((named, err))
        print(f"{f.run:3d} {name:7} {f.steps:5d} {f.bottleneck + ' / ' + f.cause:24} {_ms(f.injected_ns):>11} "
              f"{_ms(rec):>10} {err:+6.0%}{'' if good else '   <- off target'}")
    sched = float(np.median([f.sched_ns for f in clean])) if clean else 0.0
    prep = float(np.median([f.prep_ns for f in clean])) if clean else 0.0
    accused = [f.run for f in clean if f.bottleneck in ("scheduler", "prep")]
    ok &= sched <= 2e6 and prep <= 2e6 and not accused
    print(f"clean ({len(clean)} runs, median): scheduler {_ms(sched)} ms, prep {_ms(prep)} ms lost per step; "
          f"called scheduler or prep: {accused or 'none'}")
    for (p, fault), why in UNSEEN.items():
        if p == path:
            print(f"{fault}: not run ({why})")
    return ok, PathRow(path, per, [f.sched_ns for f in clean], [f.prep_ns for f in clean], len(accused))


def summary(rows: list[PathRow]) -> None:
    """One table: per fault and path, runs named / runs and the recovered error; clean figures."""
    print("\n== per fault and capture path: runs named / runs, recovered vs inside the busy-waits")
    print(f"{'fault':8} " + " ".join(f"{r.path:>18}" for r in rows))
    for fault in FAULTS:
        cells = []
        for r in rows:
            got = r.faults.get(fault)
            cells.append(f"{'-':>18}" if not got else
                         f"{f'{sum(n for n, _ in got)}/{len(got)} ' + ' '.join(f'{e:+.0%}' for _, e in got):>18}")
        print(f"{fault:8} " + " ".join(cells))
    for label, attr in (("clean sched", "clean_sched_ns"), ("clean prep", "clean_prep_ns")):
        print(f"{label:8} " + " ".join(f"{float(np.median(getattr(r, attr) or [0])) / 1e6:>15.2f} ms" for r in rows))
    print(f"{'accused':8} " + " ".join(f"{r.accused:>18}" for r in rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="busy-waits injected into SGLang vs srtscope's diagnosis")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("SGLANG_VENV", HERE / ".venv-sglang")))
    p.add_argument("--out", type=Path, default=Path("runs/engines/sglang"))
    p.add_argument("--traces", type=Path, help="diagnose the traces already in this folder (one subfolder "
                   "per path, each with its manifest.json)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"capture paths, of {', '.join(PATHS)}")
    p.add_argument("--faults", default="sched,prep,result,alloc,sched4",
                   help="faults, of sched, prep, result, alloc, each optionally followed by k (every k-th call)")
    p.add_argument("--model", default="tiny-llama", help="a model folder inside the venv (setup_sglang.sh "
                   "makes tiny-llama: 4 layers, hidden 256; tiny-llama-decode: 12 layers, hidden 384)")
    p.add_argument("--delay-ms", type=float, default=15.0)
    p.add_argument("--every-delay-ms", type=float, default=60.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=8)
    a = p.parse_args(argv)
    paths = [x for x in a.paths.split(",") if x]
    bad = [x for x in paths if x not in PATHS] + [f for f in a.faults.split(",") if f and fault_of(f) not in EXPECTED]
    if bad:
        p.error(f"unknown path or fault: {', '.join(bad)}")
    ok, rows = True, []
    for path in paths:
        folder = (a.traces or a.out) / path
        if a.traces:
            if not (folder / "manifest.json").exists():
                continue
            manifest = json.loads((folder / "manifest.json").read_text())
        elif path == "server-probe":
            from benchmarks.engines.sglang_server_probe import run_server_probe

            manifest = run_server_probe(a.venv.resolve(), folder.resolve(), a, run_list(a, path))
        else:
            manifest = run_driver(a.venv.resolve(), folder.resolve(), a, path)
        if path == "server-probe":
            from benchmarks.engines.sglang_server_probe import diagnose_server_runs

            runs = diagnose_server_runs(folder, manifest)
        else:
            runs = diagnose_folder(folder, manifest)
        good, row = report(manifest, runs)
        ok &= good
        rows.append(row)
    summary(rows)
    print("\ntargets: the injected cause named in every faulty run, recovered within 15% of the time measured "
          "inside the busy-waits; clean: scheduler and prep at most 2 ms per step, never accused")
    print("all targets met" if ok else "some targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
