"""Real engines' names (vLLM, SGLang) mapped onto the stage taxonomy: the one declared table."""
import pytest

from srtscope.probes.stages import (
    ENGINE_FRAMES,
    ENGINE_NAMES,
    NameRole,
    Stage,
    StageClass,
    engine_function,
    engine_name,
    name_role,
    resolve_stage,
)

S, R = Stage, NameRole


@pytest.mark.parametrize("name, stage, role", [
    # vLLM V1 (0.32): VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 scopes and the worker's per-step annotation
    ("llm_engine step: get_output", S.SCHED_SCHEDULE, R.STEP),          # in-process engine core step
    ("llm_engine step: process_outputs", S.SCHED_RESULT, R.STAGE),
    ("llm_engine step: abort_requests", S.SCHED_RESULT, R.STAGE),        # by the prefix row
    ("llm_engine step: record_stats", S.SCHED_RESULT, R.STAGE),
    ("schedule: allocate_slots", S.PREP_BATCH, R.STAGE),                 # KV slot allocation is prep
    ("schedule: make_cached_request_data", S.SCHED_SCHEDULE, R.STAGE),
    ("schedule: update_after_schedule", S.SCHED_SCHEDULE, R.STAGE),
    ("gpu_model_runner: preprocess", S.PREP_BATCH, R.STAGE),
    ("gpu_model_runner: forward", S.RUN_EAGER, R.FORWARD),
    ("gpu_model_runner: postprocess", S.RUN_EAGER, R.FORWARD),
    ("gpu_model_runner: sample", S.RUN_SAMPLE, R.FORWARD),
    ("gpu_model_runner: bookkeep", S.SCHED_RESULT, R.STAGE),
    ("gpu_model_runner: ModelRunnerOutput", S.SCHED_RESULT, R.STAGE),
    ("execute_context_0(0)_generation_4(4)", S.RUN_EAGER, R.EXECUTE),
    ("execute_context_1(96)_generation_3(3)", S.RUN_EAGER, R.EXECUTE),
    ("execute_model", S.RUN_EAGER, R.EXECUTE),
    # SGLang 0.5.23 (record_function under its profiler; NVTX too with SGLANG_ENABLE_NVTX_SCHEDULER=1)
    ("scheduler.recv_requests", S.SCHED_RECV, R.STEP),
    ("scheduler.process_input_requests", S.SCHED_RECV, R.STAGE),
    ("scheduler.get_next_batch_to_run", S.SCHED_SCHEDULE, R.STAGE),
    # the whole model step; outside its step[...] forward span, prep (test_stages: resolve_stages)
    ("scheduler.run_batch", S.RUN_EAGER, R.EXECUTE),
    ("step[DECODE", S.RUN_EAGER, R.FORWARD),        # "step[DECODE bs=8]" as the label splits
    ("step[EXTEND bs=8 toks=192]", S.RUN_EAGER, R.FORWARD),
    # SGLang before 0.5.23
    ("scheduler.launch_batch_sample_if_needed", S.RUN_SAMPLE, R.STAGE),
    ("scheduler.process_batch_result", S.SCHED_RESULT, R.STAGE),
    ("scheduler.prepare_mlp_sync_batch", S.SCHED_SCHEDULE, R.STAGE),
    ("scheduler.disagg_decode.get_next_batch", S.SCHED_SCHEDULE, R.STAGE),
    ("cuda_graph_runner.replay_prepare", S.PREP_BATCH, R.STAGE),
    ("cuda_graph_runner.replay", S.RUN_GRAPH_REPLAY, R.FORWARD),
    ("tp_worker.batch_init_new", S.PREP_BATCH, R.STAGE),
    # ours
    ("loop.step", S.LOOP_STEP, R.STEP),
    ("run.eager", S.RUN_EAGER, R.FORWARD),
    ("sched.schedule", S.SCHED_SCHEDULE, R.STAGE),
])
def test_engine_names_map_onto_stages(name, stage, role):
    assert resolve_stage(name) is stage
    assert name_role(name) is role


@pytest.mark.parametrize("name", [
    "schedule",                 # vLLM's function name as a range: mapped, but not by a prefix row
    "eplb: schedule migration batches", "scheduler", "gpu_model_runner", "llm_engine", "executor",
    "scheduler.disagg_decode.event_loop_normal",    # a whole loop, not a step's stage
])
def test_near_misses_do_not_match_a_prefix(name):
    e = engine_name(name)
    assert e is None or not e.name.endswith("*")


def test_the_most_specific_row_decides():
    assert engine_name("schedule: allocate_slots").stage is S.PREP_BATCH          # exact beats "schedule: *"
    assert engine_name("llm_engine step: get_output").role is R.STEP              # exact beats the prefix
    assert engine_name("gpu_model_runner: draft").role is R.FORWARD


def test_table_rows_are_well_formed():
    seen = set()
    for e in ENGINE_NAMES:
        assert e.engine in ("vllm", "sglang") and isinstance(e.stage, Stage) and isinstance(e.role, NameRole)
        assert e.name not in seen, f"duplicate row {e.name}"
        seen.add(e.name)
        assert e.stage.cls is not StageClass.CONTAINER
    assert all(f.module and f.function for f in ENGINE_FRAMES)


@pytest.mark.parametrize("frame, stage", [
    # vLLM: the scheduler is vllm/v1/core/sched/..., not any function called schedule
    ("vllm/v1/core/sched/scheduler.py(591): schedule", S.SCHED_SCHEDULE),
    ("site-packages/vllm/v1/core/sched/scheduler.py(2026): update_from_output", S.SCHED_RESULT),
    ("vllm/v1/worker/gpu_model_runner.py(1920): _prepare_inputs", S.PREP_BATCH),
    ("vllm/v1/worker/gpu_model_runner.py(1172): _update_states", S.PREP_BATCH),
    ("vllm/v1/worker/gpu_model_runner.py(3468): _bookkeeping_sync", S.SCHED_RESULT),
    ("vllm/v1/engine/output_processor.py(681): process_outputs", S.SCHED_RESULT),
    ("vllm/v1/attention/backends/flash_attn.py(512): schedule", None),      # FlashAttention's scheduler
    ("vllm/vllm_flash_attn/flash_attn_interface.py(77): schedule", None),
    ("vllm/distributed/eplb/rebalance_execute.py(200): schedule", None),
    ("mylib/scheduler.py(10): schedule", None),
    # SGLang
    ("sglang/srt/managers/scheduler.py(1032): recv_requests", S.SCHED_RECV),
    ("sglang/srt/managers/scheduler.py(1410): get_next_batch_to_run", S.SCHED_SCHEDULE),
    ("sglang/srt/managers/schedule_batch.py(900): prepare_for_decode", S.PREP_BATCH),
    ("sglang/srt/model_executor/forward_batch_info.py(300): init_new", S.PREP_BATCH),
    ("sglang/srt/layers/attention/flashinfer_backend.py(200): init_forward_metadata", S.PREP_BATCH),
    ("sglang/srt/layers/moe/router.py(20): recv_requests", None),
    # ours
    ("srtscope/engine/scheduler/scheduler.py(100): get_next_batch_to_run", S.SCHED_SCHEDULE),
    ("engine/schedule_batch.py(50): prepare_for_extend", S.PREP_BATCH),
    # a bare function name (no file): the name alone
    ("get_next_batch_to_run", S.SCHED_SCHEDULE),
    ("", None),
])
def test_engine_frames_match_on_the_engines_own_modules(frame, stage):
    assert engine_function(frame) is stage
