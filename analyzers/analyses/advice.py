"""What to do next, per cause: concrete steps, with the trace's own figures where they help.

The first piece of advice is for the verdict's cause; the others follow for any other cause that
holds at least ``SECONDARY_SHARE`` of the lost time, ``MIN_WINDOW_SHARE`` of the device's active
window and ``MIN_ADVICE_NS`` in all. Copy advice is per copy kind (``names.CopyKind``): the kind with
the most copy time decides it, and HtoD with DtoH both large around kernels is a round trip.
Advice speaks the language of what ran (``vocab.World``): an engine's own options and functions,
PyTorch's, or a native program's; a healthy verdict gets its own advice only; launch advice for
steps that already replay CUDA graphs says so instead of asking for graphs.
"""
from __future__ import annotations

from srtscope.analyzers.model.names import CopyKind, copy_kind
from srtscope.analyzers.model.results import CommResult, DeviceResult, EagerResult
from srtscope.analyzers.model.units import fmt_ns
from srtscope.analyzers.model.verdicts import Advice
from srtscope.analyzers.model.vocab import Cause, World

SECONDARY_SHARE = 0.2
MIN_WINDOW_SHARE = 0.02
MIN_ADVICE_NS = 1_000_000
#: HtoD and DtoH each at least this share of the copy time: data copied in and out around kernels
ROUND_TRIP_SHARE = 0.25

_TEXT: dict[Cause, str] = {
    Cause.SCHED_CPU: ("Take the scheduler's CPU work off the critical path: {overlap}, and profile the "
                      "scheduler's own ranges (recv, admission, prefix matching, result processing) for the "
                      "slow one."),
    Cause.BATCH_PREP: "Move batch preparation off the critical path: {prep}",
    Cause.COMPUTE: ("The device is busy: only faster kernels help (better attention backend, fused or "
                    "quantised kernels, a larger batch to raise utilisation)."),
    Cause.LAUNCH_BOUND: "The host launches kernels no faster than the device runs them: {graphs}",
    Cause.EAGER_FALLBACK: "Decode steps fell back to eager launches: {sizes_fix}",
    Cause.MEMCPY: "Copies are on the critical path{copy}: {copy_fix}",
    Cause.EXPOSED_COMM: ("Collectives run while nothing computes: overlap them with compute (bucketed "
                         "all-reduce, async collectives on a side stream), or reduce the bytes moved."),
    Cause.STRAGGLER: ("Collectives wait for one late rank{who}: look at that rank's host work before "
                      "each collective and balance the work between ranks."),
    Cause.HOST_IO: "The device waits on host I/O: {io}",
    Cause.HANDOFF: "The device waits while the engine's processes hand each step to one another: {handoff}",
    Cause.COLD_START: "Start-up work is inside the capture: {warm}",
    Cause.HOST_UNATTRIBUTED: "The host did something no range names: {name_it}",
}

