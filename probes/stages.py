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

from collections.abc import Sequence
from dataclasses import dataclass
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

class NameRole(str, Enum):
    """What an engine's range says beyond its stage (``EngineName.role``)."""

    STAGE = "stage"        # one stage's work
    STEP = "step"          # opens an engine step: steps run from one of these to the next
    FORWARD = "forward"    # the model's forward alone: stands in for the device on a CPU run
    EXECUTE = "execute"    # the whole model step (prep + forward + ...): a device stand-in only
                           # where no FORWARD range exists, and then prep inside it is not apart


@dataclass(frozen=True)
class EngineName:
    """One range name a real engine emits and the stage it is. ``name`` ending in ``*`` is a prefix
    (``"schedule: *"`` matches ``"schedule: allocate_slots"``); otherwise the whole name."""

    engine: str
    name: str
    stage: Stage
    role: NameRole = NameRole.STAGE
    note: str = ""
    #: an EXECUTE range's stage for its time outside the forward, in a trace that holds the same
    #: engine's FORWARD ranges (``resolve_stages``); None: ``stage`` throughout
    around_forward: Stage | None = None
    #: an EXECUTE range whose time after its last FORWARD range is the model's own work (sampling
    #: the next tokens): on a CPU run it stands in for the device as the forward does
    #: (``analyzers/readers/stand_in``), where a GPU would run that work as kernels
    model_after_forward: bool = False


@dataclass(frozen=True)
class EngineFrame:
    """A Python function of a real engine that carries a stage when a trace has Python frames
    (Kineto ``python_function``) but no range for it. ``module`` is a path fragment the frame's file
    must contain: only the engine's own modules count (``schedule`` is a common name elsewhere, e.g.
    FlashAttention's ``flash_attn.py: schedule``)."""

    engine: str
    module: str
    function: str
    stage: Stage


_S = Stage
_R = NameRole

