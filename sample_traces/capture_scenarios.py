"""Hand-built captures of non-engine shapes: labelled scenarios beside the engine simulations.

    from sample_traces import capture_scenarios
    expectations = capture_scenarios.write(out_dir)          # {name: expected entry}

``generate.py`` simulates an engine's step loop; the captures here are what a profiler records around
other shapes of work: weights streamed by copies, a cold start, a short burst in a long capture, one
rank of a larger job, ``torch.profiler`` steps, Python-frame traces without annotations, OS I/O on the
launching thread, a tiny-kernel eager loop, and two files of separate runs. Each scenario is one
function that fills a ``_Sim`` (a host clock and a device queue: work starts at max(launch end +
latency, device free)) and writes an nsys-schema SQLite file or a gzip'd Kineto Chrome trace.
Deterministic: seeded jitter, gzip without a timestamp.

Expected entries have the shape of ``generate.expected()`` plus: ``warnings`` (capture warning codes
that must be present), ``steps_source``, ``refused`` (a substring of the TraceError that loading the
files must raise; nothing else is then expected) and table-driven ``checks`` (see the test).
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sample_traces.nsys_schema import SESSION_UTC_NS, NsysWriter

US = 1000
MS = 1_000_000
LAUNCH_US = 4          # host time of one cudaLaunchKernel
LATENCY_US = 3         # launch end -> earliest kernel start
PID, TID = 2000, 2001
_COPY_KIND = {"HtoD": 1, "DtoH": 2, "DtoD": 8}
_COPY_NAME = {1: "Memcpy HtoD (Pinned -> Device)", 2: "Memcpy DtoH (Device -> Pinned)",
                8: "Memcpy DtoD (Device -> Device)"}


class _Sim:
    """Host calls, device work and host ranges of one process (one launching thread by default)."""

    def __init__(self, seed: int = 0, t0_ns: int = 1 * MS) -> None:
        self.rng = np.random.default_rng(seed)
        self.t = t0_ns
        self.dev_free = 0
        self.corr = 0
        self.api: list[tuple[int, int, str, int]] = []                     # start, end, name, corr
        # start, end, kind (kernel|memcpy), name, corr, bytes, copy kind, stream
        self.dev: list[tuple[int, int, str, str, int, int, int, int]] = []
        self.osrt: list[tuple[int, int, str]] = []                          # start, end, name
        self.ranges: list[tuple[int, int, str, str]] = []                  # start, end, name, category

    def jit(self, us: float) -> int:
        return int(round(us * US * self.rng.uniform(0.97, 1.03))) if us > 0 else 0

    def idle(self, us: float) -> None:
        self.t += self.jit(us)

    def call(self, us: float, name: str, exact: bool = False) -> int:
        """A CUDA API call on the launching thread; returns its correlation id."""
        self.corr += 1
        d = int(us * US) if exact else self.jit(us)
        self.api.append((self.t, self.t + d, name, self.corr))
        self.t += d
        return self.corr

    def device_work(self, corr: int, us: float, kind: str, name: str, nbytes: int = -1, copy_kind: int = 0,
                    stream: int = 7, exact: bool = False) -> tuple[int, int]:
        """Device work of the call ``corr``: starts at max(now + latency, device free)."""
        start = max(self.t + LATENCY_US * US, self.dev_free)
        end = start + (int(us * US) if exact else self.jit(us))
        self.dev.append((start, end, kind, name, corr, nbytes, copy_kind, stream))
        self.dev_free = end
        return start, end

    def launch(self, kernel_us: float, name: str, launch_us: float = LAUNCH_US, stream: int = 7) -> None:
        self.device_work(self.call(launch_us, "cudaLaunchKernel_v7000"), kernel_us, "kernel", name, stream=stream)

    def copy(self, nbytes: int, gbps: float, direction: str = "HtoD", name: str = "cudaMemcpyAsync_v3020",
             call_us: float = 6) -> None:
        """An async copy of ``nbytes`` at ``gbps`` GB/s (bytes per ns); the host returns at once."""
        kind = _COPY_KIND[direction]
        self.device_work(self.call(call_us, name), nbytes / gbps / US, "memcpy", _COPY_NAME[kind], nbytes, kind,
                     exact=True)

    def sync(self, name: str = "cudaStreamSynchronize_v3020") -> None:
        """Block until the device drains (plus the call's own return path)."""
        self.call((max(self.dev_free - self.t, 0) + 3 * US) / US, name, exact=True)

    def os_call(self, us: float, name: str) -> None:
        d = self.jit(us)
        self.osrt.append((self.t, self.t + d, name))
        self.t += d

    def span(self, start: int, name: str, cat: str = "user_annotation") -> None:
        """A host range from ``start`` to now."""
        self.ranges.append((start, self.t, name, cat))


# -- writers -----------------------------------------------------------------------------------------

def _write_nsys(sim: _Sim, path: Path, **writer_kw) -> Path:
    with NsysWriter(path, version="2025.3.1", **writer_kw) as w:
        w.add_gpu(id=0)
        w.add_process(PID, "python3 bench.py")
        w.add_thread(PID, TID, "python3")
        a = list(zip(*sim.api))
        w.add_runtime(a[0], a[1], a[2], pid=PID, tid=TID, correlation=a[3])
        kern = [r for r in sim.dev if r[2] == "kernel"]
        if kern:
            k = list(zip(*kern))
            w.add_kernels(k[0], k[1], k[3], device=0, stream=k[7], pid=PID, correlation=k[4])
        cp = [r for r in sim.dev if r[2] == "memcpy"]
        if cp:
            c = list(zip(*cp))
            w.add_memcpy(c[0], c[1], bytes=c[5], copy_kind=c[6], device=0, stream=c[7], pid=PID,
                         correlation=c[4])
        if sim.osrt:
            o = list(zip(*sim.osrt))
            w.add_osrt(o[0], o[1], o[2], pid=PID, tid=TID)
        if sim.ranges:
            r = list(zip(*sim.ranges))
            w.add_nvtx(r[0], r[1], r[2], pid=PID, tid=TID)
    return path


def _us(ns: int) -> float:
    return round(ns / US, 3)


def _write_kineto(sim: _Sim, path: Path, distributed: dict | None = None) -> Path:
    """A gzip'd Chrome trace as torch.profiler exports it (times in µs from ``baseTimeNanoseconds``)."""
    base = 1_764_460_800_000_000_000
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID, "args": {"name": "thread 2001 (python3)"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    for s, e, name, cat in sim.ranges:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": _us(s), "dur": _us(e - s),
                   "args": {}})
    for s, e, name, corr in sim.api:
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name.split("_v")[0], "pid": PID, "tid": TID,
                   "ts": _us(s), "dur": _us(e - s), "args": {"correlation": corr}})
    for s, e, kind, name, corr, nbytes, _ck, stream in sim.dev:
        args = {"device": 0, "stream": stream, "correlation": corr}
        if kind == "memcpy":
            args["bytes"] = nbytes
        ev.append({"ph": "X", "cat": "kernel" if kind == "kernel" else "gpu_memcpy", "name": name, "pid": 0,
                   "tid": stream, "ts": _us(s), "dur": _us(e - s), "args": args})
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984,
                                 "numSms": 132}],
           "cuda_runtime_version": 12080, "traceEvents": ev}
    if distributed:
        doc["distributedInfo"] = distributed
    path.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0))
    return path


