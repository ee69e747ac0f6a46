"""The stage taxonomy: classes, aliases of real engines, message encoding."""
import pytest

from srtscope.probes.stages import ALIASES, Stage, StageClass, format_message, parse_message, resolve_stage, stage_class


@pytest.mark.parametrize("name, stage, cls", [
    ("loop.step", Stage.LOOP_STEP, StageClass.CONTAINER),
    ("sched.recv", Stage.SCHED_RECV, StageClass.SCHEDULER),
    ("sched.schedule", Stage.SCHED_SCHEDULE, StageClass.SCHEDULER),
    ("prep.batch", Stage.PREP_BATCH, StageClass.PREP),
    ("run.graph_replay", Stage.RUN_GRAPH_REPLAY, StageClass.KERNEL),
    ("run.eager", Stage.RUN_EAGER, StageClass.KERNEL),
    ("comm.all_reduce", Stage.COMM_ALL_REDUCE, StageClass.KERNEL),
    ("run.sample", Stage.RUN_SAMPLE, StageClass.KERNEL),
    ("sched.result", Stage.SCHED_RESULT, StageClass.SCHEDULER),
    ("sync.wait", Stage.SYNC_WAIT, StageClass.SYNC),
    # SGLang's scheduler ranges (0.5.23: record_function always, NVTX with SGLANG_ENABLE_NVTX_SCHEDULER=1)
    ("scheduler.recv_requests", Stage.SCHED_RECV, StageClass.SCHEDULER),
    ("scheduler.process_input_requests", Stage.SCHED_RECV, StageClass.SCHEDULER),
    ("scheduler.get_next_batch_to_run", Stage.SCHED_SCHEDULE, StageClass.SCHEDULER),
    ("scheduler.run_batch", Stage.RUN_EAGER, StageClass.KERNEL),
    ("scheduler.process_batch_result", Stage.SCHED_RESULT, StageClass.SCHEDULER),
    # full NVTX messages with attributes resolve by their leading name
    ("sched.schedule bs=32 step=4", Stage.SCHED_SCHEDULE, StageClass.SCHEDULER),
])
def test_names_and_aliases_resolve(name, stage, cls):
    assert resolve_stage(name) is stage
    assert stage_class(name) is cls


@pytest.mark.parametrize("name", ["", "cudaLaunchKernel", "loop", "sched", "Step 1 to 10", "ncclAllReduce"])
def test_unknown_names_are_none(name):
    assert resolve_stage(name) is None
    assert stage_class(name) is None


def test_every_stage_has_class_and_description():
    for s in Stage:
        assert isinstance(s.cls, StageClass)
        assert s.description
    assert all(isinstance(v, Stage) for v in ALIASES.values())


@pytest.mark.parametrize("name, attrs", [
    ("loop.step", {"step": 3, "mode": "decode", "bs": 8, "tokens": 8}),
    ("run.eager", {"reason": "bs_over_max"}),
    ("sync.wait", {}),
])
def test_message_round_trip(name, attrs):
    msg = format_message(name, attrs)
    got_name, got_attrs = parse_message(msg)
    assert got_name == name
    assert got_attrs == {k: str(v) for k, v in attrs.items()}


def test_message_values_with_spaces_stay_one_token():
    name, attrs = parse_message(format_message("run.eager", {"reason": "no cuda here"}))
    assert (name, attrs) == ("run.eager", {"reason": "no_cuda_here"})


def test_run_batch_is_prep_around_sglangs_forward_span_only():
    from srtscope.probes.stages import resolve_stages

    # SGLang 0.5.23: step[...] is the forward, run_batch's time outside it the ForwardBatch build
    assert resolve_stages(["scheduler.run_batch", "step[DECODE", "scheduler.get_next_batch_to_run"]) == \
        [Stage.PREP_BATCH, Stage.RUN_EAGER, Stage.SCHED_SCHEDULE]
    # without a forward span of SGLang's (older versions, or vLLM's forward only), it is the model step
    assert resolve_stages(["scheduler.run_batch", "scheduler.get_next_batch_to_run"]) == \
        [Stage.RUN_EAGER, Stage.SCHED_SCHEDULE]
    assert resolve_stages(["scheduler.run_batch", "gpu_model_runner: forward"])[0] is Stage.RUN_EAGER
