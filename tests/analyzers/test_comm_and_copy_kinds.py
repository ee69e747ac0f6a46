"""The declared table of collective kernels and copy kinds (``names``), and what the analyses make of
them: every family counted as communication, a tensor-parallel all-reduce inside the forward given a
faster-transport what-if (not overlap), side-stream collectives capped by the compute they could hide
behind, copy advice per kind, compiled-graph execution not taken for compilation, warm-up steps and
thin captures."""
import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.names import COMM_FAMILIES, HostWork, comm_family, comm_op, copy_kind, host_work
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000

# kernel name as the traces spell it -> (family, op); None: no collective
KERNELS = {
    "void deep_ep::intranode::dispatch<8, 768>(int4*, float*, ...)": ("deepep", "all_to_all"),
    "void dpsk::ep::internode::combine<bf16>(...)": ("deepep", "all_to_all"),
    "pplx::dispatch_kernel<256>": ("pplx", "all_to_all"),
    "nvshmemi_ibgda_put_nbi_warp": ("nvshmem", "other"),
    "rcclGenericKernel<1, AllReduce>": ("rccl", "all_reduce"),
    "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": ("nccl", "all_gather"),
    "ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bf16": ("nccl", "reduce_scatter"),
    "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)": ("nccl", "send_recv"),
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)": ("nccl", "broadcast"),
    "void vllm::cross_device_reduce_2stage<__nv_bfloat16, 4>(...)": ("custom_all_reduce", "all_reduce"),
    "sglang::one_shot_all_reduce_kernel<float>": ("custom_all_reduce", "all_reduce"),
    "mscclpp::allreduce6<bf16>": ("mscclpp", "all_reduce"),
    "all_to_all_single_kernel": ("collective", "all_to_all"),
    # not collectives: a MoE combine that is plain compute, a fused GEMM, a reduction
    "void moe_combine_kernel<float>": None,
    "sm90_xmma_gemm_bf16bf16_bf16f32": None,
    "void at::native::reduce_kernel<512, 1>": None,
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_families(name):
    want = KERNELS[name]
    assert comm_family(name) == (want[0] if want else None)
    if want:
        assert comm_op(name).value == want[1]


def test_every_family_of_the_table_is_communication_in_the_analyses():
    """One kernel of each tested family, 10 µs apart on a side stream, beside a gemm: all counted as
    collectives (time and exposure), none named the top kernel."""
    names = [n for n, w in KERNELS.items() if w]
    assert {KERNELS[n][0] for n in names} == {f for f, _ in COMM_FAMILIES}   # the table, whole
    dev = [kernel(0, 5000, "gemm")] + [kernel(6000 + 20 * i, 6010 + 20 * i, n, stream=13)
                                       for i, n in enumerate(names)]
    d = diagnose(timeline(dev))
    assert d.device.comm_ns == 10 * US * len(names)
    assert d.comm.n_kernels == len(names) and d.comm.total_ns == 10 * US * len(names)
    assert list(d.top_kernels["name"]) == ["gemm"]


def tp_steps(n=4, stream=7, name="void vllm::cross_device_reduce_1stage<bf16, 2>(...)"):
    """Serial decode steps of 1000 µs: gemm 300 µs, the all-reduce 200 µs, gemm 300 µs, then 200 µs
    of host scheduling. ``stream``: the all-reduce's (7: the model's own, as vLLM's custom all-reduce
    and a TP NCCL all-reduce run)."""
    dev, apis, rgs = [], [], []
    for i in range(n):
        t = 1000 * i
        rgs += [rng(t, t + 1000, "loop.step", step=i, mode="decode", bs=8), rng(t + 800, t + 1000, "sched.schedule")]
        for j, (a, b, k, s) in enumerate([(0, 300, "gemm", 7), (300, 500, name, stream), (500, 800, "gemm", 7)]):
            c = 10 * i + j + 1
            dev.append(kernel(t + a, t + b, k, stream=s, corr=c))
            apis.append(api(t + a - 3, t + a - 1, corr=c))
    return timeline(dev, apis, rgs)