#: Every range name of a real engine srtscope understands, and the stage it maps onto. The one
#: declared table (the analyzers derive ``ALIASES``, step openers and device stand-ins from it).
ENGINE_NAMES: tuple[EngineName, ...] = (
    # SGLang 0.5.23 (checked against its source): the scheduler's stage spans
    # (sglang/srt/observability/scheduler_stage_metrics.py: ``scheduler.<stage>``) and the forward's
    # step span (model_runner.py, ``step[MODE bs=N ...]``) are record_function ranges whenever a torch
    # profiler runs; NVTX ranges too with SGLANG_ENABLE_NVTX_SCHEDULER=1 and the ``nvtx`` package.
    # The loop: ingest_requests (recv_requests, now SchedulerRequestReceiver's; process_input_requests),
    # get_next_batch_to_run (prepare_for_extend / prepare_for_decode inside, no span of their own),
    # run_batch (ForwardBatch.init_new, then ModelRunner.forward = the step span, then sampling), then
    # process_batch_result; an idle turn runs scheduler.idle instead.
    EngineName("sglang", "scheduler.recv_requests", _S.SCHED_RECV, _R.STEP, "first range of each loop turn"),
    EngineName("sglang", "scheduler.process_input_requests", _S.SCHED_RECV,
               note="also where a stop_profile request is handled: the trace ends inside it"),
    EngineName("sglang", "scheduler.get_next_batch_to_run", _S.SCHED_SCHEDULE),
    EngineName("sglang", "scheduler.run_batch", _S.RUN_EAGER, _R.EXECUTE,
               "ForwardBatch build + forward + sampling: the whole model step (the device stand-in) where no "
               "step span exists; before its step[...] forward, batch preparation; after it, sampling "
               "(ModelRunner.sample: a CPU run's device stand-in too)",
               around_forward=_S.PREP_BATCH, model_after_forward=True),
    EngineName("sglang", "step[*", _S.RUN_EAGER, _R.FORWARD,
               "ModelRunner.forward: step[EXTEND bs=8 toks=192], step[DECODE bs=8], step[MIXED ...]"),
    EngineName("sglang", "scheduler.process_batch_result", _S.SCHED_RESULT),
    EngineName("sglang", "scheduler.process_queue", _S.SCHED_RECV, note="disaggregation: transfer queues"),
    # SGLang before 0.5.23 (absent from 0.5.23's source; kept for older traces, from SGLang's earlier
    # scheduler NVTX helpers, not re-checked against a release here)
    EngineName("sglang", "scheduler.get_new_batch_prefill", _S.SCHED_SCHEDULE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.update_running_batch", _S.SCHED_SCHEDULE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.prepare_mlp_sync_batch", _S.SCHED_SCHEDULE,
               note="before 0.5.23: DP ranks agree on batch sizes"),
    EngineName("sglang", "scheduler.launch_batch_sample_if_needed", _S.RUN_SAMPLE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.process_batch_result_decode", _S.SCHED_RESULT, note="before 0.5.23"),
    EngineName("sglang", "scheduler.process_batch_result_prefill", _S.SCHED_RESULT, note="before 0.5.23"),
    EngineName("sglang", "scheduler.disagg_decode.prepare_idle_batch", _S.SCHED_SCHEDULE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.disagg_decode.get_next_batch", _S.SCHED_SCHEDULE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.disagg_decode.get_new_prebuilt_batch", _S.SCHED_SCHEDULE, note="before 0.5.23"),
    EngineName("sglang", "scheduler.disagg_decode.process_decode_queue", _S.SCHED_RECV, note="before 0.5.23"),
    EngineName("sglang", "tp_worker.batch_init_new", _S.PREP_BATCH, note="before 0.5.23: ForwardBatch.init_new"),
    EngineName("sglang", "cuda_graph_runner.replay_prepare", _S.PREP_BATCH, note="before 0.5.23"),
    EngineName("sglang", "cuda_graph_runner.replay", _S.RUN_GRAPH_REPLAY, _R.FORWARD, "before 0.5.23"),
    EngineName("sglang", "prepare_for_extend", _S.PREP_BATCH, note="before 0.5.23"),
    EngineName("sglang", "prepare_for_decode", _S.PREP_BATCH, note="before 0.5.23"),
    EngineName("sglang", "forward_batch_generation", _S.RUN_EAGER, _R.EXECUTE, "before 0.5.23"),
    # vLLM V1: record_function scopes (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1) and the worker's per-step
    # annotation (always on under vLLM's torch profiler)
    EngineName("vllm", "llm_engine step: get_output", _S.SCHED_SCHEDULE, _R.STEP,
               "in-process engine core step: schedule(), the model step, update_from_output(); its "
               "time outside the worker's scopes is the engine core's scheduler"),
    EngineName("vllm", "llm_engine step: process_outputs", _S.SCHED_RESULT, note="output processor, detokenize"),
    EngineName("vllm", "llm_engine step: *", _S.SCHED_RESULT, note="abort_requests, record_stats"),
    EngineName("vllm", "schedule: allocate_slots", _S.PREP_BATCH, note="KV block allocation (part=alloc)"),
    EngineName("vllm", "schedule: *", _S.SCHED_SCHEDULE),
    EngineName("vllm", "gpu_model_runner: preprocess", _S.PREP_BATCH),
    EngineName("vllm", "gpu_model_runner: forward", _S.RUN_EAGER, _R.FORWARD),
    EngineName("vllm", "gpu_model_runner: postprocess", _S.RUN_EAGER, _R.FORWARD, "logits from hidden states"),
    EngineName("vllm", "gpu_model_runner: sample", _S.RUN_SAMPLE, _R.FORWARD, "sampling: device work"),
    EngineName("vllm", "gpu_model_runner: draft", _S.RUN_EAGER, _R.FORWARD, "speculative draft model"),
    EngineName("vllm", "gpu_model_runner: *", _S.SCHED_RESULT,
               note="bookkeep, ModelRunnerOutput, async output: the step's result"),
    EngineName("vllm", "execute_*", _S.RUN_EAGER, _R.EXECUTE,
               "execute_context_N(T)_generation_M(U): the worker's whole model step"),
    EngineName("vllm", "schedule", _S.SCHED_SCHEDULE),
    EngineName("vllm", "update_from_output", _S.SCHED_RESULT),
    EngineName("vllm", "_prepare_inputs", _S.PREP_BATCH),
    EngineName("vllm", "prepare_inputs", _S.PREP_BATCH),
    EngineName("vllm", "sample_tokens", _S.RUN_SAMPLE),
)

#: Engine functions that carry a stage in Python frames (innermost engine frame wins).
ENGINE_FRAMES: tuple[EngineFrame, ...] = (
    # 0.5.23: recv_requests is SchedulerRequestReceiver's (managers/scheduler_components/), the
    # result processing BatchResultProcessor's there too: both under sglang/srt/managers/
    *(EngineFrame("sglang", "sglang/srt/managers/", f, st) for f, st in (
        ("recv_requests", _S.SCHED_RECV), ("process_input_requests", _S.SCHED_RECV),
        ("get_next_batch_to_run", _S.SCHED_SCHEDULE), ("get_new_batch_prefill", _S.SCHED_SCHEDULE),
        ("update_running_batch", _S.SCHED_SCHEDULE), ("process_batch_result", _S.SCHED_RESULT),
        ("process_batch_result_decode", _S.SCHED_RESULT), ("process_batch_result_prefill", _S.SCHED_RESULT),
        ("prepare_for_extend", _S.PREP_BATCH), ("prepare_for_decode", _S.PREP_BATCH))),
    EngineFrame("sglang", "sglang/srt/model_executor/forward_batch_info", "init_new", _S.PREP_BATCH),
    EngineFrame("sglang", "sglang/srt/layers/attention/", "init_forward_metadata", _S.PREP_BATCH),
    # srtscope's reference engine (SGLang-shaped names)
    *(EngineFrame("srtscope", m, f, st) for m in ("engine/scheduler/", "engine/schedule_batch")
      for f, st in (("recv_requests", _S.SCHED_RECV), ("get_next_batch_to_run", _S.SCHED_SCHEDULE),
                    ("get_new_batch_prefill", _S.SCHED_SCHEDULE), ("update_running_batch", _S.SCHED_SCHEDULE),
                    ("process_batch_result", _S.SCHED_RESULT), ("prepare_for_extend", _S.PREP_BATCH),
                    ("prepare_for_decode", _S.PREP_BATCH))),
    EngineFrame("srtscope", "engine/forward_batch", "init_new", _S.PREP_BATCH),
    EngineFrame("srtscope", "engine/attention/", "init_forward_metadata", _S.PREP_BATCH),
    # vLLM V1: the scheduler is vllm/v1/core/sched/, the model runner vllm/v1/worker/
    EngineFrame("vllm", "vllm/v1/core/sched/", "schedule", _S.SCHED_SCHEDULE),
    EngineFrame("vllm", "vllm/v1/core/sched/", "update_from_output", _S.SCHED_RESULT),
    EngineFrame("vllm", "vllm/v1/engine/output_processor", "process_outputs", _S.SCHED_RESULT),
    *(EngineFrame("vllm", "vllm/v1/worker/", f, _S.PREP_BATCH) for f in (
        "_update_states", "_prepare_inputs", "_prepare_input_ids", "_calc_spec_decode_metadata",
        "_build_attention_metadata")),
    EngineFrame("vllm", "vllm/v1/worker/", "sample_tokens", _S.RUN_SAMPLE),
    EngineFrame("vllm", "vllm/v1/worker/", "_bookkeeping_sync", _S.SCHED_RESULT),
)

#: Engine functions called once per engine step, most telling first (a whole engine step, then the
#: model step of a worker process): in a trace with Python frames and none of the engine's step
#: ranges, each top-level call opens a step that runs to the next (steps.py, source ``engine_frames``).
ENGINE_STEP_FRAMES: tuple[EngineFrame, ...] = (
    # in-process engine core (LLM offline, or the engine-core process): schedule, model step, update
    EngineFrame("vllm", "vllm/v1/engine/core", "step", _S.LOOP_STEP),
    EngineFrame("vllm", "vllm/v1/engine/core", "step_with_batch_queue", _S.LOOP_STEP),
    # a worker process (tensor parallel): the model step only, the scheduler runs elsewhere
    EngineFrame("vllm", "vllm/v1/worker/", "execute_model", _S.RUN_EAGER),
    EngineFrame("sglang", "sglang/srt/managers/scheduler", "run_batch", _S.RUN_EAGER),
)


def step_frame(frame: str) -> EngineFrame | None:
    """The ``ENGINE_STEP_FRAMES`` row a Python frame name (``"path/file.py(123): func"``) is, or None."""
    return engine_frame(frame, ENGINE_STEP_FRAMES)


def engine_frame(frame: str, rows: tuple[EngineFrame, ...] = ()) -> EngineFrame | None:
    """The row of ``rows`` (default ``ENGINE_FRAMES``) a Python frame name (``"path/file.py(123):
    func"``) is: its function, under the engine's own module; None for a bare name or no row."""
    path, sep, func = frame.rpartition("): ")
    if not sep:
        return None
    func = func.strip()
    cands = _FRAMES_BY_FUNC.get(func, ()) if not rows else (f for f in rows if f.function == func)
    return next((f for f in cands if f.module in path), None)


_EXACT: dict[str, EngineName] = {e.name: e for e in ENGINE_NAMES if not e.name.endswith("*")}
#: prefixes, longest first: the most specific one decides
_PREFIXES: tuple[EngineName, ...] = tuple(sorted((e for e in ENGINE_NAMES if e.name.endswith("*")),
                                                 key=lambda e: -len(e.name)))

#: Names real engines use for the same stages (exact names; prefixes are in ``ENGINE_NAMES``).
ALIASES: dict[str, Stage] = {n: e.stage for n, e in _EXACT.items()}

#: Bare function name -> stage, for frames that carry no file path.
ENGINE_FUNCTIONS: dict[str, Stage] = {f.function: f.stage for f in ENGINE_FRAMES}


def engine_name(name: str) -> EngineName | None:
    """The ``ENGINE_NAMES`` row a range name matches (exact first, then the longest prefix), or None."""
    if not name:
        return None
    got = _EXACT.get(name)
    if got is not None:
        return got
    for e in _PREFIXES:
        if name.startswith(e.name[:-1]):
            return e
    return None


def name_role(name: str) -> NameRole | None:
    """The role of a range name: our own forward stages are FORWARD, our ``loop.step`` is STEP,
    real engines' names take their table row's role; None for unknown names."""
    own = _BY_NAME.get(name) if name else None
    if own is not None:
        return _OWN_ROLES.get(own, NameRole.STAGE)
    e = engine_name(name)
    return e.role if e is not None else None


def engine_function(frame: str) -> Stage | None:
    """The stage of a Python frame name (``"path/file.py(123): func"`` or a bare ``func``), or None.

    With a path, only the engine's own modules count (``ENGINE_FRAMES``).
    """
    if not frame:
        return None
    if "): " not in frame:
        return ENGINE_FUNCTIONS.get(frame.strip())
    f = engine_frame(frame)
    return f.stage if f is not None else None


_FRAMES_BY_FUNC: dict[str, tuple[EngineFrame, ...]] = {}
for _f in ENGINE_FRAMES:
    _FRAMES_BY_FUNC[_f.function] = _FRAMES_BY_FUNC.get(_f.function, ()) + (_f,)


_BY_NAME: dict[str, Stage] = {s.value: s for s in Stage}
_OWN_ROLES: dict[Stage, NameRole] = {Stage.LOOP_STEP: NameRole.STEP, Stage.RUN_EAGER: NameRole.FORWARD,
                                     Stage.RUN_GRAPH_REPLAY: NameRole.FORWARD,
                                     Stage.RUN_SAMPLE: NameRole.FORWARD,
                                     Stage.COMM_ALL_REDUCE: NameRole.FORWARD}


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
    e = engine_name(name)
    if e is not None:
        return e.stage
    if " " in name:
        return resolve_stage(name.split(" ", 1)[0])
    return None


def forward_engines(names: Sequence[str]) -> set[str]:
    """The engines whose FORWARD ranges are among a trace's range names (``resolve_stages``)."""
    return {e.engine for n in names if n and (e := engine_name(n)) is not None and e.role is NameRole.FORWARD}


def resolve_stages(names: Sequence[str], forward: set[str] | None = None) -> list[Stage | None]:
    """``resolve_stage`` of each of a trace's distinct range names, in that trace: where it holds an
    engine's FORWARD ranges (SGLang 0.5.23's ``step[...]``), that engine's EXECUTE ranges that declare
    ``around_forward`` take that stage (their time outside the forward: SGLang's ``run_batch`` is
    the ``ForwardBatch`` build there, not the model's work). ``forward``: those engines, when the
    names are a part of the trace's (a window's: ``forward_engines`` of the whole trace)."""
    stages = [resolve_stage(n) for n in names]
    rows = [engine_name(n) if n else None for n in names]
    if forward is None:
        forward = {e.engine for e in rows if e is not None and e.role is NameRole.FORWARD}
    if not forward:
        return stages
    return [e.around_forward if e is not None and e.around_forward is not None and e.engine in forward else st
            for st, e in zip(stages, rows)]


def stage_class(name: str) -> StageClass | None:
    """The bottleneck class of a range name, or None when the name is not a known stage."""
    stage = resolve_stage(name)
    return None if stage is None else stage.cls