#: per world, the words of the fixes that depend on what ran (``world.trace_world``)
_WORDS: dict[str, dict[World, str]] = {
    "overlap": {
        World.SRTSCOPE: "enable overlap scheduling (`srtscope run --overlap`: step t+1 is scheduled while step t runs)",
        World.SGLANG: "keep overlap scheduling on (drop --disable-overlap-schedule: step t+1 is scheduled while "
                      "step t runs)",
        World.VLLM: "enable async scheduling (--async-scheduling: step t+1 is scheduled while step t runs)",
    },
    "prep": {
        World.SRTSCOPE: ("build the ForwardBatch and attention metadata for step t+1 while step t runs "
                         "(--overlap), keep index tensors on the device, and use pinned memory with non_blocking "
                         "copies for the inputs."),
        World.SGLANG: ("ForwardBatch.init_new and the attention backend's init_forward_metadata run on the "
                       "critical path: keep overlap scheduling on, keep index tensors on the device, and use "
                       "pinned memory with non_blocking copies for the inputs."),
        World.VLLM: ("the model runner's input preparation (_prepare_inputs, attention metadata, KV block "
                     "allocation) runs on the critical path: enable --async-scheduling, keep index tensors on the "
                     "device, and use pinned memory with non_blocking copies for the inputs."),
    },
    "graphs": {
        World.SRTSCOPE: "replay CUDA graphs for decode (no --disable-cuda-graph; --cuda-graph-max-bs over the "
                        "batch sizes seen), fuse small ops, and raise the batch size so each kernel does more work.",
        World.SGLANG: "replay CUDA graphs for decode (drop --disable-cuda-graph; --cuda-graph-max-bs over the batch "
                      "sizes seen), fuse small ops, and raise the batch size so each kernel does more work.",
        World.VLLM: "replay CUDA graphs (drop --enforce-eager; compilation_config cudagraph_capture_sizes / "
                    "max_cudagraph_capture_size over the batch sizes seen), and raise the batch size so each "
                    "kernel does more work.",
        World.PYTORCH: "capture the step in a CUDA graph (torch.cuda.graphs, or torch.compile "
                       "mode='reduce-overhead'), fuse small ops, and raise the batch size so each kernel does more "
                       "work.",
        World.NATIVE: "capture the loop's kernels in a CUDA graph (stream capture, then cudaGraphLaunch), fuse "
                      "small kernels, and give each kernel more work.",
    },
    "graphed": {
        World.NATIVE: "the steps already replay CUDA graphs: the gaps are the host's time between launches — "
                      "launch the next graph before the device drains it, and fold the work between replays into "
                      "the graph.",
        World.PYTORCH: "the steps already replay CUDA graphs: the gaps are the host's time between replays — "
                       "move the Python work between them (sampling, bookkeeping) into the graph or off the "
                       "critical path.",
    },
    "sizes_fix": {
        World.SRTSCOPE: "raise --cuda-graph-max-bs to cover the batch sizes seen{sizes}.",
        World.SGLANG: "raise --cuda-graph-max-bs (or the captured batch sizes) to cover the batch sizes seen{sizes}.",
        World.VLLM: "raise compilation_config max_cudagraph_capture_size (or cudagraph_capture_sizes) to cover "
                    "the batch sizes seen{sizes}.",
        World.PYTORCH: "capture graphs for the batch sizes seen{sizes}.",
    },
    "io": {
        World.PYTORCH: "move data loading and writes off the launching thread (DataLoader workers, pin_memory, "
                       "async writes) and prefetch the next batch.",
        World.NATIVE: "move file and network I/O off the launching thread (a reader thread, double buffers) and "
                      "overlap it with the device's work.",
    },
    "handoff": {
        World.VLLM: ("the engine core waits on its worker's answer (MultiprocExecutor.collective_rpc, "
                     "FutureWrapper.result) while the worker runs none of its stages: enable --async-scheduling "
                     "(step t+1 is scheduled and sent while step t runs), and give the engine core and each "
                     "worker a core of its own (both poll their message queues)."),
        World.PYTORCH: ("one process waits on another's answer while that one runs none of its stages: send the "
                        "next step's work before waiting for this one's answer, and give each process a core of "
                        "its own."),
    },
    "warm": {
        World.PYTORCH: "warm up (run a few iterations, compile, allocate) before starting the profiler, or cut "
                       "the capture to the steady state (nsys --capture-range, torch.profiler schedule with "
                       "warmup).",
        World.NATIVE: "warm up (create the context, allocate, load modules, run one iteration) before the part "
                      "you measure, or cut the capture to the steady state (nsys --capture-range=cudaProfilerApi "
                      "with cudaProfilerStart/Stop).",
    },
    "name_it": {
        World.PYTORCH: "add NVTX ranges or record_function around the host work (or profile with_stack=True / "
                       "nsys -s cpu) to find it.",
        World.NATIVE: "add NVTX ranges (nvtxRangePush/Pop) around the host work, or sample its stacks (nsys -s "
                      "cpu) to find it.",
    },
    "dtoh": {
        World.PYTORCH: "read back less and later: keep results on the device, copy asynchronously into pinned "
                       "buffers, and avoid .item()/.cpu() in the step.",
        World.NATIVE: "read back less and later: keep results on the device and copy asynchronously "
                      "(cudaMemcpyAsync) into pinned buffers.",
    },
}


def _words(key: str, world: World) -> str:
    """The words of ``key`` for ``world``: its own, else an engine's fall back to PyTorch's, and
    PyTorch's to a native program's."""
    got = _WORDS[key]
    for w in (world, World.PYTORCH if world.engine else world, World.NATIVE):
        if w in got:
            return got[w]
    return next(iter(got.values()))


