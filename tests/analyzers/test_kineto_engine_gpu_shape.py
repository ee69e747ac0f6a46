"""A Kineto trace shaped like `srtscope capture --backend torch` of our engine on a GPU (overlap loop,
CUDA graphs), built by hand: stage annotations on the scheduler and forward threads, graph replays
whose kernels carry the cudaGraphLaunch correlation, and Kineto's GPU-stream projections of the
annotations. It pins down how such a capture is read and diagnosed."""
from __future__ import annotations

import json

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline

SCHED, FWD, PID = 10, 11, 4242


def ann(name: str, ts: float, dur: float, tid: int = SCHED) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}


def step_events(i: int, t: float, host_us: float) -> list[dict]:
    """Step i from t: host scheduling (``host_us``) then a graph replay of 3 kernels and sampling."""
    corr = 100 * i
    g0 = t + host_us + 60
    return [
        ann(f"loop.step step={i} mode=decode bs=4 tokens=4", t, host_us + 400),
        ann("sched.schedule bs=4", t, host_us),
        ann("prep.batch part=h2d", t + host_us + 5, 30, FWD),
        ann("run.graph_replay bs=4 padded_bs=4", t + host_us + 40, 30, FWD),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID, "tid": FWD,
         "ts": t + host_us + 45, "dur": 10, "args": {"correlation": corr}},
        ann("run.sample", t + host_us + 75, 20, FWD),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": FWD,
         "ts": t + host_us + 80, "dur": 5, "args": {"correlation": corr + 1}},
        *[{"ph": "X", "cat": "kernel", "name": f"layer_kernel_{k}", "pid": 0, "tid": 7, "ts": g0 + 50 * k,
           "dur": 50, "args": {"device": 0, "stream": 7, "correlation": corr}} for k in range(3)],
        {"ph": "X", "cat": "kernel", "name": "sample_kernel", "pid": 0, "tid": 7, "ts": g0 + 150,
         "dur": 10, "args": {"device": 0, "stream": 7, "correlation": corr + 1}},
        # Kineto repeats annotations that launched GPU work on the stream: not host activity
        {"ph": "X", "cat": "gpu_user_annotation", "name": f"loop.step step={i} mode=decode bs=4",
         "pid": 0, "tid": 7, "ts": g0, "dur": 160},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "run.graph_replay bs=4 padded_bs=4",
         "pid": 0, "tid": 7, "ts": g0, "dur": 150},
    ]


def test_gpu_capture_of_the_engine_reads_as_graph_replay_steps_and_names_the_scheduler(tmp_path):
    events, t = [], 0.0
    for i in range(6):                       # scheduling (300 µs) dominates each 700 µs step
        events += step_events(i, t, 300)
        t += 700
    path = tmp_path / "engine_gpu.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                                "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    d = diagnose(load_timeline([path]))
    s = d.steps.table
    assert d.steps.source == "loop.step" and s["step"].tolist() == list(range(6))
    assert s["exec"].tolist() == ["graph"] * 6 and s["graph_kernels"].tolist() == [3] * 6
    assert s["padded_bs"].tolist() == [4] * 6
    # bubbles between steps: the launching thread is the forward thread (by correlation); it idles
    # while the scheduler thread runs sched.schedule, which therefore explains the lost time
    v = d.verdict
    assert d.bubbles.count == 5
    assert v.bottleneck == "scheduler" and v.summary.startswith("scheduler-bound")
    assert next(iter(d.bubbles.by_stage)) == "sched.schedule"
    assert d.bubbles.by_stage["sched.schedule"] == 5 * 300_000
