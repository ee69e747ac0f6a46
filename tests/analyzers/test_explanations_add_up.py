"""Every figure of a verdict agrees with the others and with physics, on every shared real trace and
every labelled scenario of ``sample_traces/``:

- the headline's percentage is the named cause's own share of ``causes_ns`` (±1 point);
- no what-if gives back more than its cause lost in the steps averaged (``saved_ns <= lost_ns``), nor
  more in all than ``causes_ns`` holds; its mean step and lost time are the step budget's;
- no what-if step is shorter than its compute kernels, and the memcpy what-if keeps, per step, the
  busiest copy direction (recounted here from the device rows, not from the analyses' sets);
- nothing is predicted from steps holding too little device work (recounted from the step table);
- every collective kernel is counted as communication (recounted with a plain name match).

The table holds the expert's reading of each trace: the cause, its share of lost time, and what the
what-if says (the cause it ranks first, whether it predicts, the bound that limited it).
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from srtscope.analyzers.analyses.losses import MIN_BUSY_SHARE, MIN_DEVICE_NS
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.names import copy_direction
from srtscope.analyzers.readers import load_timeline
from tests.conftest import REAL_TRACES, REPO

SAMPLES = REPO / "sample_traces"

# trace -> (cause, headline share % of lost time or None when healthy, what-if: first cause or None,
#           predicted, bound of the first row). Recounted from the raw tables (sqlite3 / the gz JSON):
REAL = {
    # 45 sync steps of 39.7 ms; the host reads between power iterations: 14.3 ms a step
    "nsys/cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite": ("host_io", 98, "host_io", True, "none"),
    # 2 GPUs in one process; launch gaps 66% of lost time (the kernel class 93%): 3.6 ms of 18.7 ms a step
    "nsys/fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite":
        ("launch_bound", 66, "launch_bound", True, "none"),
    "nsys/fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite":
        ("compute", None, "launch_bound", True, "none"),
    # one 12.7 s warm-up step (cold cuDNN, allocator) left out; the 2 others: 21.9 ms of 26.5 ms start-up calls
    "kineto/hta_alexnet_a100_single.json.gz": ("cold_start", 99, "cold_start", True, "none"),
    "kineto/hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz": ("launch_bound", 80, "launch_bound", True, "none"),
    # all_to_all waits on peers: 84% of lost time (the kernel class 99%); overlap capped by compute
    "kineto/hta_torchrec_train_a100_rank0of16_cudagraph_nccl.json.gz":
        ("exposed_comm", 84, "exposed_comm", True, "overlap"),
    # one 1.76 µs kernel in a 13.3 s capture: healthy in its window, nothing to predict
    "kineto/hta_triton_single_kernel_a100.json.gz": ("compute", None, None, False, None),
    "kineto/kineto_tbplugin_resnet50_v100_2021_legacy.json.gz": ("host_io", 74, "host_io", True, "none"),
    # 10 ms of kernels in 3.2 s of steps: too little to predict
    "nsys/nvfuser_crossentropy_bench_h200_nvtx_nsys2025.1.sqlite":
        ("host_unattributed", 72, "host_unattributed", False, "too_little"),
    "nsys/nvfuser_test_8xH100node_nvtx_nsys2024.6.sqlite": ("cold_start", 82, "cold_start", False, "too_little"),
    "nsys/pytorch_tiny_sum_rtx3080_nsys2026.1.sqlite": ("cold_start", 95, "cold_start", False, "too_little"),
    # HtoD and DtoH each iteration (round trip), advice "keep it resident": removing the copies saves
    # 19.8 ms of 37.6 (the copies with no kernel running and the device's waits for them; overlapping
    # them, 17.8 ms, is stated beside)
    "nsys/saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite": ("host_unattributed", 71, "memcpy", True, "none"),
    "kineto/tracelens_hf_qwen1.5-0.5b_h100.json.gz": ("compute", None, "launch_bound", True, "none"),
    # the vLLM execute range holds no device work (its graph replays run later): nothing to predict
    "kineto/tracelens_vllm_mi300_piecewise_hipgraph_replay_ROCm.json.gz": ("compute", None, None, False, None),
}

_SCENARIOS = json.loads((SAMPLES / "expected.json").read_text())
SCENARIOS = sorted(k for k, v in _SCENARIOS.items() if not v.get("refused"))
_CACHE: dict[str, tuple] = {}
_COLLECTIVE = re.compile(r"(?i)nccl|rccl|deep_?ep|dpsk::ep|nvshmem|cross_device_reduce|all_?reduce|all_?gather|"
                         r"reduce_?scatter|all_?to_?all|mscclpp|pplx::")


def _load(key: str):
    if key not in _CACHE:
        if key.startswith("sample:"):
            files = [SAMPLES / f for f in _SCENARIOS[key[7:]]["files"]]
        else:
            files = [REAL_TRACES / key]
            if not files[0].is_file():
                pytest.skip(f"{files[0]} not found (needs the shared/ folder beside the repo)")
        tl = load_timeline(files)
        _CACHE[key] = (tl, diagnose(tl))
    return _CACHE[key]


def _union_total(s: np.ndarray, e: np.ndarray) -> int:
    """Total length of the union of [s, e) intervals (a plain sort-and-merge)."""
    if len(s) == 0:
        return 0
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    total, cs, ce = 0, int(s[0]), int(e[0])
    for a, b in zip(s[1:].tolist(), e[1:].tolist()):
        if a > ce:
            total += ce - cs
            cs, ce = a, b
        else:
            ce = max(ce, b)
    return total + ce - cs


def _per_step(tl, d, select) -> np.ndarray:
    """Per step row: union length of the primary device's rows chosen by ``select(device table)``."""
    st = d.steps.table
    bt = d.budget.table
    dev = tl.device
    m = select(dev)
    out = np.zeros(len(st), np.int64)
    s_all, e_all = dev["start_ns"].to_numpy(), dev["end_ns"].to_numpy()
    for i in range(len(st)):
        a, b = int(st["start_ns"].iloc[i]), int(st["end_ns"].iloc[i])
        k = m & (dev["rank"].to_numpy() == st["rank"].iloc[i]) & (dev["device"].to_numpy() == bt["device"].iloc[i]) \
            & (e_all > a) & (s_all < b)
        out[i] = _union_total(np.maximum(s_all[k], a), np.minimum(e_all[k], b))
    return out


