"""Steps and stand-ins on traces shaped like real engines' (vLLM V1, SGLang): steps run from one
engine step to the next, repeated ranges never mark steps, a prefill is not an eager fallback, and a
CPU trace of a real engine is diagnosed with its forward scopes standing in for the device."""
import gzip
import json

import pytest

from srtscope.analyzers.analyses.eager import eager_fallback
from srtscope.analyzers.analyses.steps import find_steps
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import TraceError, load_timeline
from tests.analyzers._tl import api, kernel, rng, timeline

US = 1000


def _vllm_step(t0: float, *, get_output: bool = True, ctx: int = 0, gen: int = 4) -> tuple[list, list]:
    """One vLLM V1 engine step at ``t0`` µs (in-process engine core): schedule() with one
    ``schedule: allocate_slots`` per request, the worker's execute range around preprocess / forward /
    postprocess, sample, then the output processor. Returns (ranges, device rows)."""
    r = [rng(t0 + 2 + 2 * i, t0 + 3 + 2 * i, "schedule: allocate_slots") for i in range(4)]
    r += [rng(t0 + 11, t0 + 12, "schedule: make_cached_request_data"),
          rng(t0 + 12, t0 + 13, "schedule: update_after_schedule"),
          rng(t0 + 15, t0 + 70, f"execute_context_{ctx}({ctx * 24})_generation_{gen}({gen})"),
          rng(t0 + 15, t0 + 25, "gpu_model_runner: preprocess"),
          rng(t0 + 25, t0 + 60, "gpu_model_runner: forward"),
          rng(t0 + 60, t0 + 68, "gpu_model_runner: postprocess"),
          rng(t0 + 71, t0 + 74, "gpu_model_runner: sample"),
          rng(t0 + 82, t0 + 95, "llm_engine step: process_outputs")]
    if get_output:
        r.append(rng(t0, t0 + 80, "llm_engine step: get_output"))
    return r, [kernel(t0 + 26, t0 + 59)]


def _vllm(n: int = 3, **kw):
    ranges, dev = [], []
    for k in range(n):
        r, d = _vllm_step(100 * k, ctx=4 if k == 0 else 0, gen=0 if k == 0 else 4, **kw)
        ranges += r
        dev += d
    return timeline(dev, [], ranges)


def test_vllm_steps_run_engine_step_to_engine_step():
    # scenario: vLLM in-process; 4 per-request allocate_slots ranges inside each schedule()
    source, t = find_steps(_vllm(3))
    assert source == "vllm"
    assert t["start_ns"].tolist() == [0, 100 * US, 200 * US]          # each llm_engine step: get_output
    assert t["end_ns"].tolist() == [100 * US, 200 * US, 200 * US + 95 * US]   # the scheduler's time inside
    assert t["mode"].tolist() == ["extend", "decode", "decode"]        # from execute_context_N_generation_M
    assert t["bs"].tolist() == [4, 4, 4] and t["tokens"].tolist() == [96, 4, 4]


def test_vllm_repeated_ranges_inside_a_step_never_mark_steps():
    # scenario: a worker trace without llm_engine step ranges (multiprocess engine core): the
    # scheduler's schedule:* ranges open steps, but the per-request ones within a step count once
    source, t = find_steps(_vllm(3, get_output=False))
    assert source == "vllm"
    assert len(t) == 3                              # not one per schedule:* range
    # allocate_slots is prep (KV slot allocation): the step opens at the scheduler's first own range
    assert t["start_ns"].tolist() == [11 * US, 111 * US, 211 * US]


