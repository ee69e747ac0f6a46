"""What-if: the mean step time predicted with one cause removed or shrunk.

Hand-built timelines with exact figures (serial loop, overlap loop, a straggler at two ranks), and
the labelled scenarios of ``sample_traces.generate``: removing the injected cause predicts the mean
step time of the same scenario simulated without it (the generator knows both).
"""
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sample_traces import generate
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _by_cause(d):
    return {w.cause: w for w in d.what_if}


def serial_loop(n=3):
    """Normal loop, 1000 µs steps: schedule 300 µs, prep 100 µs (device idle), then a 400 µs kernel
    and 200 µs of host model code after it (device idle)."""
    dev, apis, rgs = [], [], []
    for i in range(n):
        t = 1000 * i
        rgs += [rng(t, t + 1000, "loop.step", step=i, mode="decode", bs=8),
                rng(t, t + 300, "sched.schedule"), rng(t + 300, t + 400, "prep.batch"),
                rng(t + 400, t + 1000, "run.eager")]
        dev.append(kernel(t + 400, t + 800, corr=i + 1))
        apis.append(api(t + 395, t + 398, corr=i + 1))
    return timeline(dev, apis, rgs)


def test_serial_loop_removes_each_host_cause_one_for_one():
    d = diagnose(serial_loop())
    w = _by_cause(d)
    # every step gives back its 300 µs of scheduling (the first step's lies before the device's
    # first kernel: outside the bubbles, still in the step)
    s = w["sched_cpu"]
    assert (s.step_ns_before, s.saved_ns, s.step_ns_after, s.steps) == (1000 * US, 300 * US, 700 * US, 3)
    assert s.speedup == pytest.approx(1000 / 700)
    assert s.cls == "scheduler" and any("serial loop" in a for a in s.assumptions)
    assert (w["batch_prep"].saved_ns, w["batch_prep"].step_ns_after) == (100 * US, 900 * US)
    # host model code after the kernel: a bubble in steps 0 and 1; after the last kernel, step 2's
    # tail is outside the device's window and no launch what-if claims it
    assert w["launch_bound"].saved_ns == round(2 * 200 * US / 3)
    assert [x.cause for x in d.what_if] == ["sched_cpu", "launch_bound", "batch_prep"]
    assert "compute" not in w


def test_shrinking_a_cause_saves_at_most_the_cut():
    w = _by_cause(diagnose(serial_loop(), shrink_ns={"sched_cpu": 120 * US}))
    assert (w["sched_cpu"].saved_ns, w["sched_cpu"].step_ns_after) == (120 * US, 880 * US)
    assert any("cut by 120 us" in a or "cut by 120 µs" in a for a in w["sched_cpu"].assumptions)
    assert w["batch_prep"].saved_ns == 100 * US            # the others are removed as before
    with pytest.raises(ValueError, match="only host causes"):
        diagnose(serial_loop(), shrink_ns={"straggler": 1})


def overlap_loop(n=4):
    """Overlap loop, 510 µs steps on the loop thread (tid 1): schedule 500 µs, then the forward
    thread (tid 2) launches a 300 µs kernel that runs while the loop thread schedules the next step."""
    dev, apis, rgs = [], [], []
    for i in range(n):
        t = 510 * i
        rgs += [rng(t, t + 510, "loop.step", step=i, mode="decode", bs=8), rng(t, t + 500, "sched.schedule"),
                rng(t + 500, t + 510, "run.eager", tid=2)]
        apis.append(api(t + 500, t + 505, corr=i + 1, tid=2))
        dev.append(kernel(t + 510, t + 810, corr=i + 1))
    return timeline(dev, apis, rgs)


