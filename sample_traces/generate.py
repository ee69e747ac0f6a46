"""Labelled sample traces: nsys-schema SQLite files of simulated engine runs, with expected verdicts.

    python -m sample_traces.generate [OUT_DIR]      # default: sample_traces/

Each scenario simulates an engine's host thread (stages as NVTX ranges, CUDA API calls) and its
device queue (kernels start at max(launch + latency, device free)) step by step, all ranks in
lockstep (a collective ends ``transfer`` after the last rank arrives). Deterministic (seeded
jitter). ``expected.json`` holds each scenario's files, its expected verdict and the injected host
time per bubble class (computed from the scenario's parameters, not from any analysis).
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sample_traces import capture_scenarios
from sample_traces.nsys_schema import NsysWriter

US = 1000
LAUNCH_US = 4          # host time of one cudaLaunchKernel
LATENCY_US = 3         # launch end -> earliest kernel start
GRAPH_LAUNCH_US = 8


@dataclass(frozen=True)
class RankSpec:
    """One rank's per-step behaviour (µs)."""

    recv_us: float = 15
    sched_us: float = 25
    prep_us: float = 30
    sample_us: float = 10
    sample_sync: bool = False          # sampling on the host: wait for the logits first (device idles)
    result_us: float = 20
    kernels: int = 12                  # forward kernels per step
    kernel_us: float = 40              # mean forward kernel duration
    big_kernel_us: float = 0           # one extra dominant kernel per step (kernel-bound)
    launch_gap_us: float = 2           # eager: host time between launches
    graph: bool = True                 # forward as one cudaGraphLaunch
    graph_max_bs: int = 10_000         # steps with bs above this run eagerly
    sync: str = "stream"               # stream: cudaStreamSynchronize in sync.wait; pageable: blocking
    pageable_chunks: int = 4           # ... cudaMemcpy DtoH in chunks with host staging gaps
    pageable_gap_us: float = 60
    comm_transfer_us: float = 0        # > 0: an NCCL all-reduce after the forward
    overlap: bool = False              # host does not wait for the step's results (runs ahead)
    nvtx: bool = True
    names: str = "srtscope"            # srtscope | sglang: which stage names the NVTX ranges use
    forward_thread: bool = False       # overlap-loop shape: prep, launches, run and sampling on a
                                       # second thread, which idles while the scheduler thread works


@dataclass(frozen=True)
class Scenario:
    name: str
    bottleneck: str
    summary_prefix: str
    steps: int
    ranks: tuple[RankSpec, ...]
    bs: tuple[int, ...] = (32,)        # batch size per step, cycled
    seed: int = 0
    injected: dict[str, Callable[[RankSpec], float]] = field(default_factory=dict)  # class -> µs per step
    checks: dict[str, object] = field(default_factory=dict)
    cause: str = ""                    # the expected cause beneath the bottleneck (vocab.Cause)


class _Rank:
    """Event buffers and clocks of one simulated rank."""

    def __init__(self, rank: int, spec: RankSpec, rng: np.random.Generator) -> None:
        self.rank, self.spec, self.rng = rank, spec, rng
        self.pid, self.tid = 1000 + rank, 1000 + rank + 1
        self.fwd_tid = self.tid + 100 if spec.forward_thread else self.tid
        self.cur = self.tid                          # the thread the host clock runs on now
        self.t = 1_000_000                          # host clock, ns
        self.dev_free = 0
        self.corr = 0
        self.k = {"s": [], "e": [], "name": [], "corr": [], "stream": [], "graph": []}
        self.a = {"s": [], "e": [], "name": [], "corr": [], "tid": []}
        self.n = {"s": [], "e": [], "text": [], "tid": []}
        self.m = {"s": [], "e": [], "kind": [], "corr": []}
        self.run = (0, False, 0)                    # (forward start, graph?, step start) of this step
        self.comm_corr = -1                         # correlation of this step's collective launch

    def jit(self, us: float) -> int:
        return int(round(us * US * self.rng.uniform(0.95, 1.05))) if us > 0 else 0

    def nvtx(self, s: int, e: int, text: str) -> None:
        if self.spec.nvtx:
            self.n["s"].append(s)
            self.n["e"].append(e)
            self.n["text"].append(text)
            self.n["tid"].append(self.cur)

    def host(self, us: float, text: str) -> None:
        d = self.jit(us)
        self.nvtx(self.t, self.t + d, text)
        self.t += d

    def api(self, dur: int, name: str) -> int:
        self.corr += 1
        self.a["s"].append(self.t)
        self.a["e"].append(self.t + dur)
        self.a["name"].append(name)
        self.a["corr"].append(self.corr)
        self.a["tid"].append(self.cur)
        self.t += dur
        return self.corr

    def kernel(self, corr: int, dur: int, name: str, stream: int = 7, graph: int = -1,
               earliest: int | None = None) -> tuple[int, int]:
        start = max(self.t + LATENCY_US * US if earliest is None else earliest, self.dev_free)
        self.k["s"].append(start)
        self.k["e"].append(start + dur)
        self.k["name"].append(name)
        self.k["corr"].append(corr)
        self.k["stream"].append(stream)
        self.k["graph"].append(graph)
        self.dev_free = start + dur
        return start, start + dur