def test_tensor_parallel_all_reduce_inside_the_forward_gets_a_faster_transport_not_overlap():
    w = {x.cause: x for x in diagnose(tp_steps()).what_if}["exposed_comm"]
    # 200 µs exposed per step, the next gemm waits for it: a 2x faster transport gives back 100 µs
    assert (w.lost_ns, w.saved_ns, w.bound) == (200 * US, 100 * US, "transport")
    assert any("faster transport" in a for a in w.assumptions)


def test_side_stream_collectives_overlap_at_most_the_compute_beside_them():
    # the same collectives on their own stream: hidden behind compute, all 200 µs (600 µs of gemm)
    w = {x.cause: x for x in diagnose(tp_steps(stream=13)).what_if}["exposed_comm"]
    assert (w.saved_ns, w.bound) == (200 * US, "none")
    # a 900 µs collective beside 600 µs of gemm per step: overlap hides 600 µs at most
    dev, apis, rgs = [], [], []
    for i in range(4):
        t = 2000 * i
        rgs.append(rng(t, t + 2000, "loop.step", step=i, mode="decode", bs=8))
        dev += [kernel(t, t + 600, "gemm", corr=2 * i + 1),
                kernel(t + 600, t + 1500, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=13, corr=2 * i + 2)]
        apis += [api(t - 2, t - 1, corr=2 * i + 1), api(t + 590, t + 591, corr=2 * i + 2)]
        rgs.append(rng(t + 1500, t + 2000, "sched.schedule"))
    w = {x.cause: x for x in diagnose(timeline(dev, apis, rgs)).what_if}["exposed_comm"]
    assert (w.lost_ns, w.saved_ns, w.bound) == (900 * US, 600 * US, "overlap")


@pytest.mark.parametrize("copies, kind, says", [
    (["Memcpy DtoD (Device -> Device)"], "dtod", "pinning cannot help"),
    (["Memcpy HtoD (Pageable -> Device)"], "htod_pageable", "pin the host memory"),
    (["Memcpy HtoD (Pinned -> Device)"], "htod", "prefetch"),
    (["Memcpy DtoH (Device -> Pinned)"], "dtoh", "read back less"),
    (["Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)"], "round_trip", "resident"),
])
def test_copy_advice_per_kind(copies, kind, says):
    """Steps of 1000 µs copying 600 µs with nothing computing, then a 100 µs kernel: copy-bound."""
    dev = []
    for i in range(4):
        t = 1000 * i
        per = 600 // len(copies)
        for j, name in enumerate(copies):
            dev.append(kernel(t + j * per, t + (j + 1) * per, name, kind="memcpy", stream=9))
        dev.append(kernel(t + 600, t + 700))
    d = diagnose(timeline(dev))
    assert d.verdict.cause == "memcpy", d.verdict.summary
    if kind != "round_trip":
        assert copy_kind(copies[0]).value == kind
    assert says in d.verdict.advice[0].text


@pytest.mark.parametrize("name, work", [
    ("CompiledFunction", HostWork.MODEL_OP), ("CompiledFunctionBackward", HostWork.MODEL_OP),
    ("Torch-Compiled Region: 0/0", HostWork.MODEL_OP), ("## Call CompiledFxGraph fx3k2 ##", HostWork.MODEL_OP),
    ("torch._dynamo compile_inner", HostWork.COMPILE), ("inductor codegen", HostWork.COMPILE),
])
def test_compiled_graph_execution_is_no_compilation(name, work):
    assert host_work(name) is work