def test_overlap_loop_does_not_promise_hidden_host_time_twice():
    d = diagnose(overlap_loop())
    s = _by_cause(d)["sched_cpu"]
    # steps 1-3: of the 500 µs of scheduling, 300 µs hide behind the previous kernel; the device
    # waits 200 µs for it. Step 0 has no kernel before it: all 500 µs are waited for.
    assert s.step_ns_before == 510 * US
    assert s.saved_ns == (500 + 3 * 200) * US // 4
    assert s.step_ns_after == 510 * US - s.saved_ns
    assert any("overlap loop" in a for a in s.assumptions)
    # cutting 100 µs of scheduling per step: the host chain still leads, every step gains 100 µs
    s = _by_cause(diagnose(overlap_loop(), shrink_ns={"sched_cpu": 100 * US}))["sched_cpu"]
    assert (s.saved_ns, s.step_ns_after) == (100 * US, 410 * US)


def straggler_pair(n=3, kernels=None):
    """Two ranks, 500 µs steps: a kernel (200 µs on rank 0, 300 µs on rank 1; ``kernels``: per step,
    (rank 0's, rank 1's)), an all-reduce that ends at 400 µs, then 100 µs of scheduling with the
    device idle."""
    dev, apis, rgs = [], [], []
    for i in range(n):
        t = 500 * i
        for r, k in enumerate(kernels[i] if kernels else (200, 300)):
            c = 10 * i + 1
            dev += [kernel(t, t + k, rank=r, device=r, corr=c), kernel(t + k, t + 400, NCCL, rank=r, device=r,
                                                                       stream=13, corr=c + 1)]
            apis += [api(t - 3, t - 1, corr=c, rank=r), api(t - 1, t, corr=c + 1, rank=r)]
            rgs += [rng(t, t + 500, "loop.step", step=i, mode="decode", bs=8, rank=r),
                    rng(t + 400, t + 500, "sched.schedule", rank=r)]
    return timeline(dev, apis, rgs, ranks=(0, 1))


def test_straggler_removed_every_rank_stops_waiting():
    d = diagnose(straggler_pair())
    assert d.comm.straggler_rank == 1
    w = _by_cause(d)
    st = w["straggler"]
    assert (st.step_ns_before, st.saved_ns, st.step_ns_after, st.steps) == (500 * US, 100 * US, 400 * US, 6)
    assert any("lockstep" in a for a in st.assumptions)
    # exposed collective time beyond the wait: rank 0's 100 µs of transfer (rank 1's exposed all-reduce
    # is all the straggler's wait). Per rank-step no rank gives back more than it lost (100 and 0 µs: 50
    # a rank-step, never the lost time exceeded); the job step (lockstep) gains rank 0's 100 µs, stated
    ec = w["exposed_comm"]
    assert (ec.saved_ns, ec.lost_ns) == (50 * US, 50 * US)
    assert any("a job step (all ranks) would take 100 us less" in a for a in ec.assumptions), ec.assumptions
    assert w["sched_cpu"].saved_ns == 100 * US


# rank 1's lateness per step (µs, < 0: rank 0 arrived last) -> what each step gives back (µs) once the
# straggler arrives with the others: its lead less its natural jitter, the mirror of its early side
# (mean of max(median - lateness, 0) per collective)
STRAGGLERS = {
    # steady: 100 µs late, jitter +-20 (natural 5 µs per collective)
    "steady_with_jitter": ([120, 80, 100, 100], [115, 75, 95, 95]),
    # steady, but rank 0 was 20 µs late once (120 µs earlier than rank 1's usual: natural 30 µs)
    "steady_once_early": ([100, 100, 100, -20], [70, 70, 70, 0]),
    # +-20 µs of noise and one 150 µs pause: the pause comes back, not the noise (natural 10 µs)
    "occasional_pause": ([-20, 20, 20, 150], [0, 10, 10, 140]),
}


