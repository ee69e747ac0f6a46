"""Steps: loop.step / SGLang ranges / no-NVTX fallbacks, and what each step ran."""
import pytest

from srtscope.analyzers.analyses.steps import StepRule, find_steps
from srtscope.analyzers.model.timeline import GPU_DOMAIN
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000


def test_loop_step_ranges_with_attrs_and_exec():
    tl = timeline(
        [kernel(110, 150, corr=1, graph_id=3), kernel(150, 190, corr=1, graph_id=3),   # step 0: graph
         kernel(310, 320, corr=2), kernel(330, 340, corr=3)],                          # step 1: eager
        [api(100, 108, "cudaGraphLaunch", corr=1), api(300, 305, corr=2), api(320, 325, corr=3)],
        [rng(0, 200, "loop.step", step=7, mode="decode", bs="16"),        # attrs as strings (NVTX)
         rng(100, 195, "run.graph_replay", bs=16, padded_bs=16),
         rng(200, 400, "loop.step", step=8, mode="decode", bs=96),
         rng(290, 345, "run.eager", reason="bs_over_max")])
    source, t = find_steps(tl)
    assert source == "loop.step"
    assert t["step"].tolist() == [7, 8] and t["bs"].tolist() == [16, 96]
    assert t["exec"].tolist() == ["graph", "eager"]
    assert t["reason"].tolist() == ["", "bs_over_max"]
    assert t["graph_launches"].tolist() == [1, 0] and t["launches"].tolist() == [0, 2]
    assert t["graph_kernels"].tolist() == [2, 0]
    assert t["busy_ns"].tolist() == [80 * US, 20 * US]
    assert t["padded_bs"].tolist() == [16, -1]
    assert t["wall_ns"].tolist() == [200 * US, 200 * US]


def test_gpu_projections_of_annotations_are_not_host_steps():
    # scenario: a torch-profiler trace of our engine: Kineto repeats each record_function that
    # launched GPU work as a gpu_user_annotation on the stream (domain GPU_DOMAIN, pid = device)
    host = [rng(0, 200, "loop.step", step=0, mode="decode"), rng(100, 195, "run.eager"),
            rng(200, 400, "loop.step", step=1, mode="decode"), rng(290, 345, "run.eager")]
    gpu = [rng(110, 190, "loop.step", pid=0, tid=7, domain=GPU_DOMAIN, step=0, mode="decode"),
           rng(110, 190, "run.eager", pid=0, tid=7, domain=GPU_DOMAIN),
           rng(310, 340, "loop.step", pid=0, tid=7, domain=GPU_DOMAIN, step=1, mode="decode"),
           rng(310, 340, "run.eager", pid=0, tid=7, domain=GPU_DOMAIN)]
    tl = timeline([kernel(110, 190, corr=1), kernel(310, 340, corr=2)],
                  [api(100, 105, corr=1), api(300, 305, corr=2)], host + gpu)
    assert len(tl.host_ranges) == 4 and len(tl.ranges) == 8
    source, t = find_steps(tl)
    assert source == "loop.step" and t["step"].tolist() == [0, 1]
    assert t["tid"].tolist() == [1, 1]


def test_forward_outliving_its_step_does_not_make_the_next_step_eager():
    # scenario: overlap loop: step 0's graph replay runs on the device into step 1's window; step 1
    # launches nothing (the scheduler ran ahead), so it is idle, not an eager step without a reason
    tl = timeline([kernel(90, 260, corr=1, graph_id=2), kernel(260, 300, corr=1, graph_id=2)],
                  [api(80, 88, "cudaGraphLaunch", corr=1, tid=2)],
                  [rng(0, 200, "loop.step", step=0, mode="decode"), rng(200, 400, "loop.step", step=1,
                                                                        mode="decode"),
                   rng(78, 90, "run.graph_replay", tid=2, bs=8, padded_bs=8)])
    _, t = find_steps(tl)
    assert t["exec"].tolist() == ["graph", "idle"] and t["busy_ns"].tolist() == [110 * US, 100 * US]


