"""What to do next, per cause: concrete steps, with the trace's own figures where they help.

The first piece of advice is for the verdict's cause; the others follow for any other cause that
holds at least ``SECONDARY_SHARE`` of the lost time.
"""
from __future__ import annotations

from srtscope.analyzers.results import Advice, CommResult, DeviceResult, EagerResult
from srtscope.analyzers.units import fmt_ns
from srtscope.analyzers.vocab import Cause

SECONDARY_SHARE = 0.2

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
    Cause.MEMCPY: ("Copies are on the critical path: pin host memory (pinned copies reach several times "
                   "pageable bandwidth), issue them non_blocking on a side stream to overlap with compute, "
                   "and prefetch offloaded weights one layer ahead{copy}."),
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


def advice_for(cause: Cause, causes: dict[str, int], eager: EagerResult, comm: CommResult,
               device: DeviceResult | None) -> tuple[Advice, ...]:
    lost = sum(causes.values())
    order = [cause] + [Cause(c) for c, ns in sorted(causes.items(), key=lambda kv: -kv[1])
                       if Cause(c) is not cause and lost and ns >= SECONDARY_SHARE * lost]
    sizes = f" (eager batch sizes {', '.join(map(str, eager.batch_sizes[:8]))}; largest captured " \
            f"{eager.max_captured_bs})" if eager.batch_sizes else ""
    copy = ""
    if device is not None and device.memcpy:
        k, st = next(iter(device.memcpy.items()))
        copy = f" ({k} {fmt_ns(st.ns)}" + (f", {st.gbps:.1f} GB/s" if st.gbps else "") + \
               (f", {fmt_ns(st.pageable_ns)} of it pageable" if st.pageable_ns else "") + ")"
    who = f" (rank {comm.straggler_rank})" if comm.straggler_rank is not None else ""
    return tuple(Advice(c.value, _TEXT[c].format(sizes=sizes, copy=copy, who=who)) for c in order)
