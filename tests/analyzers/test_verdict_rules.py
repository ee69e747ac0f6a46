"""The verdict's rules on traces nobody tuned for: warm-up by evidence, not slowness; a step holds all
of its time; a clean loop is not accused; a negligible what-if decides nothing; multi-rank figures
per rank-step. Each tiny timeline says which rule it exists for."""
import numpy as np
import pytest

from srtscope.analyzers.analyses.losses import warmup_mask
from srtscope.analyzers.diagnose import diagnose
from tests.analyzers._tl import api, kernel, rng, timeline
from tests.analyzers.test_whatif import straggler_pair

US = 1000


def engine_loop(host_us, kernel_us=1000, stage="sched.schedule", extra=()):
    """Steps of our engine: ``host_us[i]`` of ``stage`` with the device idle, then one kernel of
    ``kernel_us``; ``extra``: (stage, µs) pairs each step before that (a second cause)."""
    dev, apis, rgs = [], [], []
    t = 0
    for i, h in enumerate(host_us):
        t0 = t
        for name, us in extra:
            rgs.append(rng(t, t + us, name))
            t += us
        rgs.append(rng(t, t + h, stage))
        t += h
        apis.append(api(t - 2, t - 1, corr=i + 1))
        dev.append(kernel(t, t + kernel_us, corr=i + 1))
        t += kernel_us
        rgs.append(rng(t0, t, "loop.step", step=i, mode="decode", bs=8))
    return timeline(dev, apis, rgs)


def _sched(d):
    return {w.cause: w for w in d.what_if}["sched_cpu"]


# rule: warm-up by evidence. A slowness that recurs is a cause, never warm-up; the slow steps a run
# starts with, never seen again, are; so are slow early steps made of start-up calls.
WARMUP = {
    # one slow first step, never again: warm-up (left out of the mean step and the what-if)
    "first_step_only": ([20_000] + [300] * 7, 1),
    # 20 ms stalls every 4th step from the first: intermittent, not warm-up (all 8 steps kept)
    "intermittent_from_step_0": ([20_000, 300, 300, 300] * 2, 0),
    # two slow steps at the start, never again: both warm-up
    "two_first_steps": ([20_000, 15_000] + [300] * 6, 2),
    # a slow step in the middle only: not the first steps, not warm-up
    "one_stall_later": ([300] * 3 + [20_000] + [300] * 4, 0),
}


@pytest.mark.parametrize("case", sorted(WARMUP))
def test_warm_up_is_decided_by_evidence_not_slowness(case):
    host, n_warm = WARMUP[case]
    d = diagnose(engine_loop(host))
    w = _sched(d)
    assert w.warmup_steps == n_warm
    kept = host[n_warm:]
    assert w.step_ns_before == pytest.approx((sum(kept) / len(kept) + 1000) * US, abs=1)
    assert w.saved_ns == pytest.approx(sum(kept) / len(kept) * US, abs=1)     # the stalls are given back
    assert any(c.startswith("warmup_steps") for c in d.verdict.caveats) == bool(n_warm)


def test_a_slow_early_step_of_start_up_calls_is_warm_up_even_when_slowness_recurs():
    """Step 1 spends 20 ms in cudaMalloc (start-up work); steps 0 and 5 stall 20 ms in the scheduler:
    the allocation step is warm-up, the scheduler stalls are not."""
    import pandas as pd
    walls = [21, 1.3, 21, 1.3, 1.3, 21, 1.3, 1.3]
    steps = pd.DataFrame({"rank": 0, "start_ns": np.cumsum([0] + walls[:-1]).astype(np.int64) * 1000,
                          "wall_ns": (np.array(walls) * 1e6).astype(np.int64)})
    cold = np.zeros(len(walls), np.int64)
    cold[2] = 20_000_000              # the step made slow by start-up calls
    assert warmup_mask(steps, cold).tolist() == [i == 2 for i in range(len(walls))]
    assert not warmup_mask(steps).any()


# rule: a clean loop is never accused. No cause holding 15% of the step and twice the next is a
# bottleneck: the verdict says none dominates (healthy); one that does is named.
SPREAD = {
    # 1.0 ms scheduling + 0.8 ms preparation in a 10.8 ms step: clean
    "clean_two_small_stages": ([1000] * 8, [("prep.batch", 800)], 9000, None),
    # 3 ms scheduling + 0.5 ms preparation in a 12.5 ms step: 24% of the step, named
    "scheduler_share": ([3000] * 8, [("prep.batch", 500)], 9000, "sched_cpu"),
    # 1.2 ms scheduling + 0.2 ms preparation in a 10.4 ms step: 12%, but 6x the next: named
    "scheduler_ratio": ([1200] * 8, [("prep.batch", 200)], 9000, "sched_cpu"),
}


