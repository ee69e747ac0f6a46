"""Every real third-party trace in ../shared/traces/real analyses without error, with plausible facts."""
import json

import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.results import BOTTLENECKS, BUBBLE_CLASSES
from tests.conftest import REAL_TRACES

pytestmark = pytest.mark.usefixtures("real_traces")   # conftest: skips without the shared traces

FILES = sorted([*REAL_TRACES.glob("nsys/*.sqlite"), *REAL_TRACES.glob("kineto/*.json.gz")]) \
    if REAL_TRACES.is_dir() else []
_CACHE: dict[str, object] = {}


def diag(name: str):
    if name not in _CACHE:
        path = next((p for p in FILES if p.name == name), None)
        if path is None:
            pytest.skip(f"{name} not in {REAL_TRACES}")
        _CACHE[name] = diagnose(load_timeline([path]))
    return _CACHE[name]


@pytest.mark.parametrize("name", [p.name for p in FILES] or ["<none>"])
def test_analyses_without_error(name):
    d = diag(name)
    j = d.to_json()
    json.dumps(j)
    assert j["verdict"]["bottleneck"] in BOTTLENECKS and 0 <= j["verdict"]["confidence"] <= 1
    assert sum(j["bubbles"]["by_class"][c] for c in BUBBLE_CLASSES) == j["bubbles"]["total_ns"]
    assert j["bubbles"]["busy_ns"] + j["bubbles"]["total_ns"] <= j["bubbles"]["window_ns"]
    assert j["capture"]["format"] in ("nsys-sqlite", "kineto")


def test_torchrec_has_graph_replays_and_nccl():
    d = diag("hta_torchrec_train_a100_rank0of16_cudagraph_nccl.json.gz")
    assert d.steps.n_exec("graph") > 0
    assert d.comm.total_ns > 0


def test_vllm_rocm_piecewise_graphs_replay():
    d = diag("tracelens_vllm_mi300_piecewise_hipgraph_replay_ROCm.json.gz")
    assert d.steps.n_exec("graph") > 0


def test_fastvideo_nccl_pair_differs_in_exposed_comm():
    before = diag("fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite")
    after = diag("fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite")
    for d in (before, after):
        assert d.comm.total_ns > 0 and d.comm.participants == 2     # two GPUs in one file
        assert d.comm.exposed_ns <= d.comm.total_ns
    lo, hi = sorted([before.comm.exposed_ns, after.comm.exposed_ns])
    assert hi > 1.2 * lo


def test_ddp_trace_has_nccl_and_no_graphs():
    d = diag("hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz")
    assert d.comm.total_ns > 0 and d.steps.n_exec("graph") == 0


def test_single_triton_kernel_is_healthy():
    d = diag("hta_triton_single_kernel_a100.json.gz")
    assert d.verdict.healthy and d.bubbles.count == 0


def test_unannotated_training_traces_say_so():
    d = diag("hta_alexnet_a100_single.json.gz")
    assert d.verdict.summary.startswith("host-bound, unannotated") and d.verdict.confidence <= 0.5


@pytest.mark.parametrize("name, family, min_share", [
    # nvFuser compiles with NVRTC while the GPU idles
    ("nvfuser_test_8xH100node_nvtx_nsys2024.6.sqlite", "executor_utils::Nvrtc::CompileProgram", 0.5),
    # CuPy example: the host-side I/O (one "IO N" range per iteration) leaves the GPU idle
    ("cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite", "IO #", 0.9),
])
def test_unattributed_time_is_named_by_the_traces_own_ranges(name, family, min_share):
    d = diag(name)
    top, ns = next(iter(d.bubbles.by_user_range.items()))
    assert top == family and ns >= min_share * d.bubbles.by_class["unattributed"]
    assert f"range {family!r}" in d.verdict.summary
