"""Diff of two diagnoses: figures side by side, deltas, and the CI regression gate."""
import pytest

from srtscope.analyzers.analyses.diff import FigureDelta
from srtscope.analyzers.diagnose import compare, diagnose
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000


def run(sched_us: int):
    """Ten steps whose scheduler holds the device idle for ``sched_us`` each."""
    dev, apis, rgs = [], [], []
    t = 0
    for i in range(10):
        rgs.append(rng(t, t + sched_us, "sched.schedule"))
        t += sched_us
        apis.append(api(t, t + 2, corr=i + 1))
        dev.append(kernel(t + 3, t + 503, corr=i + 1))
        t += 503
    return diagnose(timeline(dev, apis, rgs))


def test_figures_side_by_side_and_deltas():
    # NOTE: the scheduler named in both (200 µs of a 703 µs step is over a quarter of it; at 100 µs
    # it would be a clean engine's rhythm: no dominant bottleneck)
    before, after = run(400), run(200)
    d = compare(before, after)
    f = d.figure("bubbles.by_class.scheduler_ns")
    assert (f.before, f.after) == (9 * 400 * US, 9 * 200 * US)
    assert f.delta == -9 * 200 * US and f.pct == pytest.approx(-50.0)
    assert d.regressions(5) == []                                 # it got better
    back = compare(after, before)
    names = {f.name for f in back.regressions(50)}
    assert {"bubbles.total_ns", "bubbles.by_class.scheduler_ns"} <= names
    assert "steps.count" not in names                             # neutral figures never regress
    j = back.to_json()
    assert j["verdict"] == {"before": "scheduler", "after": "scheduler", "changed": False,
                            "class_changed": False, "cause_changed": False,
                            "before_cause": "sched_cpu", "after_cause": "sched_cpu"}
    assert j["warnings"] == []                  # same capture twice: like for like
    assert any(x["figure"] == "comm.exposed_ns" for x in j["figures"])
    row = next(x for x in j["figures"] if x["figure"] == "bubbles.total_ns")
    assert row["worse"] is True and row["delta_pct"] == round(100 * (403 - 203) / 203, 2)  # +3 µs latency each


def test_regression_rules():
    assert FigureDelta("x", 100, 111, "lower").worse_by(10)
    assert not FigureDelta("x", 100, 110, "lower").worse_by(10)
    assert FigureDelta("x", 0, 1, "lower").worse_by(1000)        # from nothing: always a regression
    assert FigureDelta("x", 100, 80, "higher").worse_by(10)
    assert not FigureDelta("x", 100, 80, "lower").worse_by(10)
    assert FigureDelta("x", 0, 5, "lower").pct is None


def test_errors():
    d = compare(run(100), run(100))
    with pytest.raises(KeyError, match="no figure"):
        d.figure("nope")
    with pytest.raises(ValueError, match="threshold"):
        d.regressions(-1)


