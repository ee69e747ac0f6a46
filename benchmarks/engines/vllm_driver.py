"""Run real vLLM offline (``LLM.generate``, engine core in-process) with host delays injected into
vLLM's own functions, clean runs alternated with faulty ones, each run traced by vLLM's own profiler.

    python benchmarks/engines/vllm_driver.py --model DIR --out DIR [--runs clean,sched,clean,prep,...]
                                             [--delay-ms 20] [--requests 4] [--tokens 12]
                                             [--profiler vllm|none] [--with-stack] [--no-scopes]

Runs in the rig's vLLM venv (``setup_vllm.sh``); imports nothing of srtscope, so it also runs under
``srtscope capture`` (``--profiler none``: the capture's profiler records it).

Faults, monkeypatched into vLLM's own functions for the runs that name them (once per engine step
unless said otherwise):
- ``sched``: inside ``Scheduler.schedule()`` — its call of ``KVCacheManager.new_step_starts()``,
  outside any of vLLM's scopes (so only the engine step's own time and Python frames show it);
- ``prep``: ``GPUModelRunner._prepare_inputs`` (inside vLLM's ``gpu_model_runner: preprocess``);
- ``result``: ``OutputProcessor.process_outputs`` (inside ``llm_engine step: process_outputs``);
- ``alloc``: ``KVCacheManager.allocate_slots``, its first call in each step (``--alloc-ms``, 15):
  KV slot allocation, called inside ``Scheduler.schedule()`` — prep by srtscope's taxonomy (inside
  vLLM's ``schedule: allocate_slots`` scope for running requests; a prefill step allocates for
  waiting requests outside that scope);
- ``every4``: an intermittent stall, ``--stall-ms`` (60) in every ``--stall-every``-th (4th) call of
  ``Scheduler.schedule()`` (where ``sched`` is), counted from the run's first step.
Each delay is a ``time.sleep`` (``--delay-kind spin``: a busy-wait; on a loaded machine the forward
right after a busy-wait runs slower, which the what-if cannot know) inside a
``record_function("srtscope.rig.inject fault=...")`` range:
the ground truth, read back from the same trace (no stage name: the analyzers ignore it), and
measured by the driver itself (``inside_ms`` in the manifest: the time spent inside the faults, for
captures whose trace holds no ``record_function`` range, the probe backend's).

Writes ``OUT/runNN_<fault>.pt.trace.json.gz`` per run (vLLM's profiler) and ``OUT/manifest.json``:
per run, the fault, the delay, how often it fired and in which of the run's steps (``fired_steps``:
0-based, one ``schedule()`` a step), the wall time and the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

FAULTS = ("clean", "sched", "prep", "result", "alloc", "every4")
INJECT_RANGE = "srtscope.rig.inject"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default="clean,sched,clean,prep,clean,result,clean")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--delay-kind", choices=("sleep", "spin"), default="sleep",
                   help="sleep, or busy-wait (on a loaded machine the OS then slows the next forward)")
    p.add_argument("--alloc-ms", type=float, default=15.0, help="the alloc fault's delay")
    p.add_argument("--stall-ms", type=float, default=60.0, help="the every4 fault's delay")
    p.add_argument("--stall-every", type=int, default=4, help="the every4 fault: every Nth scheduler call")
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
    """The delays: which fault is on, how often each fired and the time spent inside them (read by
    the manifest). ``steps``: ``Scheduler.schedule()`` calls since the run started (each engine step
    schedules once)."""

    def __init__(self, delay_s: float, sleep: bool = False, alloc_s: float = 0.015, stall_s: float = 0.06,
                 stall_every: int = 4) -> None:
        self.delay_s = {"sched": delay_s, "prep": delay_s, "result": delay_s, "alloc": alloc_s,
                        "every4": stall_s}
        self.sleep = sleep
        self.stall_every = stall_every
        self.active = "clean"
        self.fired = 0
        self.fired_steps: list[int] = []     # the run's steps (0-based, one schedule() each) that fired
        self.inside_s = 0.0
        self.steps = 0
        self._alloc_step = -1

    def start(self, fault: str) -> None:
        self.active, self.fired, self.inside_s, self.steps, self._alloc_step = fault, 0, 0.0, 0, -1
        self.fired_steps = []

    def due(self, fault: str) -> bool:
        """Whether ``fault``'s wrapped function delays this call."""
        if self.active != fault:
            return False
        if fault == "alloc":               # its first call in the step
            if self._alloc_step == self.steps:
                return False
            self._alloc_step = self.steps
        if fault == "every4":              # new_step_starts counted the call already
            return (self.steps - 1) % self.stall_every == 0
        return True

    def wait(self, fault: str) -> None:
        import torch

        t0 = time.perf_counter()
        with torch.profiler.record_function(f"{INJECT_RANGE} fault={fault}"):
            if self.sleep:
                time.sleep(self.delay_s[fault])
            else:
                end = t0 + self.delay_s[fault]
                while time.perf_counter() < end:     # busy: host CPU work
                    pass
        self.inside_s += time.perf_counter() - t0
        self.fired += 1
        if not self.fired_steps or self.fired_steps[-1] != self.steps - 1:
            self.fired_steps.append(self.steps - 1)

    def wrap(self, owner: type, attr: str, *faults: str, count_step: bool = False) -> None:
        orig = getattr(owner, attr)
        state = self

        def patched(*args, **kwargs):
            if count_step:
                state.steps += 1
            for fault in faults:
                if state.due(fault):
                    state.wait(fault)
            return orig(*args, **kwargs)

        patched.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(owner, attr, patched)