def test_vllm_execute_markers_alone_cover_the_time_between_them():
    # scenario: a GPU trace with only the worker's execute_* annotation: each step runs on to the
    # next one's start, so the scheduler's time between model steps belongs to a step
    # (the first in vLLM's detailed form: detailed_trace_annotation)
    ranges = [rng(15, 70, "execute_24_context_1(sq24sk24sqsq576sqsk576)_generation_0(sq0sk0sqsq0sqsk0)")]
    ranges += [rng(100 * k + 15, 100 * k + 70, f"execute_context_{c}({24 * c})_generation_{g}({g})")
               for k, (c, g) in enumerate([(1, 0), (0, 1), (0, 1)]) if k]
    tl = timeline([kernel(100 * k + 20, 100 * k + 60, corr=k) for k in range(3)],
                  [api(100 * k + 16, 100 * k + 18, "cudaLaunchKernel" if k == 0 else "cudaGraphLaunch", corr=k)
                   for k in range(3)], ranges)
    source, t = find_steps(tl)
    assert source == "vllm"
    assert t["start_ns"].tolist() == [15 * US, 115 * US, 215 * US]
    assert t["end_ns"].tolist() == [115 * US, 215 * US, 270 * US]
    assert t["exec"].tolist() == ["eager", "graph", "graph"]
    # the prefill ran eagerly by design: not an eager fallback
    assert t["mode"].tolist() == ["extend", "decode", "decode"]
    assert t["tokens"].tolist() == [24, 1, 1]
    assert eager_fallback(t).eager_decode_steps == 0


def test_sglang_steps_open_at_recv_requests():
    # scenario: SGLang's scheduler loop with its NVTX ranges: the step starts at recv_requests, so
    # receiving requests lies inside the step; the graph replay makes the step a graph step
    ranges = []
    for k in range(2):
        t0 = 200 * k
        ranges += [rng(t0, t0 + 10, "scheduler.recv_requests"),
                   rng(t0 + 10, t0 + 20, "scheduler.process_input_requests"),
                   rng(t0 + 20, t0 + 40, "scheduler.get_next_batch_to_run"),
                   rng(t0 + 40, t0 + 150, "scheduler.run_batch"),
                   rng(t0 + 45, t0 + 55, "cuda_graph_runner.replay_prepare"),
                   rng(t0 + 55, t0 + 60, "cuda_graph_runner.replay"),
                   rng(t0 + 150, t0 + 180, "scheduler.process_batch_result")]
    tl = timeline([kernel(200 * k + 60, 200 * k + 140) for k in range(2)], [], ranges)
    source, t = find_steps(tl)
    assert source == "sglang"
    assert t["start_ns"].tolist() == [0, 200 * US]
    assert t["exec"].tolist() == ["graph", "graph"]


def _kineto(path, ranges):
    events = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 7, "tid": 7, "ts": s, "dur": e - s}
              for s, e, n in ranges]
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "traceEvents": events}, fh)
    return path


def _vllm_cpu_ranges(with_forward: bool = True, n: int = 6, prep_us: float = 10):
    out = []
    for k in range(n):
        t0 = 100 * k
        out += [(t0, t0 + 80, "llm_engine step: get_output"), (t0 + 2, t0 + 3, "schedule: allocate_slots"),
                (t0 + 15, t0 + 70, "execute_context_0(0)_generation_4(4)")]
        if with_forward:
            out += [(t0 + 15, t0 + 15 + prep_us, "gpu_model_runner: preprocess"),
                    (t0 + 25, t0 + 60, "gpu_model_runner: forward")]
        out.append((t0 + 82, t0 + 95, "llm_engine step: process_outputs"))
    return out


def test_a_cpu_trace_of_vllm_is_diagnosed_with_its_forward_standing_in(tmp_path):
    # scenario: vLLM's torch profiler on the CPU: no device activity, only vLLM's scopes
    tl = load_timeline(_kineto(tmp_path / "vllm.json.gz", _vllm_cpu_ranges()))
    assert len(tl.device) == 6 and set(tl.device["name"].astype(str)) == {"gpu_model_runner: forward"}
    warn = {w.code.value: w.message for w in tl.meta.warnings}
    assert "gpu_model_runner: forward" in warn["cpu_stand_in"]
    d = diagnose(tl).to_json()
    assert d["steps"]["source"] == "vllm" and d["steps"]["count"] == 6
    assert d["verdict"]["causes_ns"]["batch_prep"] > 0 and d["verdict"]["causes_ns"]["sched_cpu"] > 0


