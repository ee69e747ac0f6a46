"""Advice scoped by what the trace is: an engine's own options and functions only for that engine,
PyTorch's only where PyTorch ran, a native program's otherwise; none but its own on a healthy verdict;
no CUDA-graph advice for steps that already replay graphs. Each tiny timeline says which it is for."""
import pytest

from srtscope.analyzers.analyses.world import trace_world
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.timeline import OP_DOMAIN, PYTHON_DOMAIN
from srtscope.analyzers.model.vocab import World
from tests.analyzers._tl import api, kernel, rng, timeline


def launch_loop(ranges=(), kernel_name="gemm", graph=False):
    """Launch-bound steps: 80 kernels of 8 µs, each 4 µs after the last (the host launches one every
    12 µs); ``ranges``: (name, domain) rows once per step that say what ran."""
    dev, apis, rgs = [], [], []
    c = 0
    for i in range(6):
        t = 1000 * i
        for name, domain in ranges:
            rgs.append(rng(t, t + 990, name, domain=domain))
        for j in range(80):
            c += 1
            apis.append(api(t + 12 * j, t + 12 * j + 2, "cudaGraphLaunch" if graph else "cudaLaunchKernel", corr=c))
            dev.append(kernel(t + 12 * j + 4, t + 12 * j + 12, kernel_name, corr=c, graph_id=1 if graph else -1))
    return timeline(dev, apis, rgs)


WORLDS = {
    # a C++/CUDA loop: no PyTorch name anywhere
    "native": ((), "saxpy_kernel", World.NATIVE, "stream capture, then cudaGraphLaunch", "torch"),
    # PyTorch: its operators in the trace
    "pytorch_ops": ((("aten::mm", OP_DOMAIN),), "gemm", World.PYTORCH, "torch.compile", "--enforce-eager"),
    # PyTorch seen only in its kernels' namespace (an nsys export without NVTX)
    "pytorch_kernels": ((), "void at::native::vectorized_elementwise_kernel", World.PYTORCH, "torch.compile",
                        "cudaGraphLaunch"),
    # vLLM: its worker's per-step frame
    "vllm_frames": ((("vllm/v1/worker/gpu_model_runner.py(3939): execute_model", PYTHON_DOMAIN),), "gemm",
                    World.VLLM, "--enforce-eager", "--disable-cuda-graph"),
    # SGLang: its scheduler's ranges
    "sglang_ranges": ((("scheduler.run_batch", "sglang"),), "gemm", World.SGLANG, "--cuda-graph-max-bs",
                      "--enforce-eager"),
}


@pytest.mark.parametrize("case", sorted(WORLDS))
def test_advice_speaks_the_language_of_what_ran(case):
    ranges, kname, world, says, never = WORLDS[case]
    tl = launch_loop(ranges, kname)
    assert trace_world(tl, [kname]) is world
    v = diagnose(tl).verdict
    assert v.cause == "launch_bound", v.summary
    text = " ".join(a.text for a in v.advice)
    assert says in text and never not in text
    if world is World.NATIVE:
        assert ".item()" not in text and "DataLoader" not in text and "record_function" not in text


def test_graphed_steps_get_no_advice_to_capture_graphs():
    """Every step already replays CUDA graphs: the gaps between replays are not fixed by a graph."""
    v = diagnose(launch_loop((("aten::mm", OP_DOMAIN),), graph=True)).verdict
    assert v.cause == "launch_bound", v.summary
    assert "already replay CUDA graphs" in v.advice[0].text
    assert "torch.compile" not in v.advice[0].text


def test_a_healthy_verdict_advises_nothing_else():
    """Steps of 100 ms: 95 ms of kernels, then a 5 ms copy nothing hides (under the 10% healthy
    line): only the device's own advice, no copy advice."""
    dev, apis = [], []
    for i in range(10):
        t = 100_000 * i
        dev += [kernel(t, t + 95_000, corr=2 * i + 1),
                kernel(t + 95_000, t + 99_999, "Memcpy DtoH (Device -> Pinned)", kind="memcpy", stream=9)]
        apis += [api(t - 3, t - 1, corr=2 * i + 1), api(t + 90_000, t + 90_001, corr=2 * i + 2)]
    v = diagnose(timeline(dev, apis)).verdict
    assert v.healthy
    assert [a.cause for a in v.advice] == ["compute"]
