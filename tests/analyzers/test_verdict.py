"""Verdict: bottleneck, confidence, summary and caveats; DiagnoseParams validation; the JSON shape."""
import json

import pytest

from srtscope.analyzers.diagnose import DiagnoseParams, diagnose
from srtscope.analyzers.model.timeline import WarningCode
from srtscope.analyzers.model.verdicts import Verdict
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000


def looped(host_stage: str | None, host_us: int, kernel_us: int = 100, steps: int = 10, graph=False):
    """Steps of: host work (``host_stage`` range, or none) while the device idles, then one kernel."""
    dev, apis, rgs = [], [], []
    t = 0
    for i in range(steps):
        if host_stage:
            rgs.append(rng(t, t + host_us, host_stage))
        t += host_us
        apis.append(api(t, t + 2, "cudaGraphLaunch" if graph else "cudaLaunchKernel", corr=i + 1))
        dev.append(kernel(t + 3, t + 3 + kernel_us, corr=i + 1))
        t += 3 + kernel_us
    return timeline(dev, apis, rgs)


@pytest.mark.parametrize("stage, bottleneck, prefix", [
    ("sched.schedule", "scheduler", "scheduler-bound"),          # scenario: slow scheduling
    ("scheduler.process_batch_result", "scheduler", "scheduler-bound"),   # SGLang name
    ("prep.batch", "prep", "prep-bound"),                          # scenario: slow batch preparation
    ("run.sample", "kernel", "kernel-bound"),                      # scenario: host sampling
    ("sync.wait", "scheduler", "host-sync-bound"),                 # scenario: host blocked on results
])
def test_dominant_class_names_the_bottleneck(stage, bottleneck, prefix):
    v = diagnose(looped(stage, 400)).verdict
    assert v.bottleneck == bottleneck and v.summary.startswith(prefix)
    assert not v.healthy and 0.7 < v.confidence <= 1.0
    assert any(f.kind == "device_busy" for f in v.evidence)


def test_healthy_trace_says_so():
    v = diagnose(looped("sched.schedule", 1, kernel_us=500)).verdict   # 1+3 µs gaps: below threshold
    assert v.healthy and v.bottleneck == "kernel"
    assert v.summary.startswith("healthy: device busy 99%")          # 4 µs gaps per 504 µs
    assert v.confidence > 0.9


def test_unannotated_host_time_lowers_confidence():
    tl = looped(None, 400)                                   # no NVTX at all
    tl.meta.warn(WarningCode.NO_NVTX, "no NVTX ranges")
    v = diagnose(tl).verdict
    # no stage range, no engine frame: the scheduler is not blamed by default; the host time is
    # said to be unplaced
    assert v.bottleneck == "host" and v.cause == "host_unattributed"
    assert v.summary.startswith("host-bound, unannotated") and v.scores_ns["scheduler"] == 0
    assert v.confidence <= 0.5
    assert v.advice[0].cause == "host_unattributed" and "NVTX" in v.advice[0].text
    assert any(c.startswith("no_nvtx") for c in v.caveats)
    assert any(c.startswith("unattributed") for c in v.caveats)


def test_unannotated_time_inside_the_traces_own_ranges_is_named():
    # scenario: an app with NVTX ranges of its own ("Copy 3", "Copy 4", ...): the lost time lies
    # inside them, so the report names that range family instead of saying "add NVTX ranges"
    tl = looped("Copy 7", 400)
    for i, r in enumerate(tl.ranges.itertuples()):
        tl.ranges.loc[r.Index, "name"] = f"Copy {i}"                # one name per instance
    d = diagnose(tl)
    assert list(d.bubbles.by_user_range) == ["Copy #"]
    # 9 bubbles of 400 µs in a Copy range + 1 µs of launch latency outside it (the 2 µs launch
    # call is the host launching)
    assert d.bubbles.by_user_range["Copy #"] == 9 * 400 * US
    assert d.bubbles.by_class["unattributed"] == 9 * 401 * US
    assert d.bubbles.by_class["launch"] == 9 * 2 * US
    v = d.verdict
    assert v.summary.startswith("host-bound, unannotated") and "range 'Copy #'" in v.summary
    assert "add NVTX" not in v.summary and "leads with 0%" not in v.summary
    assert any(f.kind == "user_range" for f in v.evidence)
    assert diagnose(looped(None, 400)).bubbles.by_user_range == {}


def test_low_nvtx_coverage_caveat_and_mixed_classes_lower_dominance():
    tl = looped("sched.schedule", 100)
    d = diagnose(tl)
    mixed = timeline(
        list(looped("prep.batch", 400).device.to_dict("records")),
        list(looped("prep.batch", 400).api.to_dict("records")),
        [rng(0, 200, "prep.batch")] + [rng(503 * i, 503 * i + 200, "sched.schedule") for i in range(1, 10)])
    dm = diagnose(mixed)
    assert any(c.startswith("unattributed") for c in dm.verdict.caveats)
    assert dm.verdict.confidence < d.verdict.confidence