def _invariants(key: str) -> None:
    tl, d = _load(key)
    v = d.verdict
    lost = sum(v.causes_ns.values())
    # the headline quotes the cause's own share
    m = re.search(r"(\d+)% of lost time", v.summary)
    if not v.healthy:
        assert m is not None, v.summary
        assert abs(int(m.group(1)) - 100 * v.causes_ns.get(v.cause, 0) / lost) <= 1, (v.summary, v.causes_ns)
    st = d.steps.table
    warm = np.zeros(len(st), bool)
    for w in d.what_if:
        assert 0 <= w.saved_ns <= w.lost_ns + 1, (w.cause, w.saved_ns, w.lost_ns)
        assert w.step_ns_after == w.step_ns_before - w.saved_ns
        assert w.bound in ("none", "lost", "overlap", "copy_engine", "transport", "too_little")
        if not w.predicted:
            assert (w.saved_ns, w.speedup, w.bound) == (0, 1.0, "too_little")
    if not len(st) or not d.what_if:
        return
    n_warm = d.what_if[0].warmup_steps
    if n_warm:          # early steps (first half) over 3x the median step
        walls = st["wall_ns"].to_numpy()
        first = np.arange(len(st)) < (len(st) + 1) // 2
        warm = first & (walls > 3 * np.median(walls))
        assert int(warm.sum()) == n_warm
    keep = ~warm
    n = int(keep.sum())
    # too little device work in the steps (recounted from the step table): nothing predicted
    busy = int(st["busy_ns"].to_numpy()[keep].sum())
    thin = busy < MIN_DEVICE_NS or busy < MIN_BUSY_SHARE * int(st["wall_ns"].to_numpy()[keep].sum())
    assert all(not w.predicted for w in d.what_if) == thin, (busy, [w.predicted for w in d.what_if])
    single = st["rank"].nunique() == 1
    bj = d.budget.to_json()
    assert bj["warmup_steps"] == n_warm
    for w in d.what_if:      # the budget's mean step and lost time are the what-if's
        assert w.step_ns_before == bj["mean_step"]["wall_ns"]
        if single:
            assert abs(w.lost_ns - bj["mean_step"]["lost_ns"].get(w.cause, 0)) <= 1, w.cause
    kernels = _per_step(tl, d, lambda dev: np.isin(dev["kind"].astype(str).to_numpy(), ["kernel", "graph"])
                        & ~_comm(dev))
    for w in d.what_if:
        if not w.predicted:
            continue
        if single:          # summed over the steps, never more than the cause lost in all
            assert w.saved_ns * n <= v.causes_ns.get(w.cause, 0) + n, (w.cause, w.saved_ns * n, v.causes_ns)
        if w.cause == "straggler":
            continue        # the straggler's own work is balanced away: its kernels do not stay
        # compute kernels stay: no step gets shorter than its own
        per = np.asarray(w.per_step_ns)
        assert (st["wall_ns"].to_numpy() - per >= kernels)[keep].all(), w.cause
    mc = next((w for w in d.what_if if w.cause == "memcpy" and w.predicted), None)
    # copies overlapped keep their busiest direction; copies kept resident are removed (the kernels stay)
    if mc is not None and not any("kept resident" in a for a in mc.assumptions):
        direction = tl.device["name"].astype(str).map(copy_direction).to_numpy()
        is_copy = tl.device["kind"].astype(str).to_numpy() == "memcpy"
        floor = np.max([_per_step(tl, d, lambda dev, x=x: is_copy & (direction == x))
                        for x in np.unique(direction[is_copy])], axis=0)
        after = st["wall_ns"].to_numpy() - np.asarray(mc.per_step_ns)
        assert (after >= floor)[keep].all(), (after[:5], floor[:5])


