"""Real vLLM 0.32 (CPU, the rig's decode-shaped tiny Llama, 8 requests x 24 tokens) captured with
``srtscope capture --backend probe --instrument vllm``, one run per file, read and diagnosed in CI
without vLLM. Made by ``benchmarks/engines/instrument_vllm.py --model VENV/tiny-llama-decode``
(its 00_clean, 01_sched, 02_prep and 03_result captures, copied as
``sample_traces/vllm_instrument_<run>.json.gz``): each faulty run slept 20 ms once per engine
step inside ``Scheduler.schedule`` (sched), ``GPUModelRunner._prepare_inputs`` (prep) or
``OutputProcessor.process_outputs`` (result). The driver generates twice (warm-up, then the run):
steps 24.. are the run."""
from __future__ import annotations

import pytest

from srtscope.analyzers.diagnose import DiagnoseParams, diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.probes.stages import Stage
from tests.conftest import REPO

SAMPLES = REPO / "sample_traces"
INJECTED_NS = 20_000_000
MEASURED = (24, 47)


def _diagnose(run: str):
    tl = load_timeline([SAMPLES / f"vllm_instrument_{run}.json.gz"])
    return tl, diagnose(tl, DiagnoseParams(step_range=MEASURED))


def _per_step(d, cls: str) -> float:
    return d.budget.bubbles_ns[cls] / d.budget.steps


def test_the_instrumented_trace_reads_as_vllm_stepped_by_its_engine_steps():
    tl, d = _diagnose("clean")
    names = set(tl.host_ranges["name"].str.split(" ").str[0])
    assert {s.value for s in (Stage.LOOP_STEP, Stage.SCHED_SCHEDULE, Stage.PREP_BATCH, Stage.RUN_EAGER,
                              Stage.RUN_SAMPLE, Stage.SCHED_RESULT)} <= names
    assert d.steps.source == "loop.step" and d.budget.steps == 24
    # a clean run loses under 2 ms a step to the scheduler and to batch preparation
    assert _per_step(d, "scheduler") < 2e6 and _per_step(d, "prep") < 2e6
    # the run's first step is its prefill, the rest decode
    assert [(p.phase, p.steps) for p in d.phases] == [("prefill", 1), ("decode", 23)]


@pytest.mark.parametrize("run, cls, cause", [
    ("sched", "scheduler", "sched_cpu"),
    ("prep", "prep", "batch_prep"),
    ("result", "scheduler", "sched_cpu"),      # output processing is the scheduler's sched.result
])
def test_injected_delay_named_and_recovered(run, cls, cause):
    _, clean = _diagnose("clean")
    _, d = _diagnose(run)
    assert (d.verdict.bottleneck, d.verdict.cause) == (cls, cause)
    recovered = _per_step(d, cls) - _per_step(clean, cls)
    assert abs(recovered - INJECTED_NS) <= 0.10 * INJECTED_NS, recovered
    # the decode steps (where the delay is every step) carry the verdict of the injected class
    assert d.phases[1].phase == "decode" and d.phases[1].bottleneck == cls
    # the what-if for the cause predicts the clean run's mean step within 15%
    wif = next(w for w in d.what_if if w.cause == cause)
    clean_step = clean.budget.wall_ns / clean.budget.steps
    assert abs(wif.step_ns_after - clean_step) <= 0.15 * clean_step


@pytest.mark.parametrize("trace", ["vllm_instrument_prep.json.gz", "vllm/vllm_cpu_prep.pt.trace.json.gz",
                                   "vllm_instrument_sched.json.gz", "vllm/vllm_cpu_sched.pt.trace.json.gz"])
def test_advice_on_vllm_names_vllms_own_options(trace):
    # the probe path (--instrument vllm) and vLLM's own profiler alike: vLLM's words, not SGLang's
    d = diagnose(load_timeline([SAMPLES / trace]))
    first = d.verdict.advice[0]
    assert first.cause == d.verdict.cause
    text = " ".join(a.text for a in d.verdict.advice)
    assert "ForwardBatch" not in text and "srtscope run" not in text
    assert "--async-scheduling" in first.text
    if first.cause == "batch_prep":
        assert "_prepare_inputs" in first.text and "KV block allocation" in first.text


def test_a_vllm_trace_with_srtscope_stages_in_it_is_vllms():
    # scenario: capture --backend torch --instrument vllm: srtscope's stage ranges (record_function)
    # inside vLLM's own Kineto trace; the advice must be vLLM's, not srtscope's engine's
    from srtscope.analyzers.analyses.world import trace_world
    from srtscope.analyzers.model.vocab import World
    from tests.analyzers._tl import rng, timeline

    tl = timeline(ranges=[rng(0, 100, "llm_engine step: get_output", domain="kineto"),
                          rng(1, 20, "sched.schedule"), rng(2, 18, "prep.batch"),
                          rng(21, 30, "schedule: allocate_slots", domain="kineto")])
    assert trace_world(tl) is World.VLLM
    # srtscope's own engine (SGLang-shaped: some of SGLang's names, srtscope's stages) stays its own
    tl = timeline(ranges=[rng(0, 100, "sched.schedule"), rng(1, 20, "scheduler.get_next_batch_to_run")])
    assert trace_world(tl) is World.SRTSCOPE