def test_warm_up_steps_are_left_out_of_the_means():
    """Five 1000 µs steps (300 µs scheduling, 700 µs kernel) after a 20 ms first step of scheduling."""
    dev, apis, rgs = [], [], []
    t = 0
    for i in range(6):
        host = 20_000 if i == 0 else 300
        rgs += [rng(t, t + host + 700, "loop.step", step=i, mode="decode", bs=8), rng(t, t + host, "sched.schedule")]
        dev.append(kernel(t + host, t + host + 700, corr=i + 1))
        apis.append(api(t + host - 2, t + host - 1, corr=i + 1))
        t += host + 700
    d = diagnose(timeline(dev, apis, rgs))
    w = {x.cause: x for x in d.what_if}["sched_cpu"]
    assert (w.warmup_steps, w.step_ns_before, w.saved_ns) == (1, 1000 * US, 300 * US)
    assert any("1 warm-up steps left out" in a for a in w.assumptions)
    assert any(c.startswith("warmup_steps: the first step, ") for c in d.verdict.caveats)
    b = d.budget.to_json()
    assert (b["warmup_steps"], b["mean_step"]["wall_ns"], b["mean_step"]["lost_ns"]["sched_cpu"]) == \
        (1, 1000 * US, 300 * US)


def test_nothing_is_predicted_from_too_little_device_work():
    """One 2 µs kernel in each of three 100 ms steps of host work: 'too little to predict'."""
    dev, apis, rgs = [], [], []
    for i in range(3):
        t = 100_000 * i
        rgs += [rng(t, t + 100_000, "loop.step", step=i), rng(t, t + 99_000, "sched.schedule")]
        dev.append(kernel(t + 99_000, t + 99_002, corr=i + 1))
        apis.append(api(t + 98_990, t + 98_991, corr=i + 1))
    d = diagnose(timeline(dev, apis, rgs))
    assert d.what_if and all(not w.predicted and w.speedup == 1.0 and w.bound == "too_little" for w in d.what_if)
    assert all(w.saved_ns == 0 and "too little to predict" in w.assumptions[0] for w in d.what_if)
    assert not any(f.kind == "what_if" for f in d.verdict.evidence)


def test_low_device_coverage_when_the_active_window_is_a_small_part_of_the_capture():
    """A 100 ms capture (host calls from 0) whose device works 20 ms at its end, 90% busy."""
    dev = [kernel(80_000 + 100 * i, 80_000 + 100 * i + 90) for i in range(200)]
    apis = [api(0, 10, "cudaGetDeviceCount"), api(79_990, 79_995)]
    d = diagnose(timeline(dev, apis))
    codes = {w["code"] for w in d.capture.warnings}
    assert "low_device_coverage" in codes


def loader_steps(ops):
    """Four 1000 µs steps: the host waits 700 µs in the data loader's ``__next__`` (``ops`` inside it,
    µs from its start), then a 300 µs kernel."""
    nxt = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    dev, apis, rgs = [], [], []
    for i in range(4):
        t = 1000 * i
        rgs += [rng(t, t + 1000, f"ProfilerStep#{i}", domain="kineto.user_annotation"),
                rng(t, t + 700, nxt, domain="kineto.cpu_op")]
        rgs += [rng(t + a, t + b, name, domain="kineto.cpu_op") for name, a, b in ops]
        dev.append(kernel(t + 700, t + 1000, corr=i + 1))
        apis.append(api(t + 690, t + 695, corr=i + 1))
    return timeline(dev, apis, rgs)


def test_preprocessing_inside_the_data_loader_is_named_so():
    d = diagnose(loader_steps([("aten::div", 100, 400), ("aten::cat", 400, 500)]))
    assert d.verdict.cause == "host_io", d.verdict.summary
    assert "__next__" in d.verdict.summary and "57% of that in operators inside it (aten::div, aten::cat)" \
        in d.verdict.summary and "preprocessing on the host" in d.verdict.summary


def test_data_loading_without_work_inside_is_not_called_preprocessing():
    d = diagnose(loader_steps([("aten::div", 100, 150)]))
    assert d.verdict.cause == "host_io" and "__next__" in d.verdict.summary
    assert "preprocessing" not in d.verdict.summary