def test_without_forward_scopes_the_execute_range_stands_in_and_says_so(tmp_path):
    # scenario: vLLM's profiler without VLLM_CUSTOM_SCOPES_FOR_PROFILING: only execute_* marks the
    # model; the preparation inside it cannot be told apart, and the warning says so
    tl = load_timeline(_kineto(tmp_path / "vllm.json.gz", _vllm_cpu_ranges(with_forward=False)))
    assert set(tl.device["name"].astype(str)) == {"execute_context_0(0)_generation_4(4)"}
    text = next(w.message for w in tl.meta.warnings if w.code.value == "cpu_stand_in")
    assert "cannot be separated" in text and "VLLM_CUSTOM_SCOPES_FOR_PROFILING=1" in text
    # prep inside execute_* is device time here: only the KV slot allocation (1 µs in each of the 6
    # steps; the first step's lies before the device's first activity, still inside its step, and
    # lost time counts whole steps) is found as prep
    assert diagnose(tl).to_json()["verdict"]["causes_ns"]["batch_prep"] == 6 * US


def test_an_sglang_cpu_trace_stands_in_with_run_batch(tmp_path):
    # scenario: SGLang's scheduler ranges under torch.profiler on the CPU: run_batch (the whole
    # model step) stands in; the capture says the preparation inside it is not apart
    ranges = []
    for k in range(4):
        t0 = 100 * k
        ranges += [(t0, t0 + 5, "scheduler.recv_requests"), (t0 + 5, t0 + 30, "scheduler.get_next_batch_to_run"),
                   (t0 + 30, t0 + 80, "scheduler.run_batch"), (t0 + 80, t0 + 95, "scheduler.process_batch_result")]
    tl = load_timeline(_kineto(tmp_path / "sglang.json.gz", ranges))
    assert set(tl.device["name"].astype(str)) == {"scheduler.run_batch"}
    d = diagnose(tl).to_json()
    assert d["steps"]["source"] == "sglang" and d["steps"]["count"] == 4
    assert d["verdict"]["bottleneck"] == "scheduler"


def test_a_trace_with_engine_markers_but_no_model_range_is_refused(tmp_path):
    # scenario: only scheduler ranges, nothing marks the model's work: a one-line error, not a guess
    path = _kineto(tmp_path / "sched_only.json.gz", [(0, 10, "schedule: update_after_schedule"),
                                                     (20, 30, "llm_engine step: process_outputs")])
    with pytest.raises(TraceError, match="holds vllm ranges, but none that marks the model's work") as err:
        load_timeline(path)
    assert "\n" not in str(err.value)


def test_sglangs_sampling_after_its_forward_stands_in_for_the_device(tmp_path):
    # scenario: SGLang 0.5.23 on the CPU with its default sampling: run_batch builds the batch (10 µs,
    # preparation), runs step[DECODE bs=8] (50 µs, the forward), then samples (25 µs, softmax and
    # exponential_ over the vocabulary, no range of its own). The sampling is the model's work, as a
    # GPU's sampling kernels are: it stands in for the device, and only the build is preparation (the
    # verdict had been prep-bound on a clean SGLang, its sampling counted as batch preparation)
    ranges = []
    for k in range(6):
        t0 = 200 * k
        ranges += [(t0, t0 + 5, "scheduler.recv_requests"), (t0 + 5, t0 + 10, "scheduler.get_next_batch_to_run"),
                   (t0 + 10, t0 + 95, "scheduler.run_batch"), (t0 + 20, t0 + 70, "step[DECODE bs=8]"),
                   (t0 + 95, t0 + 100, "scheduler.process_batch_result")]
    tl = load_timeline(_kineto(tmp_path / "sglang.json.gz", ranges))
    dev = tl.device.sort_values("start_ns")
    assert dev["name"].astype(str).tolist() == ["step[DECODE", "scheduler.run_batch after the forward"] * 6
    assert ((dev["end_ns"] - dev["start_ns"]) // US).tolist() == [50, 25] * 6
    d = diagnose(tl).to_json()
    per_step = {c: ns // d["steps"]["count"] for c, ns in d["verdict"]["causes_ns"].items()}
    assert per_step["batch_prep"] == 10 * US                  # the batch build before the forward alone
    # a run_batch with no forward inside it has no model work after one: the forward ranges alone
    tl2 = load_timeline(_kineto(tmp_path / "sglang2.json.gz", ranges + [(1300, 1350, "scheduler.run_batch")]))
    assert len(tl2.device) == 12