_COPY_FIX: dict[str, str] = {
    CopyKind.HTOD_PAGEABLE.value: ("pin the host memory they read (pinned copies reach several times pageable "
                                   "bandwidth and can run asynchronously), then issue them non_blocking on a side "
                                   "stream."),
    CopyKind.HTOD.value: ("issue them non_blocking on a side stream ahead of use, and prefetch offloaded weights "
                          "one layer ahead."),
    CopyKind.DTOD.value: ("these are device-to-device copies (pinning cannot help): fuse or avoid them "
                          "(.contiguous(), torch.cat, clone, layout changes), or write outputs in place."),
    CopyKind.PEER.value: ("these move data between devices: use a direct P2P/NVLink path and move fewer bytes."),
    "round_trip": ("the data is copied to the device and back around the kernels every iteration: keep it "
                   "resident on the device across iterations and copy only results out."),
}


def copy_kind_of(device: DeviceResult | None) -> str | None:
    """The copy kind advice is about: the direction with the most copy time (HtoD mostly pageable:
    ``htod_pageable``), or ``round_trip`` when HtoD and DtoH each hold ``ROUND_TRIP_SHARE``."""
    if device is None or not device.memcpy:
        return None
    total = sum(st.ns for st in device.memcpy.values()) or 1
    h, d = device.memcpy.get("HtoD"), device.memcpy.get("DtoH")
    if h is not None and d is not None and min(h.ns, d.ns) >= ROUND_TRIP_SHARE * total:
        return "round_trip"
    k, st = next(iter(device.memcpy.items()))
    if k == "HtoD":
        return (CopyKind.HTOD_PAGEABLE if 2 * st.pageable_ns >= st.ns and st.pageable_ns else CopyKind.HTOD).value
    return copy_kind(f"Memcpy {k}").value


def advice_for(cause: Cause, causes: dict[str, int], eager: EagerResult, comm: CommResult,
               device: DeviceResult | None, window_ns: int = 0, world: World = World.PYTORCH,
               healthy: bool = False) -> tuple[Advice, ...]:
    """The verdict's cause first, then the other causes large enough to matter — none on a healthy
    verdict; in the words of what ran (``world``: the engine's own options and functions, PyTorch's,
    or a native program's)."""
    lost = sum(causes.values())
    order = [cause] + ([] if healthy else
                       [Cause(c) for c, ns in sorted(causes.items(), key=lambda kv: -kv[1])
                        if Cause(c) is not cause and lost and ns >= SECONDARY_SHARE * lost
                        and ns >= MIN_ADVICE_NS and ns >= MIN_WINDOW_SHARE * window_ns])
    sizes = f" (eager batch sizes {', '.join(map(str, eager.batch_sizes[:8]))}; largest captured " \
            f"{eager.max_captured_bs})" if eager.batch_sizes else ""
    copy = ""
    if device is not None and device.memcpy:
        k, st = next(iter(device.memcpy.items()))
        copy = f" ({k} {fmt_ns(st.ns)}" + (f", {st.gbps:.1f} GB/s" if st.gbps else "") + \
               (f", {fmt_ns(st.pageable_ns)} of it pageable" if st.pageable_ns else "") + ")"
    who = f" (rank {comm.straggler_rank})" if comm.straggler_rank is not None else ""
    kind = copy_kind_of(device)
    fix = _words("dtoh", world) if kind == CopyKind.DTOH.value else \
        _COPY_FIX.get(kind or "", _COPY_FIX[CopyKind.HTOD.value])
    if kind == "round_trip" and device is not None and any(st.pageable_ns for st in device.memcpy.values()):
        fix = fix[:-1] + "; until then, pin the host buffers (these copies use pageable memory)."
    graphed = eager.graph_steps > 0 and not eager.eager_decode_steps
    words = {k: _words(k, world) for k in _WORDS}
    if graphed:
        words["graphs"] = _words("graphed", world)
    words["sizes_fix"] = words["sizes_fix"].format(sizes=sizes)
    return tuple(Advice(c.value, _TEXT[c].format(copy=copy, who=who, copy_fix=fix, **words)) for c in order)
