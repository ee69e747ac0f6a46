"""Attribution: each bubble split by what the launching host thread was doing; parts add up exactly."""
import numpy as np
import pytest

from srtscope.analyzers.analyses.attribution import BurstRule, attribute, innermost_segments, launching_threads
from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat
from tests.analyzers._tl import api, bubbles_of, kernel, rng, timeline

US = 1000
CLASSES = ["scheduler_ns", "prep_ns", "kernel_ns", "sync_ns", "launch_ns", "unattributed_ns"]


def run(tl, rule: BurstRule | None = None):
    b = bubbles_of(tl, 5 * US)
    pid, tid = launching_threads(tl, b["next_row"].to_numpy())
    q = b.assign(pid=pid, tid=tid)
    cls, stages, _ = attribute(tl, q, rule or BurstRule())
    return q, cls, stages


def test_innermost_segments_nested():
    s, e, lab = innermost_segments(np.array([0, 10, 12, 30]), np.array([100, 20, 15, 40]),
                                   np.array([0, 1, 2, 3]))
    assert list(zip(s.tolist(), e.tolist(), lab.tolist())) == [
        (0, 10, 0), (10, 12, 1), (12, 15, 2), (15, 20, 1), (20, 30, 0), (30, 40, 3), (40, 100, 0)]


def test_innermost_stage_wins_and_aliases_resolve():
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(400, 500, corr=2)],            # one 300 µs bubble
        [api(0, 1, corr=1), api(395, 398, corr=2)],                      # tid 1 launches the next work
        [rng(100, 400, "loop.step"),                                     # container: never a class
         rng(100, 200, "scheduler.get_next_batch_to_run"),               # SGLang alias -> scheduler
         rng(120, 150, "prepare_for_decode"),                            # nested inside it -> prep
         rng(200, 300, "sched.result"),
         rng(250, 270, "sync.wait"),                                     # innermost -> sync
         rng(300, 390, "run.sample"),                                    # kernel class
         rng(100, 400, "aten::mul")])                                    # not a stage: ignored
    _, cls, stages = run(tl)
    row = cls.iloc[0]
    assert row["scheduler_ns"] == (70 + 80) * US
    assert row["prep_ns"] == 30 * US
    assert row["sync_ns"] == 20 * US
    assert row["kernel_ns"] == 100 * US                                  # run.sample + 390..400 in aten::mul
    assert row["unattributed_ns"] == 0                                   # the operator explains 390..400
    assert row["cause.launch_bound_ns"] == 100 * US and row["cause.sched_cpu_ns"] == (70 + 80 + 20) * US
    assert row["covered_ns"] == 300 * US                                 # aten::mul covers all of it
    assert row["top_stage"] == "run.sample"                              # 90 µs > sched.result's 80
    assert stages.iloc[0]["prepare_for_decode"] == 30 * US


def test_only_the_launching_thread_counts():
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(300, 400, corr=2)],
        [api(0, 1, corr=1, tid=2), api(290, 295, corr=2, tid=2)],        # tid 2 launches
        [rng(100, 300, "sched.schedule", tid=1),                        # another thread: irrelevant
         rng(100, 300, "prep.batch", tid=2)])                           # the launching thread
    q, cls, _ = run(tl)
    assert q["tid"].tolist() == [2]
    assert cls.iloc[0]["prep_ns"] == 200 * US and cls.iloc[0]["scheduler_ns"] == 0


def test_no_nvtx_sync_launch_burst_and_unannotated():
    # scenario: trace without NVTX. Bubble 100..600 on the device.
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(600, 700, corr=9)],
        [api(0, 1, corr=1),
         api(100, 200, "cudaStreamSynchronize"),                          # blocked -> sync
         api(200, 250, "cudaMemcpy"),                                     # blocking copy -> sync
         api(250, 260, "cudaMemcpyAsync"),                                # async copy: a CUDA call
         *[api(300 + 20 * i, 304 + 20 * i, corr=2 + i) for i in range(4)],  # burst 300..364 -> launch
         api(590, 594, corr=9)])                                          # a lone launch: a CUDA call
    _, cls, _ = run(tl)
    row = cls.iloc[0]
    assert row["sync_ns"] == 150 * US
    assert row["launch_ns"] == (64 + 10 + 4) * US                       # burst + the two lone calls
    assert row["unattributed_ns"] == 500 * US - 150 * US - 78 * US
    assert row["cause.host_unattributed_ns"] == row["unattributed_ns"] + 100 * US   # no engine: the sync too
    assert row["cause.memcpy_ns"] == 50 * US                      # blocking copy: the copy's fault
    assert row["covered_ns"] == 0