def _forward(r: _Rank, step: int, bs: int) -> None:
    """Host stages up to the forward's launches (the collective is resolved by the caller)."""
    sp = r.spec
    s0 = r.t
    sg = sp.names == "sglang"
    r.host(sp.recv_us, "scheduler.recv_requests" if sg else "sched.recv")
    r.host(sp.sched_us, "scheduler.get_next_batch_to_run" if sg else "sched.schedule")
    r.cur = r.fwd_tid                                   # the batch goes to the forward thread
    p0 = r.t
    r.t += r.jit(sp.prep_us)
    c = r.api(5 * US, "cudaMemcpyAsync_v3020")           # H2D of the batch's inputs
    x = max(r.t + LATENCY_US * US, r.dev_free)
    r.m["s"].append(x)
    r.m["e"].append(x + 2 * US)
    r.m["kind"].append(1)
    r.m["corr"].append(c)
    r.dev_free = x + 2 * US
    r.nvtx(p0, r.t, "prepare_for_decode" if sg else f"prep.batch bs={bs}")
    run0 = r.t
    graph = sp.graph and bs <= sp.graph_max_bs
    names = [f"fwd_kernel_{i % 6}" for i in range(sp.kernels)]
    if graph:
        c = r.api(GRAPH_LAUNCH_US * US, "cudaGraphLaunch_v10000")
        for nm in names:
            r.kernel(c, r.jit(sp.kernel_us), nm, graph=1 + (bs // 8))
    else:
        for nm in names:
            r.t += r.jit(sp.launch_gap_us)
            c = r.api(LAUNCH_US * US, "cudaLaunchKernel_v7000")
            r.kernel(c, r.jit(sp.kernel_us), nm)
    if sp.big_kernel_us:
        c = r.api(LAUNCH_US * US, "cudaLaunchKernel_v7000")
        r.kernel(c, r.jit(sp.big_kernel_us), "flash_attn_decode_slow")
    r.run = (run0, graph, s0)


def _finish(r: _Rank, step: int, bs: int, mode: str) -> None:
    sp = r.spec
    run0, graph, s0 = r.run
    if sp.names == "sglang":
        text = "scheduler.run_batch"
    else:
        text = f"run.graph_replay bs={bs} padded_bs={-(-bs // 8) * 8}" if graph else "run.eager"
    r.nvtx(run0, r.t, text)
    if sp.sample_sync:
        s0_ = r.t
        r.api(max(r.dev_free - r.t, 0) + 3 * US, "cudaStreamSynchronize_v3020")
        r.nvtx(s0_, r.t, "sync.wait")
        r.t += r.jit(sp.sample_us)
        r.nvtx(s0_, r.t, "run.sample")
    else:
        r.host(sp.sample_us, "run.sample")
    c = r.api(LAUNCH_US * US, "cudaLaunchKernel_v7000")
    r.kernel(c, 8 * US, "sampling_topk_kernel")
    r.cur = r.tid                                       # results on the scheduler thread
    res0 = r.t
    if not sp.overlap:
        if sp.sync == "pageable":
            corr = r.corr + 1
            r.corr = corr
            t_api = r.t
            x = max(r.t, r.dev_free)
            for _ in range(sp.pageable_chunks):
                r.m["s"].append(x)
                r.m["e"].append(x + 20 * US)
                r.m["kind"].append(2)
                r.m["corr"].append(corr)
                x += 20 * US + r.jit(sp.pageable_gap_us)
            r.dev_free = r.m["e"][-1]
            end = r.m["e"][-1] + 5 * US
            r.a["s"].append(t_api)
            r.a["e"].append(end)
            r.a["name"].append("cudaMemcpy_v3020")
            r.a["corr"].append(corr)
            r.a["tid"].append(r.cur)
            r.t = end
        else:
            w0 = r.t
            r.api(max(r.dev_free - r.t, 0) + 3 * US, "cudaStreamSynchronize_v3020")
            r.nvtx(w0, r.t, "sync.wait")
    r.t += r.jit(sp.result_us)
    r.nvtx(res0, r.t, "scheduler.process_batch_result" if sp.names == "sglang" else "sched.result")
    if sp.names == "sglang":
        return
    r.nvtx(s0, r.t, f"loop.step step={step} mode={mode} bs={bs} tokens={bs}")


def simulate(sc: Scenario) -> list[_Rank]:
    rng = np.random.default_rng(sc.seed)
    ranks = [_Rank(i, spec, rng) for i, spec in enumerate(sc.ranks)]
    for step in range(sc.steps):
        bs = sc.bs[step % len(sc.bs)]
        for r in ranks:
            _forward(r, step, bs)
        if any(r.spec.comm_transfer_us for r in ranks):
            arrive = []
            for r in ranks:
                r.comm_corr = r.api(LAUNCH_US * US, "cudaLaunchKernel_v7000")
                arrive.append(max(r.t + LATENCY_US * US, r.dev_free))
            done = max(arrive) + int(ranks[0].spec.comm_transfer_us * US)
            for r, a in zip(ranks, arrive):
                r.kernel(r.comm_corr, done - a, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", stream=13,
                         earliest=a)
        for r in ranks:
            _finish(r, step, bs, "decode")
    return ranks


def write(sc: Scenario, out_dir: Path) -> list[Path]:
    """Write the scenario's file(s) (one per rank) into ``out_dir``; returns their paths."""
    paths = []
    for r in simulate(sc):
        name = f"{sc.name}.rank{r.rank}.sqlite" if len(sc.ranks) > 1 else f"{sc.name}.sqlite"
        path = out_dir / name
        with NsysWriter(path, version="2025.3.1") as w:
            w.add_gpu(id=r.rank)
            w.add_process(r.pid, "python3 -m engine.serve")
            w.add_thread(r.pid, r.tid, "scheduler")
            if r.fwd_tid != r.tid:
                w.add_thread(r.pid, r.fwd_tid, "forward")
            w.add_runtime(r.a["s"], r.a["e"], r.a["name"], pid=r.pid, tid=r.a["tid"],
                          correlation=r.a["corr"])
            g = np.asarray(r.k["graph"], np.int64)
            w.add_kernels(r.k["s"], r.k["e"], r.k["name"], device=r.rank, stream=r.k["stream"], pid=r.pid,
                          correlation=r.k["corr"], graph_id=g if (g >= 0).any() else None,
                          graph_node=np.where(g >= 0, np.arange(len(g)), -1) if (g >= 0).any() else None)
            if r.m["s"]:
                w.add_memcpy(r.m["s"], r.m["e"], bytes=4096, copy_kind=r.m["kind"], device=r.rank,
                             pid=r.pid, correlation=r.m["corr"])
            if r.n["s"]:
                w.add_nvtx(r.n["s"], r.n["e"], r.n["text"], pid=r.pid, tid=r.n["tid"], domain="srtscope")
            if (g >= 0).any():
                w.add_capture_meta("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Node")
        paths.append(path)
    return paths


def injected_ns(sc: Scenario) -> dict[str, int]:
    """Host time per class that the scenario injects into device bubbles (summed over steps/ranks)."""
    out: dict[str, int] = {}
    for cls, expr in sc.injected.items():
        total = 0
        for spec in sc.ranks:
            total += expr(spec)
        out[cls] = int(total * US * sc.steps)
    return out


_BASE = RankSpec()
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("scheduler_bound", "scheduler", "scheduler-bound", 40, (replace(_BASE, sched_us=600),),
             injected={"scheduler": lambda r: r.recv_us + r.sched_us + r.result_us}, cause="sched_cpu"),
    Scenario("prep_bound", "prep", "prep-bound", 40, (replace(_BASE, prep_us=700, names="sglang"),),
             injected={"prep": lambda r: r.prep_us}, cause="batch_prep"),
    Scenario("kernel_bound", "kernel", "kernel-bound", 40,
             (replace(_BASE, big_kernel_us=1500, sample_us=300, sample_sync=True),),
             injected={"kernel": lambda r: r.sample_us}, cause="launch_bound"),
    Scenario("eager_fallback", "kernel", "eager-fallback-bound", 24,
             (replace(_BASE, graph_max_bs=64, kernels=40, kernel_us=4, launch_gap_us=12),),
             bs=(32, 48, 96, 128), checks={"eager_reason": "bs_over_max", "eager_decode_steps": 12},
             cause="eager_fallback"),
    # no stage ranges: the host is inside a blocking pageable copy while the copy engine waits on
    # its staging -> the copies' fault (pin the memory), not the scheduler's
    Scenario("host_sync_bound", "kernel", "copy-bound", 40,
             (replace(_BASE, nvtx=False, sync="pageable", pageable_gap_us=150, recv_us=0, sched_us=0,
                      prep_us=0, result_us=0, sample_us=0),),
             injected={"sync": lambda r: (r.pageable_chunks - 1) * r.pageable_gap_us}, cause="memcpy"),
    Scenario("comm_straggler", "kernel", "communication-bound", 30,
             (replace(_BASE, comm_transfer_us=30), replace(_BASE, comm_transfer_us=30, kernel_us=90)),
             checks={"straggler_rank": 1}, cause="straggler"),
    Scenario("launch_bound_eager", "kernel", "launch-bound", 20,
             (replace(_BASE, graph=False, kernels=60, kernel_us=3, launch_gap_us=10),),
             injected={"launch": lambda r: r.kernels * (r.launch_gap_us + LAUNCH_US - r.kernel_us)},
             cause="launch_bound"),
    Scenario("healthy", "kernel", "healthy", 40, (replace(_BASE, kernel_us=120, overlap=True),),
             checks={"healthy": True}, cause="compute"),
    # overlap-loop shape: the launching (forward) thread idles while the scheduler thread schedules
    Scenario("overlap_scheduler_bound", "scheduler", "scheduler-bound", 40,
             (replace(_BASE, sched_us=600, forward_thread=True),),
             injected={"scheduler": lambda r: r.recv_us + r.sched_us + r.result_us}, cause="sched_cpu"),
)


def expected(scenarios: tuple[Scenario, ...] = SCENARIOS) -> dict[str, dict]:
    out = {}
    for sc in scenarios:
        files = ([f"{sc.name}.rank{i}.sqlite" for i in range(len(sc.ranks))] if len(sc.ranks) > 1
                 else [f"{sc.name}.sqlite"])
        out[sc.name] = {"files": files, "bottleneck": sc.bottleneck, "cause": sc.cause,
                        "summary_prefix": sc.summary_prefix,
                        "steps": sc.steps * len(sc.ranks), "injected_ns": injected_ns(sc),
                        "checks": dict(sc.checks)}
    return out


def generate(out_dir: str | Path, names: tuple[str, ...] | None = None) -> dict[str, list[Path]]:
    """Write every (or the named) scenario and ``expected.json`` into ``out_dir``: the engine
    simulations here and the hand-built captures of ``capture_scenarios``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen = tuple(s for s in SCENARIOS if names is None or s.name in names)
    unknown = set(names or ()) - {s.name for s in SCENARIOS} - set(capture_scenarios.NAMES)
    if unknown:
        raise ValueError(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    written = {sc.name: write(sc, out) for sc in chosen}
    exp = expected(chosen)
    captures = capture_scenarios.write(out, names)
    exp.update(captures)
    written.update({n: [out / f for f in e["files"]] for n, e in captures.items()})
    (out / "expected.json").write_text(json.dumps(exp, indent=1, sort_keys=True) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    for name, paths in generate(out).items():
        for p in paths:
            print(f"{name}: {p} ({p.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
