"""The stage taxonomy: the one contract between the engine's probes and the analyzers.

Every stage name, its bottleneck class, and the aliases under which real engines (SGLang, vLLM)
emit the same stage live here and nowhere else.

NVTX message encoding: ``"<stage> key=value key=value"`` — the stage name, then space-separated
attributes. Values never contain spaces (``format_message`` replaces them with ``_``).

Stages nest, and the innermost one decides: as in SGLang, ``prepare_for_extend`` /
``prepare_for_decode`` (KV slot allocation, request rows, prefix bookkeeping) run inside
``get_next_batch_to_run``, so their ``prep.batch part=alloc`` range sits inside ``sched.schedule``
and that time is prep, not scheduler. The ``mode`` attribute takes the ``StepMode`` values.
"""
from __future__ import annotations

from enum import Enum

DOMAIN = "srtscope"


class StageClass(str, Enum):
    """Who is to blame for time spent inside a stage."""

    SCHEDULER = "scheduler"
    PREP = "prep"
    KERNEL = "kernel"
    SYNC = "sync"
    CONTAINER = "container"


class Stage(str, Enum):
    LOOP_STEP = "loop.step"
    SCHED_RECV = "sched.recv"
    SCHED_SCHEDULE = "sched.schedule"
    PREP_BATCH = "prep.batch"
    RUN_GRAPH_REPLAY = "run.graph_replay"
    RUN_EAGER = "run.eager"
    COMM_ALL_REDUCE = "comm.all_reduce"
    RUN_SAMPLE = "run.sample"
    SCHED_RESULT = "sched.result"
    SYNC_WAIT = "sync.wait"

    @property
    def cls(self) -> StageClass:
        return _CLASS[self]

    @property
    def description(self) -> str:
        return _DESCRIPTION[self]