def _entry(files: list[str], bottleneck: str = "", cause: str = "", summary_prefix: str = "",
           steps: int | None = None, injected_ns: dict[str, int] | None = None, warnings: tuple[str, ...] = (),
           steps_source: str = "", refused: str = "", checks: dict | None = None) -> dict:
    return {"files": files, "bottleneck": bottleneck, "cause": cause, "summary_prefix": summary_prefix,
            "steps": steps, "injected_ns": injected_ns or {}, "warnings": list(warnings),
            "steps_source": steps_source, "refused": refused, "checks": checks or {}}


# -- scenarios ---------------------------------------------------------------------------------------

def copy_bound(out: Path) -> dict:
    """Weights streamed host->device (layer offloading): each layer's weights arrive in a pinned
    ``cudaMemcpyAsync`` HtoD at ~24 GB/s before its small kernels, so the copies, not the kernels, fill
    the device's time. Exists for the ``memcpy`` cause from exposed copies (no bubbles: the host runs
    ahead) and for the per-direction bandwidth figure computed from the copies' bytes."""
    sim = _Sim(seed=1)
    steps, layers, nbytes, gbps = 4, 8, 32 << 20, 24.0
    for _ in range(steps):
        for layer in range(layers):
            sim.copy(nbytes, gbps)
            sim.launch(60, f"gemm_layer_kernel_{layer % 2}")
            sim.launch(15, "rmsnorm_kernel")
        sim.sync()
        sim.idle(3)
    name = "copy_bound"
    _write_nsys(sim, out / f"{name}.sqlite")
    return _entry([f"{name}.sqlite"], "kernel", "memcpy", "copy-bound", steps=steps, steps_source="sync",
                  checks={"memcpy_gbps": {"HtoD": gbps}, "memcpy_bytes": {"HtoD": steps * layers * nbytes},
                          "exposed_memcpy_share_min": 0.8})