def test_unattributed_time_inside_user_ranges_by_family():
    # scenario: the trace's own ranges (not stages) around the host work; only what no stage,
    # sync or burst explains counts for them, innermost first, instances grouped by family
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(600, 700, corr=9)],              # bubble 100..600
        [api(0, 1, corr=1), api(150, 250, "cudaStreamSynchronize"),       # 100 µs sync: explained
         api(590, 594, corr=9)],
        [rng(100, 600, "train_step"),                                     # outer user range
         rng(300, 400, "Copy 1"), rng(400, 450, "Copy 2"),                # inner: one family
         rng(450, 500, "prep.batch")])                                    # a stage: explained
    b = bubbles_of(tl, 5 * US)
    pid, tid = launching_threads(tl, b["next_row"].to_numpy())
    cls, _, user = attribute(tl, b.assign(pid=pid, tid=tid))
    assert user == {"train_step": 196 * US, "Copy #": 150 * US}       # 590..594 is the launch call
    assert sum(user.values()) == cls["unattributed_ns"].sum()


def test_kernel_stage_inside_a_burst_is_launch_bound():
    # scenario: eager forward launching slowly; device idle between tiny kernels
    dev = [kernel(20 * i, 20 * i + 3, corr=i + 1) for i in range(10)]
    apis = [api(20 * i - 10, 20 * i - 6, corr=i + 1) for i in range(10)]
    tl = timeline(dev, apis, [rng(-12, 200, "run.eager")])
    _, cls, _ = run(tl)
    total = cls[CLASSES].sum().sum()
    # all but the 6 µs between the burst's last launch (ends 174) and its kernel (180) is launch-bound
    assert cls["launch_ns"].sum() == total - 6 * US and cls["kernel_ns"].sum() == 6 * US
    _, cls2, _ = run(tl, BurstRule(gap_ns=30 * US, min_launches=50))  # no burst: stays kernel
    assert cls2["kernel_ns"].sum() == total


def test_probe_trace_thread_of_the_next_forward():
    # scenario: probe trace on the CPU: run.eager spans are the device rows; no correlation at all
    fwd = lambda s, e: kernel(s, e, "run.eager", kind=DeviceKind.CPU_FORWARD.value, pid=-1)  # noqa: E731
    tl = timeline([fwd(0, 100), fwd(500, 600)], [],
                  [rng(0, 100, "run.eager", tid=7, pid=-1), rng(500, 600, "run.eager", tid=7, pid=-1),
                   rng(100, 300, "sched.result", tid=7, pid=-1), rng(300, 450, "prep.batch", tid=7, pid=-1),
                   rng(100, 500, "sched.schedule", tid=8, pid=-1)],       # other thread: only
                  fmt=SourceFormat.PROBE)                                  # while tid 7 idles
    q, cls, stages = run(tl)
    assert q["tid"].tolist() == [7]
    # 100..300 and 300..450: tid 7's own stages win; 450..500 tid 7 idles while tid 8 schedules
    assert cls.iloc[0]["scheduler_ns"] == (200 + 50) * US and cls.iloc[0]["prep_ns"] == 150 * US
    assert cls.iloc[0]["unattributed_ns"] == 0
    assert stages.iloc[0]["sched.schedule"] == 50 * US and stages.iloc[0]["sched.result"] == 200 * US


@pytest.mark.parametrize("helper, cause", [
    ("sched.schedule", "sched_cpu"),     # the engine core schedules: the worker waits for the scheduler
    ("sync.wait", "handoff"),            # the engine core waits on the worker's answer: neither works
    (None, "host_unattributed"),         # nothing open anywhere: nothing explains it
])
def test_while_the_worker_idles_the_engine_cores_stage_decides(helper, cause):
    # scenario: a vLLM server merged: tid 7 the worker (forward, its own prep), tid 8 the engine
    # core; from 200 to 450 the worker runs no stage, the engine core is inside `helper`
    fwd = lambda s, e: kernel(s, e, "run.eager", kind=DeviceKind.CPU_FORWARD.value, pid=-1)  # noqa: E731
    ranges = [rng(0, 100, "run.eager", tid=7, pid=-1), rng(500, 600, "run.eager", tid=7, pid=-1),
              rng(100, 200, "sched.result", tid=7, pid=-1), rng(450, 500, "prep.batch", tid=7, pid=-1),
              rng(0, 600, "loop.step", tid=8, pid=-1), rng(60, 90, "sched.result", tid=8, pid=-1)]
    if helper is not None:
        ranges.append(rng(200, 450, helper, tid=8, pid=-1))
    tl = timeline([fwd(0, 100), fwd(500, 600)], [], ranges, fmt=SourceFormat.PROBE)
    q, cls, _ = run(tl)
    row = cls.iloc[0]
    assert q["tid"].tolist() == [7]
    own = {"sched_cpu": 100 * US, "batch_prep": 50 * US}          # tid 7's own stages, whatever tid 8 does
    for c in ("sched_cpu", "batch_prep", "handoff", "host_unattributed"):
        assert row[f"cause.{c}_ns"] == own.get(c, 0) + (250 * US if c == cause else 0), c