@pytest.mark.parametrize("case", sorted(SPREAD))
def test_a_clean_loop_is_not_accused(case):
    host, extra, kernel_us, named = SPREAD[case]
    v = diagnose(engine_loop(host, kernel_us, extra=extra)).verdict
    if named is None:
        assert v.healthy and v.cause == "compute"
        assert v.summary.startswith("no dominant bottleneck: the largest cause, sched_cpu, loses 1.00 ms")
        assert v.headline == "no dominant bottleneck"
    else:
        assert not v.healthy and v.cause == named, v.summary


def test_a_step_holds_its_host_time_before_the_first_kernel():
    """rule: healthy means the step. One 382 ms step: 217 ms of host preprocessing before the first
    kernel, then 160 ms of kernels back to back (device busy ~100% of its own window)."""
    dev = [kernel(217_000 + 10_000 * k, 217_000 + 10_000 * (k + 1), corr=k + 1) for k in range(16)]
    apis = [api(216_000 + 10 * k, 216_000 + 10 * k + 5, corr=k + 1) for k in range(16)]
    rgs = [rng(0, 382_000, "ProfilerStep#1", domain="torch")]
    v = diagnose(timeline(dev, apis, rgs)).verdict
    assert not v.healthy
    assert v.causes_ns["host_unattributed"] >= 216_000 * US


@pytest.mark.parametrize("late", [[100, 100, 100], [120, 80, 100, 100], [-20, 20, 20, 150]])
def test_multi_rank_what_ifs_never_save_more_than_a_rank_lost(late):
    """rule: per rank-step figures. Two ranks in lockstep; every what-if row gives back no more than
    the cause lost, in the mean and on every rank's row."""
    d = diagnose(straggler_pair(len(late), kernels=[(200, 200 + x) for x in late]))
    assert d.what_if
    rows = len(d.steps.table)
    for w in d.what_if:
        assert w.saved_ns <= w.lost_ns, w
        # ... and no more than the verdict's lost time per rank-step (bubbles outside steps included).
        # NOTE: the straggler's lead is counted once in the verdict but is every rank's step's wait
        if w.cause != "straggler":
            assert w.saved_ns <= d.verdict.causes_ns[w.cause] / rows + 1, w
        assert w.step_ns_after == w.step_ns_before - w.saved_ns


def training_loop(iterations, marker=None, frame=None):
    """rule: steps from the program's rhythm. Each 10 ms iteration: a DataLoader next (1 ms of host),
    then three bursts of kernels separated by 500 µs host gaps (forward, backward, optimizer):
    launch bursts alone would make three steps of each iteration. ``marker``: the per-iteration
    range name recorded (torch's record_function); ``frame``: an engine's once-a-step Python frame."""
    from srtscope.analyzers.model.timeline import PYTHON_DOMAIN
    dev, apis, rgs = [], [], []
    c = 0
    for i in range(iterations):
        t = 10_000 * i
        if marker:
            rgs.append(rng(t, t + 1000, marker, domain="torch"))
        if frame:
            rgs.append(rng(t, t + 9800, frame, domain=PYTHON_DOMAIN))
        for b in range(3):
            k0 = t + 1000 + b * 3000
            for j in range(5):
                c += 1
                apis.append(api(k0 + 500 * j / 5, k0 + 500 * j / 5 + 5, corr=c))
                dev.append(kernel(k0 + 10 + 500 * j, k0 + 10 + 500 * (j + 1), corr=c))
    return timeline(dev, apis, rgs)


@pytest.mark.parametrize("marker, frame, source", [
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", None, "iteration"),
    ("Optimizer.step#SGD.step", None, "iteration"),
    (None, "vllm/v1/engine/core.py(657): step", "engine_frames"),
    (None, "vllm/v1/worker/gpu_model_runner.py(3939): execute_model", "engine_frames"),
    (None, "sglang/srt/managers/scheduler.py(2101): run_batch", "engine_frames"),
])
def test_steps_come_from_the_programs_own_rhythm(marker, frame, source):
    d = diagnose(training_loop(8, marker, frame))
    assert (d.steps.source, d.steps.count) == (source, 8)
    # the launch bursts alone split each iteration in three
    assert diagnose(training_loop(8)).steps.count > 8


def test_a_frame_of_another_package_opens_no_step():
    """``step`` in a module that is not the engine's (an optimizer, a scheduler of learning rates)."""
    d = diagnose(training_loop(8, frame="torch/optim/lr_scheduler.py(180): step"))
    assert d.steps.source not in ("engine_frames", "iteration")