@pytest.mark.parametrize("case", sorted(STRAGGLERS))
def test_straggler_removed_leaves_its_natural_jitter(case):
    """Steps of 500 µs at two ranks; rank 0's kernel takes 200 µs, rank 1's 200 + its lateness."""
    late, back = STRAGGLERS[case]
    d = diagnose(straggler_pair(len(late), kernels=[(200, 200 + x) for x in late]))
    assert d.comm.straggler_rank == 1
    st = _by_cause(d)["straggler"]
    got = [int(x) for x in st.per_step_ns]
    step = d.steps.table["step"].to_numpy()
    # lockstep: both ranks' copies of a step give back the same
    assert [got[i] for i in np.argsort(step, kind="stable")] == [b * US for b in back for _ in range(2)]
    assert st.saved_ns == sum(back) * US // len(late)
    assert any("natural skew" in a for a in st.assumptions)
    # where time went: the straggler's own lead; the rest of the skew (rank 0 late) is exposed comm
    assert d.verdict.causes_ns["straggler"] == sum(max(x, 0) for x in late) * US
    assert d.comm.skew_ns == sum(abs(x) for x in late) * US


def test_ranks_late_in_turn_name_no_straggler():
    """Noise alone: rank 1 last 3 times in 5, by 20 µs, rank 0 the other 2. Its excess over its jitter
    (60 µs of lead less 5 x 16 µs) is not half of the 100 µs of skew: no straggler, no straggler
    what-if, and the waits stay exposed communication (before: rank 1 named, all skew blamed on it)."""
    d = diagnose(straggler_pair(5, kernels=[(200, 200 + x) for x in (20, -20, 20, 20, -20)]))
    assert d.comm.skew_ns == 100 * US
    assert (d.comm.straggler_rank, d.comm.straggler_share, len(d.comm.straggler_offset_ns)) == (None, None, 0)
    assert "straggler" not in _by_cause(d)
    assert d.verdict.cause != "straggler"
    assert d.to_json()["comm"]["straggler_rank"] is None


def test_what_if_in_json_and_verdict_evidence():
    d = diagnose(serial_loop())
    j = d.to_json()["what_if"]
    assert [x["cause"] for x in j] == ["sched_cpu", "launch_bound", "batch_prep"]
    assert set(j[0]) >= {"cause", "class", "saved_ns", "step_ns_before", "step_ns_after", "speedup", "assumptions"}
    assert j[0]["saved_ns"] == 300 * US and j[0]["speedup"] == round(1000 / 700, 4)
    assert all(isinstance(a, str) for a in j[0]["assumptions"]) and j[0]["assumptions"]
    assert [x["saved_ns"] for x in j] == sorted((x["saved_ns"] for x in j), reverse=True)
    ev = [f for f in d.verdict.evidence if f.kind == "what_if"]
    assert len(ev) == 1 and "sched_cpu" in ev[0].text and ev[0].value == 300 * US


def test_empty_timeline_has_no_what_if():
    assert diagnose(timeline()).what_if == ()


def _no_host(r):
    return replace(r, recv_us=0, sched_us=0, result_us=0)


# scenario -> (cause removed, how the scenario looks without it)
TWINS = {
    "scheduler_bound": ("sched_cpu", _no_host),
    "overlap_scheduler_bound": ("sched_cpu", _no_host),
    "prep_bound": ("batch_prep", lambda r: replace(r, prep_us=0)),
    "eager_fallback": ("eager_fallback", lambda r: replace(r, graph_max_bs=10_000)),
    "comm_straggler": ("straggler", lambda r: replace(r, kernel_us=40)),
    "launch_bound_eager": ("launch_bound", lambda r: replace(r, graph=True)),
    "kernel_bound": ("launch_bound", lambda r: replace(r, sample_us=0)),
}


@pytest.mark.parametrize("name", sorted(TWINS))
def test_removing_the_injected_cause_predicts_the_clean_scenario(name):
    sc = next(s for s in generate.SCENARIOS if s.name == name)
    cause, fix = TWINS[name]
    clean = replace(sc, name=f"{name}_clean", ranks=tuple(fix(r) for r in sc.ranks))
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        d = diagnose(load_timeline(generate.write(sc, Path(a))))
        dc = diagnose(load_timeline(generate.write(clean, Path(b))))
    w = _by_cause(d)[cause]
    assert d.what_if[0].cause == cause                     # the injected cause pays most
    measured = dc.budget.wall_ns / dc.budget.steps
    assert w.step_ns_after == pytest.approx(measured, rel=0.03)
    assert w.step_ns_before == d.budget.wall_ns // d.budget.steps