def _comm(dev) -> np.ndarray:
    return dev["name"].astype(str).str.contains(_COLLECTIVE).to_numpy()


@pytest.mark.parametrize("key", sorted(REAL))
def test_real_trace_explanation_adds_up(key):
    _invariants(key)
    tl, d = _load(key)
    cause, share, first, predicted, bound = REAL[key]
    v = d.verdict
    assert v.cause == cause, v.summary
    if share is None:
        assert v.healthy
    else:
        assert int(re.search(r"(\d+)% of lost time", v.summary).group(1)) == pytest.approx(share, abs=1)
    if first is None:
        assert not any(w.predicted for w in d.what_if)
    else:
        w = d.what_if[0]
        assert (w.cause, w.predicted, w.bound) == (first, predicted, bound)
    # every collective kernel is communication: the device split's collective time is the recount
    dev = tl.device
    c = _comm(dev)
    recount = 0
    for idx in dev[c].groupby(["rank", "device"]).indices.values():
        rows = dev[c].iloc[idx]
        recount += _union_total(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
    assert d.device.comm_ns == recount
    assert not any(_COLLECTIVE.search(str(n)) for n in d.top_kernels["name"])


@pytest.mark.parametrize("name", SCENARIOS)
def test_labelled_scenario_explanation_adds_up(name):
    _invariants(f"sample:{name}")
    _, d = _load(f"sample:{name}")
    e = _SCENARIOS[name]
    assert (d.verdict.bottleneck, d.verdict.cause) == (e["bottleneck"], e["cause"]), d.verdict.summary
