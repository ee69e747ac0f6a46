"""One class for one fault, whatever the capture path: a stall in vLLM's KV slot allocation
(``KVCacheManager.allocate_slots``, called inside ``Scheduler.schedule``) is prep / batch_prep under
``capture --instrument vllm`` as it is from vLLM's own ``schedule: allocate_slots`` scope — the
nested ``prep.batch part=alloc`` range decides, not the ``sched.schedule`` around it. Engine steps
of a fake vLLM shaped by the declared table (``fake_engine.py``), recorded, written as a probe trace
and diagnosed."""
from __future__ import annotations

import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.probes.export import write_probe_trace

MS = 1_000_000
FORWARD_S = 0.008


def _run_steps(steps: int, alloc_s: float, sched_s: float) -> None:
    """``steps`` engine steps as vLLM's in-process engine makes them: LLMEngine.step -> EngineCore.step
    -> Scheduler.schedule (-> KVCacheManager.allocate_slots, ``alloc_s``; then ``sched_s`` of the
    scheduler's own work) -> the runner's prep, forward and sample -> update_from_output."""
    from vllm._fake_out import HOOKS
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def schedule(x):
        KVCacheManager().allocate_slots(sleep_s=alloc_s)
        if sched_s:
            import time
            time.sleep(sched_s)

    def core_step(x):
        Scheduler().schedule({"r0": 1, "r1": 1})
        runner = GPUModelRunner()
        runner._prepare_inputs(sleep_s=0.0005)
        runner._model_forward(sleep_s=FORWARD_S)
        runner._sample(sleep_s=0.0005)
        Scheduler().update_from_output()

    def llm_step(x):
        EngineCore().step()
        OutputProcessor().process_outputs()

    HOOKS.update({"Scheduler.schedule": schedule, "EngineCore.step": core_step, "LLMEngine.step": llm_step})
    for _ in range(steps):
        LLMEngine().step()


@pytest.mark.parametrize("alloc_s, sched_s, cls, cause", [
    (0.015, 0.0, "prep", "batch_prep"),          # KV slot allocation: prep, though inside schedule()
    (0.0, 0.015, "scheduler", "sched_cpu"),      # the scheduler's own work around it stays scheduler
])
def test_a_stall_is_named_by_the_innermost_engine_function(fake_vllm, tmp_path, alloc_s, sched_s, cls, cause):
    _run_steps(10, alloc_s, sched_s)
    names = {r[0] for r in fake_vllm.raw_spans()}
    assert {"loop.step", "sched.schedule", "prep.batch", "run.eager"} <= names
    alloc = [r for r in fake_vllm.raw_spans() if (r[5] or {}).get("part") == "alloc"]
    assert len(alloc) == 10 and all(r[0] == "prep.batch" for r in alloc)
    trace = write_probe_trace(fake_vllm, tmp_path / "alloc.json.gz")
    d = diagnose(load_timeline([trace])).to_json()
    v = d["verdict"]
    assert (v["bottleneck"], v["cause"]) == (cls, cause)
    steps = d["steps"]["count"]
    # the stall as measured inside it (its own spans, or the schedule spans' time around the alloc
    # spans), against the lost time of its class less the rest of that class's work (prep: the
    # _prepare_inputs spans; scheduler: the result spans)
    spans = fake_vllm.raw_spans()
    dur = lambda pick: sum(e - s for n, s, e, _t, _d, a in spans if pick(n, a or {})) / steps  # noqa: E731
    if cls == "prep":
        injected = dur(lambda n, a: a.get("part") == "alloc")
        rest = dur(lambda n, a: n == "prep.batch" and a.get("part") != "alloc")
    else:
        injected = dur(lambda n, a: n == "sched.schedule") - dur(lambda n, a: a.get("part") == "alloc")
        rest = dur(lambda n, a: n == "sched.result")
    assert injected >= 15 * MS
    recovered = v["scores_ns"][cls] / steps - rest
    assert abs(recovered - injected) <= 0.15 * injected, (recovered, injected)
    other = "scheduler" if cls == "prep" else "prep"
    assert v["scores_ns"][other] / steps < 2 * MS
