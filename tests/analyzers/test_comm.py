"""Communication: exposed time, cross-rank skew (collectives matched by their end times), the
straggler and its host."""
from srtscope.analyzers.model.names import comm_mask
from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat
from tests.analyzers._tl import communication, kernel, rng, timeline

US = 1000
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def test_exposed_is_comm_not_overlapped_by_compute():
    tl = timeline([kernel(0, 100, "gemm", stream=7),
                   kernel(50, 150, NCCL, stream=13),          # 50 µs hidden under the gemm, 50 exposed
                   kernel(200, 230, "cross_device_reduce_1stage", stream=13)])   # custom all-reduce
    assert comm_mask(tl.device).tolist() == [False, True, True]
    c = communication(tl)
    assert c.total_ns == 130 * US and c.exposed_ns == 80 * US
    assert c.participants == 1 and c.straggler_rank is None and c.skew_ns == 0


def test_skew_straggler_and_its_host_across_ranks():
    # scenario: comm stall, rank 1 arrives 300 µs late at each of 3 all-reduces; its host was scheduling
    dev, rgs = [], []
    for i in range(3):
        t = 1000 * i
        dev += [kernel(t, t + 400, NCCL, rank=0, device=0),            # rank 0 waits inside NCCL
                kernel(t + 300, t + 400, NCCL, rank=1, device=0)]      # rank 1: the straggler
        rgs += [rng(t - 100, t + 300, "sched.schedule", rank=1),
                rng(t + 100, t + 300, "sync.wait", rank=1)]            # innermost for half of it
    tl = timeline(dev, [], rgs, ranks=(0, 1))
    c = communication(tl)
    assert c.participants == 2 and len(c.collectives) == 3
    assert c.collectives["skew_ns"].tolist() == [300 * US] * 3
    assert c.collectives["transfer_ns"].tolist() == [100 * US] * 3
    assert c.skew_ns == 900 * US and c.straggler_rank == 1 and c.straggler_share == 1.0
    assert c.straggler_host_stage == "sync.wait"                        # 200 µs vs 100 µs per window
    assert c.straggler_device_busy == 0.0
    assert c.exposed_ns == 3 * 500 * US                                 # nothing else ran
    # names read as a categorical (as the readers give them) stay codes into the trace's names
    # (1.4 M matched as strings: 90 MiB); the JSON is the same
    tl.device["name"] = tl.device["name"].astype("category")
    cat = communication(tl)
    assert str(cat.collectives["name"].dtype) == "category"
    assert cat.to_json() == c.to_json() and [r["name"] for r in c.to_json()["collectives"]] == [NCCL] * 3


def test_windows_cut_at_different_collectives_are_aligned_by_end_time():
    # scenario: each rank's capture window starts and stops at a different collective: rank 1 misses
    # the first all-reduce and holds one more at the end; rank 1 is the 300 µs straggler throughout.
    # Pairing by order alone would pair each rank-0 collective with rank 1's next one.
    dev = []
    for i in range(6):
        t = 1000 * i
        if i < 5:
            dev.append(kernel(t, t + 400, NCCL, rank=0, device=0))
        if i > 0:
            dev.append(kernel(t + 300, t + 400, NCCL, rank=1, device=0))
    c = communication(timeline(dev, [], [], ranks=(0, 1)))
    assert len(c.collectives) == 4                                      # the 4 both ranks hold
    assert c.collectives["start_ns"].tolist() == [1000 * US * i for i in range(1, 5)]
    assert c.collectives["skew_ns"].tolist() == [300 * US] * 4
    assert c.straggler_rank == 1 and c.straggler_share == 1.0


def test_a_window_starting_many_collectives_later_is_still_aligned():
    # scenario: rank 1's capture starts 100 collectives later (a few decode steps of a deep model)
    # and stops early; it arrives 5 µs late at each collective it holds
    dev = [kernel(100 * i, 100 * i + 50, NCCL, rank=0) for i in range(200)]
    dev += [kernel(100 * i + 5, 100 * i + 50, NCCL, rank=1) for i in range(100, 150)]
    c = communication(timeline(dev, [], [], ranks=(0, 1)))
    assert len(c.collectives) == 50 and c.collectives["start_ns"].iloc[0] == 100 * 100 * US
    assert c.collectives["skew_ns"].tolist() == [5 * US] * 50


def test_small_skew_names_no_straggler():
    dev = [kernel(0, 100, NCCL, rank=0), kernel(2, 100, NCCL, rank=1)]
    c = communication(timeline(dev, [], [], ranks=(0, 1)), min_skew_ns=10 * US)
    assert c.skew_ns == 2 * US and c.straggler_rank is None


def test_probe_trace_comm_ranges_stand_in():
    # scenario: CPU probe trace without comm device rows: comm.all_reduce ranges are the collectives
    fwd = lambda s, e, r: kernel(s, e, "run.eager", kind=DeviceKind.CPU_FORWARD.value, rank=r, device=r)  # noqa: E731
    tl = timeline([fwd(0, 500, 0), fwd(0, 500, 1)], [],
                  [rng(100, 400, "comm.all_reduce", rank=0), rng(350, 400, "comm.all_reduce", rank=1),
                   rng(0, 500, "run.eager", rank=0), rng(0, 500, "run.eager", rank=1)],
                  fmt=SourceFormat.PROBE, ranks=(0, 1))
    c = communication(tl)
    assert c.source == "ranges" and c.skew_ns == 250 * US and c.straggler_rank == 1
    assert c.exposed_ns == 0                                             # inside the forward spans


def test_no_comm():
    c = communication(timeline([kernel(0, 10)]))
    assert c.source == "none" and c.total_ns == 0 and len(c.collectives) == 0


def test_probe_reader_shape_comm_rows_are_stand_ins_and_skew_counts_as_lost():
    # scenario: TP=2 probe traces as the probe reader builds them: forward AND comm.all_reduce spans
    # are cpu_forward device rows; rank 1 sleeps before each all-reduce (the injected straggler)
    from srtscope.analyzers.diagnose import diagnose
    cpu = DeviceKind.CPU_FORWARD.value
    dev, rgs = [], []
    for i in range(4):
        t = 10_000 * i
        for r, arrive in ((0, t + 1000), (1, t + 6000)):
            dev += [kernel(t, t + 7000, "run.eager", kind=cpu, rank=r, device=r),
                    kernel(arrive, t + 7000, "comm.all_reduce", kind=cpu, rank=r, device=r)]
            rgs += [rng(t, t + 7000, "run.eager", rank=r), rng(arrive, t + 7000, "comm.all_reduce", rank=r)]
    tl = timeline(dev, [], rgs, fmt=SourceFormat.PROBE, ranks=(0, 1))
    c = communication(tl)
    assert c.source == "stand_in" and c.straggler_rank == 1 and c.skew_ns == 4 * 5000 * US
    # stand-ins nest (the forward span holds its all-reduce on one host thread): nothing hides it
    assert c.total_ns == c.exposed_ns == 4 * (6000 + 1000) * US
    assert c.straggler_host_stage == "run.eager" and c.straggler_device_busy is None
    d = diagnose(tl)
    v = d.verdict
    # the others' wait for the straggler is inside the exposed time: not counted again as skew
    assert v.scores_ns["kernel"] == (d.bubbles.by_class["kernel"] + d.bubbles.by_class["launch"]
                                     + c.exposed_ns)
    assert v.bottleneck == "kernel" and v.summary.startswith("communication-bound")
    assert "straggler rank 1" in v.summary