def install(faults: Faults) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # new_step_starts: once per Scheduler.schedule(), inside it, outside vLLM's scopes
    faults.wrap(KVCacheManager, "new_step_starts", "sched", "every4", count_step=True)
    faults.wrap(KVCacheManager, "allocate_slots", "alloc")
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

    faults = Faults(a.delay_ms / 1000.0, a.delay_kind == "sleep", a.alloc_ms / 1000.0, a.stall_ms / 1000.0,
                    a.stall_every)
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
        faults.start(fault)
        if a.profiler == "vllm":
            llm.start_profile()
        t = time.perf_counter()
        outs = llm.generate(prompts(i), sp, use_tqdm=False)
        wall = time.perf_counter() - t
        faults.active = "clean"
        fired, inside_s, scheduled, fired_steps = faults.fired, faults.inside_s, faults.steps, faults.fired_steps
        trace = None
        if a.profiler == "vllm":
            llm.stop_profile()
            got = sorted(prof_dir.glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
            if got:
                trace = out / f"run{i:02d}_{fault}.pt.trace.json.gz"
                shutil.move(str(got[-1]), trace)
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append({"run": i, "fault": fault,
                     "delay_ms": faults.delay_s[fault] * 1e3 if fault != "clean" else 0.0,
                     "fired": fired, "fired_steps": fired_steps, "inside_ms": round(inside_s * 1e3, 3),
                     "schedule_calls": scheduled,
                     "wall_s": round(wall, 4), "tokens": n_tok, "trace": trace.name if trace else None})
        print(f"run {i:2d} {fault:6s} fired {fired:3d}  wall {wall * 1e3:8.1f} ms  "
              f"{n_tok} tokens  {trace.name if trace else ''}", flush=True)
    shutil.rmtree(prof_dir, ignore_errors=True)
    import vllm
    manifest = {"vllm": vllm.__version__, "model": a.model, "requests": a.requests, "tokens": a.tokens,
                "prompt_len": a.prompt_len, "with_stack": a.with_stack, "delay_kind": a.delay_kind,
                "alloc_ms": a.alloc_ms, "stall_ms": a.stall_ms, "stall_every": a.stall_every,
                "scopes": not a.no_scopes,
                "profiler": a.profiler, "load_s": round(load_s, 1), "cpus": os.cpu_count(),
                "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                "command": " ".join([Path(sys.executable).name, *sys.argv]), "runs": runs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