def cold_start(out: Path) -> dict:
    """A capture that starts with the process: allocations, a weights upload, pinned staging, a module
    load and a 30 ms first ``cudaLaunchKernel`` (lazy loading) while the device idles, then five warm
    steps. Exists for the ``host`` / ``cold_start`` verdict and the ``cold_start`` warning."""
    sim = _Sim(seed=2)
    for _ in range(4):
        sim.call(1800, "cudaMalloc_v3020")
    sim.call(40, "cudaMemcpyAsync_v3020")
    sim.device_work(sim.corr, 2000, "memcpy", _COPY_NAME[1], 48 << 20, 1)     # weights upload
    sim.sync()
    startup_us = {"cudaHostAlloc_v3020": 3500, "cudaMalloc_v3020": 2200, "cuModuleLoadData": 9000}
    for nm, us in startup_us.items():
        sim.call(us, nm, exact=True)
    sim.device_work(sim.call(30_000, "cudaLaunchKernel_v7000", exact=True), 40, "kernel", "embedding_kernel")
    steps = 5
    for _ in range(steps):
        for i in range(20):
            sim.launch(50, f"layer_kernel_{i % 5}")
        sim.sync()
        sim.idle(2)
    name = "cold_start"
    _write_nsys(sim, out / f"{name}.sqlite")
    return _entry([f"{name}.sqlite"], "host", "cold_start", "host-bound, cold start", steps=steps,
                  injected_ns={"host": int((sum(startup_us.values()) + 30_000) * US)},
                  warnings=("cold_start",), steps_source="sync")


def low_coverage(out: Path) -> dict:
    """A 2 s capture (session bounds) in which the device works for ~50 ms of healthy back-to-back
    kernels around 1.2 s: the rest is start-up and idle time outside the device's active window.
    Exists for the ``low_device_coverage`` warning and the confidence cap it brings."""
    sim = _Sim(seed=3, t0_ns=1_200 * MS)
    steps = 10
    for _ in range(steps):
        for i in range(10):
            sim.launch(500, f"decode_kernel_{i % 4}")
        sim.sync()
        sim.idle(2)
    name = "low_coverage"
    _write_nsys(sim, out / f"{name}.sqlite", capture_start_ns=0, capture_end_ns=2_000 * MS)
    return _entry([f"{name}.sqlite"], "kernel", "compute", "healthy", steps=steps,
                  warnings=("low_device_coverage",), steps_source="sync",
                  checks={"healthy": True, "max_confidence": 0.6})


def partial_ranks(out: Path) -> dict:
    """One rank's Kineto trace (rank 3 of a world of 8, ``distributedInfo``) with NCCL all-reduces
    after each forward. Exists for the ``partial_ranks`` warning: the skew and straggler need every
    rank, so they must be null, never 0."""
    sim = _Sim(seed=4)
    steps = 6
    for n in range(steps):
        s0 = sim.t
        for i in range(12):
            sim.launch(80, f"gemm_kernel_{i % 3}")
            if i % 6 == 5:
                sim.launch(120, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=13)
        sim.sync()
        sim.idle(20)
        sim.span(s0, f"ProfilerStep#{n}")
    name = "partial_ranks"
    _write_kineto(sim, out / f"{name}.json.gz",
                  distributed={"backend": "nccl", "rank": 3, "world_size": 8})
    return _entry([f"{name}.json.gz"], "kernel", "exposed_comm", "communication-bound", steps=steps,
                  warnings=("partial_ranks",),
                  steps_source="profiler_step", checks={"comm_partial": True, "ranks": [3]})


def profiler_steps(out: Path) -> dict:
    """A ``torch.profiler`` schedule capture: five ``ProfilerStep#N`` annotations (N = 10..14, the
    steps after wait/warm-up) each holding a forward's kernels. Exists for steps from
    ``ProfilerStep#N`` (source ``profiler_step``) numbered as the profiler numbered them."""
    sim = _Sim(seed=5)
    first, steps = 10, 5
    for n in range(first, first + steps):
        s0 = sim.t
        for i in range(16):
            sim.launch(70, f"fwd_kernel_{i % 4}")
        sim.sync()
        sim.idle(15)
        sim.span(s0, f"ProfilerStep#{n}")
    name = "profiler_steps"
    _write_kineto(sim, out / f"{name}.json.gz")
    return _entry([f"{name}.json.gz"], "kernel", "compute", "healthy", steps=steps, steps_source="profiler_step",
                  checks={"step_numbers": list(range(first, first + steps)), "healthy": True})


_SGL = "python3.10/site-packages/sglang/srt"


