"""The analyzers' closed vocabulary: bottleneck classes, causes, bubble classes, step sources.

String-valued Enums, so JSON values stay the plain strings of ``docs/json_contract.md``. The stage
taxonomy they build on (``StageClass``) lives in ``probes/stages.py``.
"""
from __future__ import annotations

from enum import Enum


class StepExec(str, Enum):
    """How a step ran on the device (the ``exec`` of a step)."""

    GRAPH = "graph"      # replayed a CUDA graph
    EAGER = "eager"      # launched its kernels one by one
    IDLE = "idle"        # launched nothing


class Bottleneck(str, Enum):
    """Whose fault the lost time is. ``host``: the device waited on host work that is none of the
    engine's stages and none of the model's operators (I/O, allocation, start-up, unannotated code)."""

    SCHEDULER = "scheduler"
    PREP = "prep"
    KERNEL = "kernel"
    HOST = "host"


class Cause(str, Enum):
    """The cause beneath a bottleneck class; each belongs to exactly one class (``bottleneck``)."""

    SCHED_CPU = "sched_cpu"                  # the scheduler's own CPU work (stage ranges, engine frames)
    BATCH_PREP = "batch_prep"                # batch preparation (prep stages, engine frames)
    COMPUTE = "compute"                      # the device is busy with kernels: only faster kernels help
    LAUNCH_BOUND = "launch_bound"            # host inside model code / launching kernels one by one
    EAGER_FALLBACK = "eager_fallback"        # the same, in decode steps that ran eagerly beside graphs
    MEMCPY = "memcpy"                        # copies the device could not hide behind kernels
    EXPOSED_COMM = "exposed_comm"            # collectives not overlapped with compute
    STRAGGLER = "straggler"                  # collectives waiting for a late rank
    HOST_IO = "host_io"                      # file, socket or data-loader work on the host
    HANDOFF = "handoff"                      # an engine's processes handing a step over (neither in a stage)
    COLD_START = "cold_start"                # context creation, allocation, module loads, compilation
    HOST_UNATTRIBUTED = "host_unattributed"  # host time with no evidence of what it was

    @property
    def bottleneck(self) -> Bottleneck:
        return _CLASS_OF[self]


_CLASS_OF: dict[Cause, Bottleneck] = {
    Cause.SCHED_CPU: Bottleneck.SCHEDULER, Cause.BATCH_PREP: Bottleneck.PREP,
    **{c: Bottleneck.KERNEL for c in (Cause.COMPUTE, Cause.LAUNCH_BOUND, Cause.EAGER_FALLBACK, Cause.MEMCPY,
                                      Cause.EXPOSED_COMM, Cause.STRAGGLER)},
    **{c: Bottleneck.HOST for c in (Cause.HOST_IO, Cause.HANDOFF, Cause.COLD_START, Cause.HOST_UNATTRIBUTED)},
}


class World(str, Enum):
    """What ran in the trace (``analyses.world``): the engine, else PyTorch, else a native program."""

    SRTSCOPE = "srtscope"      # srtscope's reference engine
    SGLANG = "sglang"
    VLLM = "vllm"
    PYTORCH = "pytorch"        # a PyTorch program that is none of those engines
    NATIVE = "native"          # C++/CUDA or HPC code: no PyTorch seen

    @property
    def engine(self) -> bool:
        return self in (World.SRTSCOPE, World.SGLANG, World.VLLM)

    @property
    def torch(self) -> bool:
        return self is not World.NATIVE


class BubbleClass(str, Enum):
    """What the launching host thread was doing during a bubble; the classes add up to the bubble.

    ``queued``: the work that ends the bubble was launched before the bubble began — the device
    waited on a dependency (another stream, a peer rank), not on the host.
    """

    SCHEDULER = "scheduler"
    PREP = "prep"
    KERNEL = "kernel"
    SYNC = "sync"
    LAUNCH = "launch"
    UNATTRIBUTED = "unattributed"
    HOST = "host"
    QUEUED = "queued"


#: bubble classes in the JSON's key order (new classes are appended: keys are only added)
BUBBLE_CLASSES: tuple[str, ...] = tuple(c.value for c in BubbleClass)


class StepSource(str, Enum):
    """Where the steps came from, most trusted first."""

    LOOP_STEP = "loop.step"              # our engine's loop.step ranges
    SGLANG = "sglang"                    # SGLang's scheduler ranges (recv_requests / get_next_batch_to_run)
    ENGINE_FRAMES = "engine_frames"      # an engine's once-a-step function in Python frames (vLLM EngineCore.step)
    PROFILER_STEP = "profiler_step"      # torch.profiler ProfilerStep#N
    VLLM = "vllm"                        # vLLM's llm_engine step / schedule: / execute_context_* ranges
    ITERATION = "iteration"              # one recurring per-iteration marker: Optimizer.step, DataLoader next
    SYNC = "sync"                        # the launching thread's synchronisation points
    BURSTS = "bursts"                    # launch bursts separated by idle gaps
    NONE = "none"

    @property
    def own_numbers(self) -> bool:
        """Whether the trace numbers these steps itself (``loop.step`` N, ``ProfilerStep#N``): they
        are found again, bounds and numbers, in any window that holds them whole."""
        return self in (StepSource.LOOP_STEP, StepSource.PROFILER_STEP)


class WhatIfBound(str, Enum):
    """What limited a what-if's saving (``WhatIf.bound``)."""

    NONE = "none"                # the model's own estimate, under every bound
    LOST = "lost"                # no step gives back more than the cause lost in it
    OVERLAP = "overlap"          # overlap hides at most the step's compute time
    COPY_ENGINE = "copy_engine"  # the busiest copy direction still fits in the step
    TRANSPORT = "transport"      # collectives the next kernel waits for: a faster transport, not overlap
    DEVICE_WORK = "device_work"  # no step gets shorter than the device work the fix keeps
    TOO_LITTLE = "too_little"    # too little device work in the steps to predict anything