def _doc(bottleneck: str, cause: str, wall_ns: int, steps: int, sched_ns: int, kernels: dict[str, int],
         ranges: dict[str, int] | None = None) -> dict:
    """A minimal saved diagnosis: a verdict, the step figures, bubbles, kernels and ranges (totals)."""
    return {"verdict": {"bottleneck": bottleneck, "cause": cause},
            "budget": {"mean_step": {"wall_ns": wall_ns, "bubbles_ns": sched_ns // steps}},
            "steps": {"count": steps},
            "bubbles": {"total_ns": sched_ns, "by_class": {"scheduler": sched_ns}, "count": steps},
            "top_kernels": [{"name": n, "count": steps, "total_ns": ns} for n, ns in kernels.items()],
            "top_ranges": [{"name": n, "count": steps, "total_ns": ns} for n, ns in (ranges or {}).items()]}


class _Saved:
    def __init__(self, doc: dict) -> None:
        self.doc = doc

    def to_json(self) -> dict:
        return self.doc


@pytest.mark.parametrize("b, a, changed, cls, cause", [
    (("kernel", "compute"), ("kernel", "launch_bound"), True, False, True),     # the cause alone moved
    (("kernel", "compute"), ("scheduler", "sched_cpu"), True, True, True),
    (("kernel", "compute"), ("kernel", "compute"), False, False, False),
])
def test_verdict_changed_when_class_or_cause_changed(b, a, changed, cls, cause):
    d = compare(_Saved(_doc(*b, 10_000_000, 10, 0, {})), _Saved(_doc(*a, 10_000_000, 10, 0, {})))
    v = d.to_json()["verdict"]
    assert (v["changed"], v["class_changed"], v["cause_changed"]) == (changed, cls, cause)


def test_kernels_and_ranges_per_step_and_the_summary():
    # before: 10 steps of 10 ms; after: 20 steps of 12 ms (a longer capture: totals double)
    before = _doc("kernel", "compute", 10_000_000, 10, 5_000_000,
                  {"void gemm<float, 128>(float*)": 50_000_000, "softmax": 10_000_000},
                  {"layer_N.attn": 30_000_000})
    after = _doc("kernel", "launch_bound", 12_000_000, 20, 30_000_000,
                 {"void gemm<float, 128>(float*)": 100_000_000, "softmax": 40_000_000, "new_k": 2_000_000},
                 {"layer_N.attn": 80_000_000})
    d = compare(_Saved(before), _Saved(after))
    k = {x.name: x for x in d.kernels}
    assert "void gemm<float, 128>(float*)" not in k                  # 5 ms/step on both sides: no change
    assert k["softmax"].delta_ns == pytest.approx(1_000_000)          # 1 -> 2 ms per step
    assert k["new_k"].before_ns == 0 and k["new_k"].after_ns == 100_000
    assert [x.name for x in d.kernels] == ["softmax", "new_k"]        # largest change first
    assert d.ranges[0].name == "layer_N.attn" and d.ranges[0].delta_ns == pytest.approx(1_000_000)
    order = d.by_impact()
    assert order[0].name == "budget.mean_step.wall_ns"                # +2 ms/step
    per = {f.name: f.per_step_delta(10, 20) for f in order}
    assert per["bubbles.by_class.scheduler_ns"] == pytest.approx(1_000_000)    # 0.5 -> 1.5 ms per step
    s = d.summary()
    assert s.startswith("mean step 10.0 ms -> 12.0 ms (worse, +20.0%); verdict kernel/compute -> "
                        "kernel/launch_bound: "), s
    assert "idle while the host was in scheduler +1.00 ms/step" in s
    assert "kernel softmax +1.00 ms/step" in s and "range layer_N.attn +1.00 ms/step" in s
    j = d.to_json()
    assert j["summary"] == s and j["by_impact"][0] == "budget.mean_step.wall_ns"
    assert j["kernels"][0]["name"] == "softmax" and j["kernels"][0]["delta_ns_per_step"] == 1_000_000


def test_range_names_are_normalised_by_instance():
    from srtscope.analyzers.analyses.range_totals import normalise_instance
    for raw, norm in (("ProfilerStep#12", "ProfilerStep#N"), ("layer_3.attn", "layer_N.attn"),
                      ("step 17", "step N"), ("fp16_gemm", "fp16_gemm"), ("sm80 kernel", "sm80 kernel")):
        assert normalise_instance(raw) == norm


# -- the gate (issue 46): the mean step by default, figures by label or key, two floors -------------
@pytest.mark.parametrize("before_us, after_us, figure, pct, floor_ns, outcome", [
    # scenario: a fix (the scheduler's 400 us -> 100 us): the gated mean step got better
    (400, 100, [], 5, 20_000, "better"),
    # scenario: the same pair the other way: worse past 5% and 20 us/step
    (100, 400, [], 5, 20_000, "regressed"),
    # scenario: worse by 300 us/step, but the floor asks for 1 ms/step
    (100, 400, [], 5, 1_000_000, "under_floor"),
    # scenario: worse by 17%, within a 50% tolerance
    (500, 600, ["mean step"], 50, 0, "under_pct"),
    # scenario: the printed label and the JSON key name the same figure
    (100, 400, ["idle while the host was in scheduler"], 5, 20_000, "regressed"),
    (100, 400, ["bubbles.by_class.scheduler_ns"], 5, 20_000, "regressed"),
    # scenario: a figure with no better direction is never a regression
    (100, 400, ["steps"], 0, 0, "neutral"),
    (100, 100, [], 0, 0, "unchanged"),
])
def test_gate_outcomes(before_us, after_us, figure, pct, floor_ns, outcome):
    (call,) = compare(run(before_us), run(after_us)).gate(figure, pct, floor_ns)
    assert call.outcome == outcome
    assert call.regressed == (outcome == "regressed")


def test_gate_measures_time_figures_per_step():
    (call,) = compare(run(100), run(400)).gate(["mean step"], 5)
    assert call.figure.name == "budget.mean_step.wall_ns" and call.change == pytest.approx(300 * US)
    (idle,) = compare(run(100), run(400)).gate(["bubbles.total_ns"], 5)
    assert idle.change == pytest.approx(9 * 300 * US / 10)        # a total over ten steps, per step


def test_gate_refuses_unknown_names_and_negative_floors():
    d = compare(run(100), run(100))
    with pytest.raises(ValueError, match="nope"):
        d.gate(["nope"], 5)
    with pytest.raises(ValueError, match=">= 0"):
        d.gate([], 5, -1)
