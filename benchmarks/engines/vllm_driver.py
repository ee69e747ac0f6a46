"""Run real vLLM offline (``LLM.generate``, engine core in-process) with host delays injected into
vLLM's own functions, clean runs alternated with faulty ones, each run traced by vLLM's own profiler.

    python benchmarks/engines/vllm_driver.py --model DIR --out DIR [--runs clean,sched,clean,prep,...]
                                             [--delay-ms 20] [--requests 4] [--tokens 12]
                                             [--profiler vllm|none] [--with-stack] [--no-scopes]

Runs in the rig's vLLM venv (``setup_vllm.sh``); imports nothing of srtscope, so it also runs under
``srtscope capture`` (``--profiler none``: the capture's profiler records it).

Faults, monkeypatched into vLLM's own functions for the runs that name them (once per engine step):
- ``sched``: inside ``Scheduler.schedule()`` — its call of ``KVCacheManager.new_step_starts()``,
  outside any of vLLM's scopes (so only the engine step's own time and Python frames show it);
- ``prep``: ``GPUModelRunner._prepare_inputs`` (inside vLLM's ``gpu_model_runner: preprocess``);
- ``result``: ``OutputProcessor.process_outputs`` (inside ``llm_engine step: process_outputs``).
Each delay is a ``time.sleep`` (``--delay-kind spin``: a busy-wait; on a loaded machine the forward
right after a busy-wait runs slower, which the what-if cannot know) inside a
``record_function("srtscope.rig.inject fault=...")`` range:
the ground truth, read back from the same trace (no stage name: the analyzers ignore it).

Writes ``OUT/runNN_<fault>.pt.trace.json.gz`` per run (vLLM's profiler) and ``OUT/manifest.json``:
per run, the fault, the delay, how often it fired, the wall time and the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

FAULTS = ("clean", "sched", "prep", "result")
INJECT_RANGE = "srtscope.rig.inject"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default="clean,sched,clean,prep,clean,result,clean")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--delay-kind", choices=("sleep", "spin"), default="sleep",
                   help="sleep, or busy-wait (on a loaded machine the OS then slows the next forward)")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=12, help="tokens generated per request (= decode steps)")
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--profiler", choices=("vllm", "none"), default="vllm")
    p.add_argument("--with-stack", action="store_true", help="vLLM's profiler records Python frames (big traces)")
    p.add_argument("--no-scopes", action="store_true", help="leave VLLM_CUSTOM_SCOPES_FOR_PROFILING unset")
    a = p.parse_args(argv)
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in FAULTS]
    if bad or not runs:
        p.error(f"--runs takes {', '.join(FAULTS)}; got {a.runs!r}")
    if a.delay_ms < 0 or a.requests < 1 or a.tokens < 2:
        p.error("--delay-ms >= 0, --requests >= 1, --tokens >= 2")
    a.run_list = runs
    return a


class Faults:
    """The delays: which fault is on, and how often each fired (read by the manifest)."""

    def __init__(self, delay_s: float, sleep: bool = False) -> None:
        self.delay_s = delay_s
        self.sleep = sleep
        self.active = "clean"
        self.fired = 0

    def wrap(self, owner: type, attr: str, fault: str) -> None:
        import torch

        orig = getattr(owner, attr)
        faults = self

        def patched(*args, **kwargs):
            if faults.active == fault:
                with torch.profiler.record_function(f"{INJECT_RANGE} fault={fault}"):
                    if faults.sleep:
                        time.sleep(faults.delay_s)
                    else:
                        end = time.perf_counter() + faults.delay_s
                        while time.perf_counter() < end:     # busy: host CPU work
                            pass
                faults.fired += 1
            return orig(*args, **kwargs)

        patched.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(owner, attr, patched)


def install(faults: Faults) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    faults.wrap(KVCacheManager, "new_step_starts", "sched")
    faults.wrap(GPUModelRunner, "_prepare_inputs", "prep")
    faults.wrap(OutputProcessor, "process_outputs", "result")


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")      # engine core in this process
    if not a.no_scopes:
        os.environ.setdefault("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    prof_dir = out / "_vllm_profiler"
    shutil.rmtree(prof_dir, ignore_errors=True)

    from vllm import LLM, SamplingParams

    faults = Faults(a.delay_ms / 1000.0, a.delay_kind == "sleep")
    install(faults)
    kw: dict = {}
    if a.profiler == "vllm":
        kw["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": str(prof_dir),
                                 "torch_profiler_with_stack": a.with_stack, "torch_profiler_use_gzip": True}
    t0 = time.perf_counter()
    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=512, enforce_eager=True,
              max_num_seqs=max(8, a.requests), seed=0, kv_cache_memory_bytes=256 << 20, **kw)
    load_s = time.perf_counter() - t0
    sp = SamplingParams(max_tokens=a.tokens, ignore_eos=True, temperature=0.0)
    vocab = 31_000

    def prompts(run: int) -> list[str]:
        return [" ".join(f"w{(run * 997 + i * 131 + j * 7) % vocab}" for j in range(a.prompt_len))
                for i in range(a.requests)]

    llm.generate(prompts(999), sp, use_tqdm=False)                  # warm-up, not traced
    load_before = os.getloadavg()[0]
    runs = []
    for i, fault in enumerate(a.run_list):
        faults.active, faults.fired = fault, 0
        if a.profiler == "vllm":
            llm.start_profile()
        t = time.perf_counter()
        outs = llm.generate(prompts(i), sp, use_tqdm=False)
        wall = time.perf_counter() - t
        faults.active = "clean"
        trace = None
        if a.profiler == "vllm":
            llm.stop_profile()
            got = sorted(prof_dir.glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
            if got:
                trace = out / f"run{i:02d}_{fault}.pt.trace.json.gz"
                shutil.move(str(got[-1]), trace)
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append({"run": i, "fault": fault, "delay_ms": a.delay_ms if fault != "clean" else 0.0,
                     "fired": faults.fired, "wall_s": round(wall, 4), "tokens": n_tok,
                     "trace": trace.name if trace else None})
        print(f"run {i:2d} {fault:6s} fired {faults.fired:3d}  wall {wall * 1e3:8.1f} ms  "
              f"{n_tok} tokens  {trace.name if trace else ''}", flush=True)
    shutil.rmtree(prof_dir, ignore_errors=True)
    import vllm
    manifest = {"vllm": vllm.__version__, "model": a.model, "requests": a.requests, "tokens": a.tokens,
                "prompt_len": a.prompt_len, "with_stack": a.with_stack, "delay_kind": a.delay_kind,
                "scopes": not a.no_scopes,
                "profiler": a.profiler, "load_s": round(load_s, 1), "cpus": os.cpu_count(),
                "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                "command": " ".join([Path(sys.executable).name, *sys.argv]), "runs": runs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
