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
    before, after = run(400), run(100)
    d = compare(before, after)
    f = d.figure("bubbles.by_class.scheduler_ns")
    assert (f.before, f.after) == (9 * 400 * US, 9 * 100 * US)
    assert f.delta == -9 * 300 * US and f.pct == pytest.approx(-75.0)
    assert d.regressions(5) == []                                 # it got better
    back = compare(after, before)
    names = {f.name for f in back.regressions(50)}
    assert {"bubbles.total_ns", "bubbles.by_class.scheduler_ns"} <= names
    assert "steps.count" not in names                             # neutral figures never regress
    j = back.to_json()
    assert j["verdict"] == {"before": "scheduler", "after": "scheduler", "changed": False,
                            "before_cause": "sched_cpu", "after_cause": "sched_cpu"}
    assert j["warnings"] == []                  # same capture twice: like for like
    assert any(x["figure"] == "comm.exposed_ns" for x in j["figures"])
    row = next(x for x in j["figures"] if x["figure"] == "bubbles.total_ns")
    assert row["worse"] is True and row["delta_pct"] == round(100 * (403 - 103) / 103, 2)  # +3 µs latency each


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