def test_overlap_loop_forward_thread_waits_for_the_scheduler_thread():
    # scenario: overlap loop: tid 2 (forward thread) launches and then idles until the scheduler
    # thread (tid 1) hands it the next batch; tid 3 is a third thread with fewer stage ranges
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(600, 700, corr=2)],                # bubble 100..600
        [api(0, 1, corr=1, tid=2), api(590, 594, corr=2, tid=2)],
        [rng(0, 700, "loop.step", tid=1), rng(100, 400, "sched.schedule", tid=1),
         rng(400, 560, "sched.result", tid=1), rng(540, 560, "sync.wait", tid=1),
         rng(560, 600, "prep.batch", part="h2d", tid=2),                    # tid 2's own stage
         rng(100, 300, "prep.batch", tid=3)])                               # not the helper
    q, cls, stages = run(tl)
    assert q["tid"].tolist() == [2]
    row = cls.iloc[0]
    # 100..540 scheduler (tid 1), 540..560 sync.wait (tid 1, innermost), 560..590 tid 2's prep,
    # 590..594 tid 2's launch call (a lone launch: no burst, so not idle and unattributed)
    assert row["scheduler_ns"] == 440 * US and row["sync_ns"] == 20 * US
    assert row["prep_ns"] == 40 * US and row["unattributed_ns"] == 0
    assert stages.iloc[0]["sched.schedule"] == 300 * US
    assert row["covered_ns"] == 40 * US          # coverage: the launching thread's own ranges only


@pytest.mark.parametrize("seed", range(5))
def test_parts_add_up_exactly(seed):
    r = np.random.default_rng(seed)
    n = 60
    ks = np.sort(r.choice(100_000, n, replace=False))
    dev = [kernel(int(s), int(s) + int(r.integers(1, 30)), corr=i + 1) for i, s in enumerate(ks)]
    apis = [api(int(s) - 8, int(s) - 4, corr=i + 1, tid=int(r.integers(1, 3))) for i, s in enumerate(ks)]
    apis += [api(int(s), int(s) + int(r.integers(1, 200)), "cudaDeviceSynchronize") for s in r.integers(0, 100_000, 20)]
    names = ["sched.schedule", "prep.batch", "run.sample", "sync.wait", "loop.step", "foo"]
    rs = r.integers(0, 100_000, 80)
    rgs = [rng(int(s), int(s) + int(r.integers(1, 3000)), names[int(r.integers(0, 6))],
               tid=int(r.integers(1, 3))) for s in rs]
    q, cls, _ = run(timeline(dev, apis, rgs))
    assert len(q) > 10
    assert (cls[CLASSES].sum(axis=1).to_numpy() == (q["end_ns"] - q["start_ns"]).to_numpy()).all()
    assert (cls[CLASSES].to_numpy() >= 0).all()


def test_burst_rule_validation():
    with pytest.raises(ValueError, match="launch-burst"):
        BurstRule(gap_ns=-1)
    with pytest.raises(ValueError, match="launch-burst"):
        BurstRule(min_launches=0)


def test_a_lone_api_call_is_not_idle_time():
    # scenario: the launching thread makes one slow call outside any range (no burst, not a sync):
    # it is busy, so the other thread's stage does not explain that time
    tl = timeline(
        [kernel(0, 100, corr=1), kernel(600, 700, corr=2)],                # bubble 100..600
        [api(0, 1, corr=1, tid=2), api(200, 300, "cudaMalloc", tid=2), api(590, 594, corr=2, tid=2)],
        [rng(0, 700, "loop.step", tid=1), rng(100, 590, "sched.schedule", tid=1)])
    _, cls, _ = run(tl)
    row = cls.iloc[0]
    assert row["scheduler_ns"] == (100 + 290) * US            # 100..200 and 300..590 only
    assert row["host_ns"] == 100 * US and row["cause.cold_start_ns"] == 100 * US   # the cudaMalloc
    assert row["unattributed_ns"] == 6 * US                   # 594..600 (590..594 is the launch call)