class StepMode(str, Enum):
    """The ``mode`` attribute of ``loop.step``, ``sched.schedule`` and ``prep.*`` ranges: the
    engine's ``ForwardMode`` values (SGLang's names). A prefill is an ``extend`` (of an empty or
    cached prefix); ``mixed`` is a prefill chunk with decode rows riding along."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"


#: Modes whose forward is a prefill (eager by design: graphs are captured for decode only).
EXTEND_LIKE_MODES: frozenset[str] = frozenset({StepMode.EXTEND.value, StepMode.MIXED.value})


class EagerReason(str, Enum):
    """Why a step ran eagerly instead of replaying a CUDA graph: the ``reason`` attribute of
    ``run.eager``. The analyzers infer the same values from a trace that does not say."""

    NO_CUDA = "no_cuda"            # not on a CUDA device: nothing is captured
    DISABLED = "disabled"          # graphs turned off, or this size's capture failed or was skipped
    EXTEND = "extend"              # an extend or mixed batch: graphs are decode-only
    BS_OVER_MAX = "bs_over_max"    # more requests than the largest captured size
    UNKNOWN = "unknown"            # analyzers only: eager, and nothing in the trace says why


_CLASS: dict[Stage, StageClass] = {
    Stage.LOOP_STEP: StageClass.CONTAINER,
    Stage.SCHED_RECV: StageClass.SCHEDULER,
    Stage.SCHED_SCHEDULE: StageClass.SCHEDULER,
    Stage.PREP_BATCH: StageClass.PREP,
    Stage.RUN_GRAPH_REPLAY: StageClass.KERNEL,
    Stage.RUN_EAGER: StageClass.KERNEL,
    Stage.COMM_ALL_REDUCE: StageClass.KERNEL,
    Stage.RUN_SAMPLE: StageClass.KERNEL,
    Stage.SCHED_RESULT: StageClass.SCHEDULER,
    Stage.SYNC_WAIT: StageClass.SYNC,
}

_DESCRIPTION: dict[Stage, str] = {
    Stage.LOOP_STEP: "one event-loop iteration (attrs: step, mode (extend/decode/mixed/idle), bs, tokens)",
    Stage.SCHED_RECV: "receive/tokenize new requests, TP broadcast of them",
    Stage.SCHED_SCHEDULE: "get_next_batch_to_run: merge, prefix match, admission, retract",
    Stage.PREP_BATCH: ("prepare_for_extend/decode (slot allocation, part=alloc, nested in sched.schedule), "
                       "ForwardBatch build, H2D copies, attention plan (part=attn)"),
    Stage.RUN_GRAPH_REPLAY: "CUDA graph replay (attrs: bs, padded_bs)",
    Stage.RUN_EAGER: "eager forward (attr: reason)",
    Stage.COMM_ALL_REDUCE: "tensor-parallel all-reduce (attrs: bytes, dtype)",
    Stage.RUN_SAMPLE: "sampling",
    Stage.SCHED_RESULT: "process_batch_result: tokens, stop checks, cache insert, frees",
    Stage.SYNC_WAIT: "host blocked on device results",
}

#: Names real engines use for the same stages (exact match on the range name).
ALIASES: dict[str, Stage] = {
    # SGLang (SGLANG_ENABLE_NVTX_SCHEDULER=1)
    "scheduler.recv_requests": Stage.SCHED_RECV,
    "scheduler.process_input_requests": Stage.SCHED_RECV,
    "scheduler.get_next_batch_to_run": Stage.SCHED_SCHEDULE,
    "scheduler.get_new_batch_prefill": Stage.SCHED_SCHEDULE,
    "scheduler.update_running_batch": Stage.SCHED_SCHEDULE,
    "scheduler.run_batch": Stage.RUN_EAGER,
    "scheduler.process_batch_result": Stage.SCHED_RESULT,
    "scheduler.process_batch_result_decode": Stage.SCHED_RESULT,
    "scheduler.process_batch_result_prefill": Stage.SCHED_RESULT,
    "prepare_for_extend": Stage.PREP_BATCH,
    "prepare_for_decode": Stage.PREP_BATCH,
    "forward_batch_generation": Stage.RUN_EAGER,
    # vLLM V1
    "schedule": Stage.SCHED_SCHEDULE,
    "update_from_output": Stage.SCHED_RESULT,
    "_prepare_inputs": Stage.PREP_BATCH,
    "prepare_inputs": Stage.PREP_BATCH,
    "execute_model": Stage.RUN_EAGER,
    "sample_tokens": Stage.RUN_SAMPLE,
}

#: Engine functions that carry a stage when a trace has Python frames but no stage ranges (Kineto
#: ``python_function`` events, ``with_stack=True``): the frame's function name -> the stage it is.
ENGINE_FUNCTIONS: dict[str, Stage] = {
    # SGLang
    "recv_requests": Stage.SCHED_RECV,
    "process_input_requests": Stage.SCHED_RECV,
    "get_next_batch_to_run": Stage.SCHED_SCHEDULE,
    "get_new_batch_prefill": Stage.SCHED_SCHEDULE,
    "update_running_batch": Stage.SCHED_SCHEDULE,
    "process_batch_result": Stage.SCHED_RESULT,
    "process_batch_result_decode": Stage.SCHED_RESULT,
    "process_batch_result_prefill": Stage.SCHED_RESULT,
    "prepare_for_extend": Stage.PREP_BATCH,
    "prepare_for_decode": Stage.PREP_BATCH,
    "init_new": Stage.PREP_BATCH,                  # ForwardBatch.init_new
    "init_forward_metadata": Stage.PREP_BATCH,
    # vLLM V1
    "schedule": Stage.SCHED_SCHEDULE,
    "update_from_output": Stage.SCHED_RESULT,
    "_update_states": Stage.PREP_BATCH,
    "_prepare_inputs": Stage.PREP_BATCH,
    "_prepare_input_ids": Stage.PREP_BATCH,
    "_calc_spec_decode_metadata": Stage.PREP_BATCH,
    "sample_tokens": Stage.RUN_SAMPLE,
}


def engine_function(frame: str) -> Stage | None:
    """The stage of a Python frame name (``"path/file.py(123): func"`` or a bare ``func``), or None.

    NOTE: with a path, only an engine's own files count (``schedule`` is a common name elsewhere).
    """
    if not frame:
        return None
    path, sep, func = frame.rpartition("): ")
    if sep and not any(e in path for e in _ENGINE_PATHS):
        return None
    return ENGINE_FUNCTIONS.get((func if sep else frame).strip())


_ENGINE_PATHS = ("sglang", "vllm", "srtscope", "engine/scheduler", "engine/runner")


_BY_NAME: dict[str, Stage] = {s.value: s for s in Stage}


def parse_message(message: str) -> tuple[str, dict[str, str]]:
    """Split an NVTX message ``"name k=v k=v"`` into the name and its attributes."""
    if not message:
        return "", {}
    parts = message.split(" ")
    name = parts[0]
    attrs: dict[str, str] = {}
    for token in parts[1:]:
        key, sep, value = token.partition("=")
        if sep and key:
            attrs[key] = value
    return name, attrs


def format_message(name: str, attrs: dict[str, object] | None = None) -> str:
    """Encode a stage and its attributes as one NVTX message (inverse of ``parse_message``).

    Spaces inside a value become ``_`` so each attribute stays one token.
    """
    if not attrs:
        return name
    parts = [name]
    for k, v in attrs.items():
        text = v if v.__class__ is str else str(v)
        if " " in text:
            text = text.replace(" ", "_")
        parts.append(f"{k}={text}")
    return " ".join(parts)


def resolve_stage(name: str) -> Stage | None:
    """The stage a range name stands for: our own names, real engines' aliases, or None.

    Accepts a bare name or a full NVTX message with attributes.
    """
    if not name:
        return None
    stage = _BY_NAME.get(name)
    if stage is not None:
        return stage
    stage = ALIASES.get(name)
    if stage is not None:
        return stage
    if " " in name:
        return resolve_stage(name.split(" ", 1)[0])
    return None


def stage_class(name: str) -> StageClass | None:
    """The bottleneck class of a range name, or None when the name is not a known stage."""
    stage = resolve_stage(name)
    return None if stage is None else stage.cls
