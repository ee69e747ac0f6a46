"""What to do next, per cause: concrete steps, with the trace's own figures where they help.

The first piece of advice is for the verdict's cause; the others follow for any other cause that
holds at least ``SECONDARY_SHARE`` of the lost time, ``MIN_WINDOW_SHARE`` of the device's active
window and ``MIN_ADVICE_NS`` in all. Copy advice is per copy kind (``names.CopyKind``): the kind with
the most copy time decides it, and HtoD with DtoH both large around kernels is a round trip.
"""
from __future__ import annotations

from srtscope.analyzers.model.names import CopyKind, copy_kind
from srtscope.analyzers.model.results import CommResult, DeviceResult, EagerResult
from srtscope.analyzers.model.units import fmt_ns
from srtscope.analyzers.model.verdicts import Advice
from srtscope.analyzers.model.vocab import Cause

SECONDARY_SHARE = 0.2
MIN_WINDOW_SHARE = 0.02
MIN_ADVICE_NS = 1_000_000
#: HtoD and DtoH each at least this share of the copy time: data copied in and out around kernels
ROUND_TRIP_SHARE = 0.25

_TEXT: dict[Cause, str] = {
    Cause.SCHED_CPU: ("Take the scheduler's CPU work off the critical path: enable overlap scheduling "
                      "(schedule step t+1 while step t runs), and profile the scheduler's own ranges "
                      "(recv, admission, prefix matching, result processing) for the slow one."),
    Cause.BATCH_PREP: ("Move batch preparation off the critical path: build ForwardBatch and attention "
                       "metadata for step t+1 while step t runs, keep index tensors on the device, and "
                       "use pinned memory with non_blocking copies for the inputs."),
    Cause.COMPUTE: ("The device is busy: only faster kernels help (better attention backend, fused or "
                    "quantised kernels, a larger batch to raise utilisation)."),
    Cause.LAUNCH_BOUND: ("The host launches kernels no faster than the device runs them: capture the "
                         "step in a CUDA graph (or torch.compile mode='reduce-overhead'), fuse small ops, "
                         "and raise the batch size so each kernel does more work."),
    Cause.EAGER_FALLBACK: ("Decode steps fell back to eager launches: raise cuda_graph_max_bs (or the "
                           "captured batch sizes) to cover the batch sizes seen{sizes}."),
    Cause.MEMCPY: "Copies are on the critical path{copy}: {copy_fix}",
    Cause.EXPOSED_COMM: ("Collectives run while nothing computes: overlap them with compute (bucketed "
                         "all-reduce, async collectives on a side stream), or reduce the bytes moved."),
    Cause.STRAGGLER: ("Collectives wait for one late rank{who}: look at that rank's host work before "
                      "each collective and balance the work between ranks."),
    Cause.HOST_IO: ("The device waits on host I/O: move data loading and writes off the launching thread "
                    "(DataLoader workers, pin_memory, async writes) and prefetch the next batch."),
    Cause.COLD_START: ("Start-up work is inside the capture: warm up (run a few iterations, compile, "
                       "allocate) before starting the profiler, or cut the capture to the steady state "
                       "(nsys --capture-range, torch.profiler schedule with warmup)."),
    Cause.HOST_UNATTRIBUTED: ("The host did something no range names: add NVTX ranges or record_function "
                              "around the host work (or profile with_stack=True / nsys -s cpu) to find it."),
}


#: Advice in an engine's own words where the trace is that engine's (``engine_of``): its functions,
#: not another engine's (vLLM has no ForwardBatch).
_ENGINE_TEXT: dict[tuple[str, Cause], str] = {
    ("vllm", Cause.SCHED_CPU): (
        "Take the scheduler's CPU work off the critical path: vLLM runs Scheduler.schedule, "
        "Scheduler.update_from_output and the output processing (OutputProcessor.process_outputs: "
        "detokenization) between forwards; turn on async scheduling (--async-scheduling: step t+1 is "
        "scheduled while step t runs) and profile those functions for the slow one."),
    ("vllm", Cause.BATCH_PREP): (
        "Move batch preparation off the critical path: vLLM allocates KV slots in "
        "KVCacheManager.allocate_slots (inside Scheduler.schedule) and builds the step's inputs and "
        "attention metadata in GPUModelRunner._update_states / _prepare_inputs; turn on async "
        "scheduling (--async-scheduling) so step t+1 is prepared while step t runs, and profile those "
        "functions for the slow one."),
}


def engine_of(steps_source: str, extra: dict | None = None) -> str | None:
    """The engine whose trace this is: the steps' source (``vllm`` / ``sglang`` names), else the
    engine a probe trace was instrumented for (``--instrument``); None for any other trace."""
    if steps_source in ("vllm", "sglang"):
        return steps_source
    inst = ((extra or {}).get("probe.meta") or {}).get("instrumented")
    return inst if inst in ("vllm", "sglang") else None


_COPY_FIX: dict[str, str] = {
    CopyKind.HTOD_PAGEABLE.value: ("pin the host memory they read (pinned copies reach several times pageable "
                                   "bandwidth and can run asynchronously), then issue them non_blocking on a side "
                                   "stream."),
    CopyKind.HTOD.value: ("issue them non_blocking on a side stream ahead of use, and prefetch offloaded weights "
                          "one layer ahead."),
    CopyKind.DTOH.value: ("read back less and later: keep results on the device, copy asynchronously into pinned "
                          "buffers, and avoid .item()/.cpu() in the step."),
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
               device: DeviceResult | None, window_ns: int = 0, engine: str | None = None) -> tuple[Advice, ...]:
    """The verdict's cause first, then the other causes large enough to matter; in ``engine``'s own
    words where it has them (``_ENGINE_TEXT``)."""
    lost = sum(causes.values())
    order = [cause] + [Cause(c) for c, ns in sorted(causes.items(), key=lambda kv: -kv[1])
                       if Cause(c) is not cause and lost and ns >= SECONDARY_SHARE * lost
                       and ns >= MIN_ADVICE_NS and ns >= MIN_WINDOW_SHARE * window_ns]
    sizes = f" (eager batch sizes {', '.join(map(str, eager.batch_sizes[:8]))}; largest captured " \
            f"{eager.max_captured_bs})" if eager.batch_sizes else ""
    copy = ""
    if device is not None and device.memcpy:
        k, st = next(iter(device.memcpy.items()))
        copy = f" ({k} {fmt_ns(st.ns)}" + (f", {st.gbps:.1f} GB/s" if st.gbps else "") + \
               (f", {fmt_ns(st.pageable_ns)} of it pageable" if st.pageable_ns else "") + ")"
    who = f" (rank {comm.straggler_rank})" if comm.straggler_rank is not None else ""
    kind = copy_kind_of(device)
    fix = _COPY_FIX.get(kind or "", _COPY_FIX[CopyKind.HTOD.value])
    if kind == "round_trip" and device is not None and any(st.pageable_ns for st in device.memcpy.values()):
        fix = fix[:-1] + "; until then, pin the host buffers (these copies use pageable memory)."
    return tuple(Advice(c.value, _ENGINE_TEXT.get((engine or "", c), _TEXT[c]).format(
        sizes=sizes, copy=copy, who=who, copy_fix=fix)) for c in order)