def python_frames(out: Path) -> dict:
    """SGLang under ``torch.profiler(with_stack=True)`` with no annotations: only ``python_function``
    frames say what the host did. Between forward bursts the scheduler thread sits in
    ``scheduler.py(...): get_next_batch_to_run`` (plus short ``recv_requests`` and
    ``process_batch_result``). Exists for the scheduler named from engine frames without NVTX
    (``scheduler`` / ``sched_cpu``) and the ``python_tracing`` warning."""
    sim = _Sim(seed=6)
    steps, recv_us, sched_us, result_us = 12, 40, 900, 60
    loop0 = sim.t
    for _ in range(steps):
        frames = []
        for fn, line, us in (("recv_requests", 1032, recv_us), ("get_next_batch_to_run", 1410, sched_us)):
            s0 = sim.t
            sim.idle(us)
            frames.append((s0, sim.t, f"{_SGL}/managers/scheduler.py({line}): {fn}"))
        s0 = sim.t
        for i in range(10):
            sim.launch(45, f"fwd_kernel_{i % 5}")
        frames.append((s0, sim.t, f"{_SGL}/model_executor/model_runner.py(1720): forward"))
        sim.sync()
        s0 = sim.t
        sim.idle(result_us)
        frames.append((s0, sim.t, f"{_SGL}/managers/scheduler_output_processor_mixin.py(210): "
                                  "process_batch_result_decode"))
        sim.ranges.extend((s, e, n, "python_function") for s, e, n in frames)
    sim.ranges.append((loop0, sim.t, f"{_SGL}/managers/scheduler.py(960): event_loop_normal", "python_function"))
    name = "python_frames"
    _write_kineto(sim, out / f"{name}.json.gz")
    # NOTE: frames are not step markers (steps come from the synchronizes)
    return _entry([f"{name}.json.gz"], "scheduler", "sched_cpu", "scheduler-bound", steps=steps,
                  injected_ns={"scheduler": (recv_us + sched_us + result_us) * US * (steps - 1)},
                  warnings=("python_tracing",), steps_source="sync")


def osrt_io(out: Path) -> dict:
    """A loop that writes results to disk between forwards: after each step's synchronize the
    launching thread is in OS ``write`` and ``fsync`` calls (nsys ``--trace=osrt``), no NVTX. Exists
    for ``host`` / ``host_io`` from OS runtime calls alone."""
    sim = _Sim(seed=7)
    steps, write_us, fsync_us = 12, 150, 700
    for _ in range(steps):
        for i in range(10):
            sim.launch(35, f"fwd_kernel_{i % 5}")
        sim.sync()
        sim.os_call(write_us, "write")
        sim.os_call(fsync_us, "fsync")
        sim.idle(1)
    name = "osrt_io"
    _write_nsys(sim, out / f"{name}.sqlite")
    return _entry([f"{name}.sqlite"], "host", "host_io", "host-bound, I/O", steps=steps, steps_source="sync",
                  injected_ns={"host": (write_us + fsync_us) * US * (steps - 1)})


def launch_bound_subthreshold(out: Path) -> dict:
    """An eager loop of hundreds of tiny kernels (2 µs) launched one per ~5.5 µs: the device idles
    3-4 µs between kernels, under the 5 µs bubble threshold, so there are almost no bubbles, yet the
    device is idle most of the time. Exists for ``launch_bound`` from sub-threshold gaps alone."""
    sim = _Sim(seed=8)
    steps, kernels = 4, 80
    for _ in range(steps):
        for i in range(kernels):
            sim.launch(2, f"elementwise_kernel_{i % 6}")
            sim.idle(1.5)
        sim.sync()
    name = "launch_bound_subthreshold"
    _write_nsys(sim, out / f"{name}.sqlite")
    return _entry([f"{name}.sqlite"], "kernel", "launch_bound", "launch-bound", steps=steps, steps_source="sync",
                  checks={"sub_threshold_share_min": 0.4, "bubble_share_max": 0.05})


def unrelated_files(out: Path) -> dict:
    """Two healthy single-GPU captures of separate runs, three days apart (their sessions' wall-clock
    starts). Exists for the refusal: given together they cannot be ranks of one job."""
    files = []
    for i, day in enumerate((0, 3)):
        sim = _Sim(seed=9 + i)
        for _ in range(4):
            for k in range(10):
                sim.launch(60, f"fwd_kernel_{k % 3}")
            sim.sync()
        files.append(f"unrelated_files.run{i}.sqlite")
        _write_nsys(sim, out / files[-1], session_utc_ns=SESSION_UTC_NS + day * 86_400 * 1_000_000_000)
    return _entry(files, refused="cannot be ranks of one job")


SCENARIOS: dict[str, Callable[[Path], dict]] = {f.__name__: f for f in (
    copy_bound, cold_start, low_coverage, partial_ranks, profiler_steps, python_frames, osrt_io,
    launch_bound_subthreshold, unrelated_files)}
NAMES = tuple(SCENARIOS)


def write(out_dir: str | Path, names: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Write every (or the named) capture scenario into ``out_dir``; returns their expected entries."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {n: f(out) for n, f in SCENARIOS.items() if names is None or n in names}
