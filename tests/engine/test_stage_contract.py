"""The stage contract between the engine and the analyzers, checked on the engine's own probe trace.

``prepare_for_extend`` / ``prepare_for_decode`` (slot allocation) run inside ``get_next_batch_to_run``
as in SGLang; their ``prep.batch part=alloc`` range nests in ``sched.schedule``, and the innermost
stage decides: time spent allocating KV slots is prep, not scheduler.
"""
from __future__ import annotations

import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.engine.config import EngineConfig
from srtscope.engine.engine import Engine
from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.scheduler.scheduler import spin_us
from srtscope.probes.stages import EXTEND_LIKE_MODES, Stage, StepMode

SLOW_ALLOC_US = 60_000     # large against the CPU forward (80-150 ms a step here, by load)


def _probe_run(tmp_path, **cfg_kw):
    cfg = EngineConfig(device="cpu", enable_probes=True, max_total_tokens=1024, context_length=256,
                       **cfg_kw)
    with Engine(cfg) as eng:
        eng.generate(["ab", "cd"], {"max_new_tokens": 5})
        eng.check_invariants()
        return eng.write_traces(tmp_path)


def test_slot_allocation_is_attributed_to_prep(tmp_path, recorder, monkeypatch):
    real_alloc = TokenSlotAllocator.alloc

    def slow_alloc(self, n):
        spin_us(SLOW_ALLOC_US)
        return real_alloc(self, n)

    monkeypatch.setattr(TokenSlotAllocator, "alloc", slow_alloc)
    paths = _probe_run(tmp_path)
    tl = load_timeline([paths["probe"]])
    ranges = tl.ranges
    names = ranges["name"].astype(str)
    alloc = ranges[(names == Stage.PREP_BATCH.value)
                   & ranges["attrs"].map(lambda a: (a or {}).get("part") == "alloc")]
    sched = ranges[names == Stage.SCHED_SCHEDULE.value]
    assert len(alloc) >= 5                                   # one per step (extend + decodes)
    # every allocation range lies inside a sched.schedule range of the same thread
    for a in alloc.itertuples():
        assert ((sched["tid"] == a.tid) & (sched["start_ns"] <= a.start_ns)
                & (sched["end_ns"] >= a.end_ns)).any()
    d = diagnose(tl)
    assert d.verdict.bottleneck == "prep", d.verdict.summary
    assert next(iter(d.bubbles.by_stage)) == Stage.PREP_BATCH.value
    n = int((names == Stage.RUN_EAGER.value).sum()) - 1     # the gaps between two forwards
    assert n >= 3 and d.bubbles.by_class["prep"] >= 0.9 * n * SLOW_ALLOC_US * 1000
    # were the allocation scheduler time, the scheduler would hold all of it; its own scheduling is
    # a few ms a step on a loaded host (10% of prep was crossed at load 3)
    assert d.bubbles.by_class.get("scheduler", 0) < 0.4 * d.bubbles.by_class["prep"]


@pytest.mark.parametrize("overlap", [False, True])
def test_modes_are_the_forward_mode_values(tmp_path, recorder, overlap):
    paths = _probe_run(tmp_path, enable_overlap=overlap)
    ranges = load_timeline([paths["probe"]]).ranges
    modes = {str((a or {}).get("mode")) for n, a in zip(ranges["name"].astype(str), ranges["attrs"])
             if n in (Stage.LOOP_STEP.value, Stage.SCHED_SCHEDULE.value, Stage.PREP_BATCH.value)
             and a and "mode" in a}
    assert modes >= {StepMode.EXTEND.value, StepMode.DECODE.value}
    assert modes <= {m.value for m in StepMode}
    assert EXTEND_LIKE_MODES == {StepMode.EXTEND.value, StepMode.MIXED.value}
