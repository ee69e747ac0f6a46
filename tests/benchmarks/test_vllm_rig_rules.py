"""The vLLM rig's recovery rule (benchmarks/engines/vllm_rig.py), on hand-made run figures: an
intermittent fault is counted against its run's own quiet steps, a steady one against the clean
runs. No vLLM needed."""
from __future__ import annotations

import pytest

from benchmarks.engines.vllm_rig import RunFigures, check, own_baseline

MS = 1e6


def _run(fault: str, sched_ms: list[float], fired: list[bool], injected_ms: float, run: int = 1) -> RunFigures:
    """A run whose steps lose ``sched_ms`` each to the scheduler (2 ms of prep each)."""
    n = len(sched_ms)
    return RunFigures(run, fault, n, "scheduler", "sched_cpu", sum(sched_ms) / n * MS, 2 * MS,
                      {"sched_cpu": sum(sched_ms) / n * MS, "batch_prep": 2 * MS}, injected_ms / n * MS,
                      30 * MS, 25 * MS, {}, (), tuple((s * MS, 2 * MS) for s in sched_ms), tuple(fired))


@pytest.mark.parametrize("fired, want", [
    ([True, False, False, False] * 3, 3.0),     # every 4th step: the 9 quiet steps' median
    ([True] * 12, None),                        # every step: no quiet steps, the clean runs decide
    ([True, True, True, False] * 3, None),      # over half the steps fired: a steady fault
    ([False] * 12, None),                       # never fired: nothing to tell
])
def test_an_intermittent_fault_has_its_own_baseline(fired, want):
    f = _run("every4", [63.0 if x else 3.0 for x in fired], fired, 60.0 * sum(fired))
    got = own_baseline(f, "scheduler")
    assert got == (want * MS if want is not None else None)


def test_a_run_under_more_load_than_the_clean_runs_is_counted_against_its_own_steps():
    # scenario: the clean runs lose 1 ms a step to the scheduler; the every4 run ran under more load
    # (3 ms a step in its quiet steps): against the clean runs its 60 ms stalls read +13% high
    clean = [_run("clean", [1.0] * 12, [False] * 12, 0.0, run=r) for r in (0, 2)]
    fired = [True, False, False, False] * 3
    stall = _run("every4", [63.0 if x else 3.0 for x in fired], fired, 180.0)
    c = check([clean[0], stall, clean[1]], 1)
    assert c.own_baseline and c.err == pytest.approx(0.0)
    steady = _run("sched", [23.0] * 12, [True] * 12, 240.0)
    c = check([clean[0], steady, clean[1]], 1)
    assert not c.own_baseline and c.err == pytest.approx(2 / 20)