def test_step_range_restricts_the_analysis():
    dev, apis, rgs = [], [], []
    for i in range(6):
        t = 1000 * i
        slow = 600 if i >= 3 else 50                        # steps 3..5: slow scheduler
        rgs += [rng(t, t + 1000, "loop.step", step=i), rng(t, t + slow, "sched.schedule")]
        apis.append(api(t + slow, t + slow + 2, corr=i + 1))
        dev.append(kernel(t + slow + 3, t + 1000, corr=i + 1))
    tl = timeline(dev, apis, rgs)
    d = diagnose(tl, DiagnoseParams(step_range=(3, 5)))
    assert d.steps.table["step"].tolist() == [3, 4, 5]
    # the bubbles before steps 4 and 5 (step 3's lies before the cropped window's first kernel)
    assert d.bubbles.total_ns == 2 * 603 * US
    assert d.bubbles.by_class["scheduler"] == 2 * 600 * US   # + 3 µs each: launch latency, unannotated
    with pytest.raises(ValueError, match="selects no step"):
        diagnose(tl, DiagnoseParams(step_range=(10, 12)))


@pytest.mark.parametrize("kwargs, msg", [
    ({"threshold_us": -1}, "threshold_us"), ({"step_gap_us": 0}, "step_gap_us"),
    ({"burst_min_launches": 0}, "burst_min_launches"), ({"healthy_pct": 100}, "healthy_pct"),
    ({"step_range": (5, 2)}, "step_range"), ({"top_kernels": -1}, "top_kernels"),
])
def test_params_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        DiagnoseParams(**kwargs)


def test_verdict_validation():
    with pytest.raises(ValueError, match="bottleneck"):
        Verdict("gpu", 0.5, "x")
    with pytest.raises(ValueError, match="confidence"):
        Verdict("kernel", 1.5, "x")


def test_json_contract_keys_and_integer_times():
    j = diagnose(looped("sched.schedule", 400)).to_json()
    json.dumps(j)                                           # serialisable as is
    assert set(j) >= {"verdict", "bubbles", "steps", "comm", "budget", "top_kernels", "capture"}
    assert set(j["verdict"]) >= {"bottleneck", "cause", "confidence", "summary", "evidence", "caveats", "advice",
                                 "causes_ns", "scores_ns"}
    assert set(j["bubbles"]["by_class"]) == {"scheduler", "prep", "kernel", "sync", "launch", "unattributed",
                                             "host", "queued"}
    assert sum(j["bubbles"]["by_cause"].values()) == j["bubbles"]["total_ns"]
    assert set(j["device"]) >= {"busy_ns", "kernel_ns", "memcpy_ns", "memset_ns", "comm_ns", "memcpy"}
    assert set(j["verdict"]["scores_ns"]) == {"scheduler", "prep", "kernel", "host"}
    assert set(j["steps"]) >= {"count", "graph", "eager", "eager_reasons", "per_step"}
    assert set(j["comm"]) >= {"total_ns", "exposed_ns", "skew_ns", "straggler_rank", "collectives"}
    assert set(j["capture"]) >= {"format", "sources", "devices", "ranks", "window_ns", "warnings"}
    assert j["comm"]["straggler_rank"] is None

    def ints(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                if k.endswith("_ns") and isinstance(v, list):          # per-bin series (overview)
                    assert all(type(x) is int for x in v), f"{path}.{k} holds non-integers"
                elif k.endswith("_ns") and v is not None and not isinstance(v, dict):
                    assert type(v) is int, f"{path}.{k} is {type(v).__name__}"
                ints(v, f"{path}.{k}")
        elif isinstance(node, list):
            for x in node:
                ints(x, path)
    ints(j)


def test_the_cause_named_is_the_one_worth_fixing_not_a_one_off_upload():
    """A 30 ms upload at start (no kernel running), then 10 ProfilerSteps of 10 ms: 9 ms of kernels
    and 1 ms in the data loader while the device idles. memcpy lost most (30 ms vs 10 ms) but changes
    no step; removing host_io saves 1 ms a step: host_io is named, and the summary says why not memcpy."""
    dev = [kernel(0, 30_000, "Memcpy HtoD (Pinned -> Device)", kind="memcpy", stream=9)]
    apis, rgs = [], []
    t = 30_000
    for i in range(10):
        rgs += [rng(t, t + 10_000, f"ProfilerStep#{i}", domain="kineto.user_annotation"),
                rng(t, t + 1000, "DataLoader next batch", domain="kineto.user_annotation")]
        apis.append(api(t + 995, t + 998, corr=i + 1))
        dev.append(kernel(t + 1000, t + 10_000, corr=i + 1))
        t += 10_000
    d = diagnose(timeline(dev, apis, rgs))
    v = d.verdict
    assert v.causes_ns["memcpy"] == 30_000 * US
    w = {x.cause: x for x in d.what_if}
    assert w["host_io"].saved_ns == pytest.approx(1000 * US, abs=5 * US) and "memcpy" not in w
    assert (v.bottleneck, v.cause) == ("host", "host_io"), v.summary
    share = round(100 * v.causes_ns["host_io"] / sum(v.causes_ns.values()))
    assert f"{share}% of lost time" in v.summary                  # host_io's own share
    assert "memcpy lost more (75% of lost time) but its what-if gives back nothing in the steps" in v.alternatives