def test_an_apps_own_nvtx_domain_named_gpu_is_host_activity():
    # scenario: an nsys trace whose app happens to name its NVTX domain "gpu": still host ranges
    tl = timeline([kernel(10, 20)], [], [rng(0, 100, "loop.step", domain="gpu", step=0)])
    assert len(tl.host_ranges) == 1
    assert find_steps(tl)[0] == "loop.step"


def test_sglang_scheduler_ranges_start_steps():
    # scenario: SGLang trace: no loop.step; a step starts at each top-level get_next_batch_to_run
    tl = timeline([kernel(50, 90)], [], [
        rng(0, 40, "scheduler.get_next_batch_to_run"), rng(5, 20, "scheduler.get_new_batch_prefill"),
        rng(40, 100, "scheduler.run_batch"), rng(100, 120, "scheduler.process_batch_result"),
        rng(120, 150, "scheduler.get_next_batch_to_run"), rng(150, 210, "scheduler.run_batch")])
    source, t = find_steps(tl)
    assert source == "sglang"
    assert t[["start_ns", "end_ns"]].values.tolist() == [[0, 120 * US], [120 * US, 210 * US]]
    assert t["exec"].tolist() == ["eager", "eager"]          # run_batch ranges (alias of run.eager)


def test_instrumented_sglang_steps_take_the_forwards_mode():
    # scenario: `capture --instrument sglang` (probe or torch backend): no loop.step, no step[...] range;
    # each turn's sched.schedule (get_next_batch_to_run) opens a step, and the forward's run.eager
    # (ModelRunner.forward) opens with the batch's forward mode and size; a forward that could not
    # tell leaves its step's mode blank, and a turn with no forward is no step
    tl = timeline([], [], [
        rng(0, 30, "sched.schedule"), rng(40, 100, "run.eager", mode="extend", bs=8),
        rng(120, 150, "sched.schedule"), rng(130, 140, "prep.batch", part="alloc", mode="decode"),
        rng(160, 200, "run.eager", mode="decode", bs=8),
        rng(220, 240, "sched.schedule"), rng(250, 300, "run.eager"),
        rng(320, 330, "sched.schedule")])
    source, t = find_steps(tl)
    assert source == "sglang" and t["mode"].tolist() == ["extend", "decode", ""]
    assert t["start_ns"].tolist() == [0, 120 * US, 220 * US] and t["bs"].tolist() == [8, 8, -1]


def test_no_nvtx_sync_points_then_bursts():
    # scenario: no NVTX; the launching thread synchronises once per step
    apis = []
    for s in (0, 1000, 2000):
        apis += [api(s + 10 * i, s + 10 * i + 4, corr=s + i) for i in range(3)]
        apis.append(api(s + 100, s + 900, "cudaStreamSynchronize"))
    source, t = find_steps(timeline([kernel(5, 50)], apis))
    assert source == "sync" and len(t) == 3
    assert t["launches"].tolist() == [3, 3, 3]
    # scenario: no NVTX, no syncs: launch groups apart by more than the step gap
    apis = [api(s + 10 * i, s + 10 * i + 4, corr=s + i) for s in (0, 1000, 2000) for i in range(3)]
    source, t = find_steps(timeline([kernel(5, 50)], apis), StepRule(gap_ns=500 * US))
    assert source == "bursts" and t["start_ns"].tolist() == [0, 1000 * US, 2000 * US]
    source, t = find_steps(timeline([kernel(5, 50)], apis), StepRule(gap_ns=5000 * US))
    assert len(t) == 1


def test_no_steps_without_ranges_or_api():
    source, t = find_steps(timeline([kernel(0, 10)]))
    assert source == "none" and len(t) == 0


def test_step_rule_validation():
    with pytest.raises(ValueError, match="step gap"):
        StepRule(gap_ns=0)
