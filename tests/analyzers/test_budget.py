"""Step budget: wall = compute + exposed comm + bubbles by class + other, exactly, per step."""
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.results import BUBBLE_CLASSES
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def scenario():
    dev, apis, rgs = [], [], []
    for i in range(3):                                   # three 1000 µs steps
        t = 1000 * i
        rgs += [rng(t, t + 1000, "loop.step", step=i, mode="decode", bs=8),
                rng(t, t + 300, "sched.schedule"),       # device idle: scheduler bubble
                rng(t + 300, t + 400, "prep.batch"),     # prep bubble
                rng(t + 400, t + 1000, "run.eager")]
        dev += [kernel(t + 400, t + 800, "gemm", corr=10 * i + 1),
                kernel(t + 700, t + 900, NCCL, corr=10 * i + 2, stream=13)]   # 100 µs exposed
        apis += [api(t + 395, t + 398, corr=10 * i + 1), api(t + 398, t + 399, corr=10 * i + 2)]
    return timeline(dev, apis, rgs)


def test_budget_parts_add_up_and_match_the_scenario():
    d = diagnose(scenario())
    b = d.budget
    t = b.table
    parts = t["compute_ns"] + t["exposed_comm_ns"] + sum(t[f"{c}_ns"] for c in BUBBLE_CLASSES) + t["other_ns"]
    assert (parts == t["wall_ns"]).all() and (t["other_ns"] >= 0).all()
    assert t["compute_ns"].tolist() == [400 * US] * 3
    assert t["exposed_comm_ns"].tolist() == [100 * US] * 3
    # steps 1 and 2 start with 400 µs of bubble (the device's window opens at step 0's first kernel)
    assert t["scheduler_ns"].tolist() == [0, 300 * US, 300 * US]
    assert t["prep_ns"].tolist() == [0, 100 * US, 100 * US]
    # the idle 100 µs between the NCCL kernel's end and the step's end: host still in run.eager
    assert t["kernel_ns"].tolist() == [100 * US, 100 * US, 0]
    # outside the device's active window: 400 µs before its first kernel, 100 µs after its last
    assert t["other_ns"].tolist() == [400 * US, 0, 100 * US]
    assert b.wall_ns == 3000 * US and b.exposed_comm_ns == 300 * US
    assert b.bubbles_ns["scheduler"] == 600 * US


def test_budget_json_mean_step():
    j = diagnose(scenario()).budget.to_json()
    assert j["steps"] == 3 and j["mean_step"]["wall_ns"] == 1000 * US
    assert isinstance(j["per_step"][0]["compute_ns"], int)
    assert sum(j["bubbles_ns"].values()) == 2 * 500 * US      # two 500 µs bubbles, split at step ends


def test_cpu_stand_in_budget_splits_the_forward_from_its_all_reduce():
    # scenario: a CPU TP probe trace: the forward span (a stand-in device row) holds its own
    # all-reduce on the same host thread, so the all-reduce is exposed and not compute
    from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat

    cpu = DeviceKind.CPU_FORWARD.value
    dev, rgs = [], []
    for i in range(2):
        t = 1000 * i
        dev += [kernel(t + 100, t + 900, "run.eager", kind=cpu),
                kernel(t + 500, t + 800, "comm.all_reduce", kind=cpu)]
        rgs += [rng(t, t + 1000, "loop.step", step=i, mode="decode"), rng(t + 100, t + 900, "run.eager"),
                rng(t + 500, t + 800, "comm.all_reduce")]
    t = diagnose(timeline(dev, [], rgs, fmt=SourceFormat.PROBE)).budget.table
    assert t["compute_ns"].tolist() == [500 * US] * 2
    assert t["exposed_comm_ns"].tolist() == [300 * US] * 2
