"""Degenerate data (issue 14, item 6): zero-length and negative ranges, every event at one time,
int64 extremes. The README's promise holds: exit 0 (a diagnosis) or exit 2 with one line, never 1.
Files are written here (nsys through ``NsysWriter``, Kineto JSON by hand); timelines in memory."""
from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sample_traces.nsys_schema import NsysWriter
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import MAX_ABS_NS, TraceError, load_timeline
from tests.analyzers._cli import srtscope
from tests.analyzers._tl import api, kernel, rng, timeline

I64_MIN, I64_MAX = -2**63, 2**63 - 1


def _steps(w: NsysWriter, t0: int = 1_000_000, n: int = 20, step: int = 10_000, kdur: int = 3_000,
           stage_dur: int | None = None, same: bool = False) -> None:
    w.add_gpu()
    ts = np.full(n, t0, np.int64) if same else t0 + np.arange(n, dtype=np.int64) * step
    off = 0 if same else 1_000
    w.add_kernels(ts + off, ts + off + kdur, ["gemm"] * n, correlation=np.arange(n))
    w.add_runtime(ts, ts + (0 if same else 500), ["cudaLaunchKernel"] * n, correlation=np.arange(n))
    w.add_nvtx(ts, ts + (step if stage_dur is None else stage_dur), ["loop.step"] * n, domain="srtscope")


def _set_last(w: NsysWriter, table: str, start: int, end: int) -> None:
    """The last row of ``table`` at times the writer would refuse."""
    w.con.execute(f"UPDATE {table} SET start=?, end=? WHERE rowid=(SELECT MAX(rowid) FROM {table})", (start, end))


def _extra(table: str, start: int, end: int, stage: str = "loop.step") -> Callable[[NsysWriter], None]:
    def build(w: NsysWriter) -> None:
        _steps(w)
        if table == "CUPTI_ACTIVITY_KIND_KERNEL":
            w.add_kernels([5], [6], ["odd"])
        elif table == "CUPTI_ACTIVITY_KIND_RUNTIME":
            w.add_runtime([5], [6], ["cudaDeviceSynchronize"])
        else:
            w.add_nvtx([5], [6], [stage], domain="srtscope")
        _set_last(w, table, start, end)
    return build


def _only(start: int, end: int) -> Callable[[NsysWriter], None]:
    def build(w: NsysWriter) -> None:
        w.add_gpu()
        w.add_kernels([5], [6], ["k"])
        _set_last(w, "CUPTI_ACTIVITY_KIND_KERNEL", start, end)
    return build


def _zero_stages(stage: str, with_api: bool) -> Callable[[NsysWriter], None]:
    def build(w: NsysWriter) -> None:
        w.add_gpu()
        ts = np.full(5, 1_000_000, np.int64)
        w.add_kernels(ts, ts + 10, ["k"] * 5)
        if with_api:
            w.add_runtime(ts, ts, ["cudaLaunchKernel"] * 5, correlation=np.arange(5))
        w.add_nvtx(ts, ts, [stage] * 5, domain="srtscope")
        w.add_nvtx(ts, ts, ["prep.batch"] * 5, domain="srtscope")
    return build


def _negative_stages(w: NsysWriter) -> None:
    _steps(w)
    w.con.execute("UPDATE NVTX_EVENTS SET end = start - 5000 WHERE end IS NOT NULL")


def _far_window(w: NsysWriter) -> None:
    _steps(w)
    w.close()
    con = sqlite3.connect(w.path)
    con.execute("UPDATE ANALYSIS_DETAILS SET startTime=?, stopTime=?", (I64_MIN, I64_MAX))
    con.commit()
    con.close()


K = "CUPTI_ACTIVITY_KIND_KERNEL"
NSYS_CASES: dict[str, Callable[[NsysWriter], None]] = {
    "zero_length_steps": lambda w: _steps(w, stage_dur=0),
    "all_at_one_time": lambda w: _steps(w, same=True, kdur=0, stage_dur=0),
    "all_start_together": lambda w: _steps(w, same=True, kdur=100, stage_dur=100),
    "zero_length_kernels": lambda w: _steps(w, kdur=0),
    "negative_steps": _negative_stages,
    "negative_times": lambda w: _steps(w, t0=-10**12),
    "kernel_at_int64_min": _extra(K, I64_MIN, I64_MIN + 1_000),
    "kernel_over_int64": _extra(K, I64_MIN, I64_MAX),
    "kernel_at_int64_max": _extra(K, I64_MAX - 1_000, I64_MAX),
    "kernel_far_back": _extra(K, -2**55, -2**55 + 10),
    "only_kernel_at_int64_min": _only(I64_MIN, I64_MIN),
    "api_over_int64": _extra("CUPTI_ACTIVITY_KIND_RUNTIME", I64_MIN, I64_MAX),
    "step_over_int64": _extra("NVTX_EVENTS", I64_MIN, I64_MAX),
    "step_far": _extra("NVTX_EVENTS", -2**55, 2**54),
    "sched_zero_length": _zero_stages("sched.schedule", with_api=False),
    "sched_zero_length_api": _zero_stages("sched.schedule", with_api=True),
    "session_over_int64": _far_window,
}


def _kineto(events: list, **header) -> str:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **header})


def _ev(ts, dur, cat: str = "kernel", name: str = "gemm", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"device": 0, "stream": 7, **args}}


KINETO_CASES: dict[str, str] = {
    "all_at_one_time": _kineto([_ev(5, 0, correlation=i) for i in range(5)]
                               + [_ev(5, 0, "cuda_runtime", "cudaLaunchKernel", correlation=i) for i in range(5)]
                               + [_ev(5, 0, "user_annotation", "ProfilerStep#1")]),
    "negative_durations": _kineto([_ev(i * 10, -5) for i in range(5)]
                                  + [_ev(0, -100, "user_annotation", "ProfilerStep#1")]),
    "zero_length_steps": _kineto([_ev(i * 10, 5) for i in range(5)]
                                 + [_ev(i * 10, 0, "user_annotation", f"ProfilerStep#{i}") for i in range(5)]),
    "ts_int64_min": _kineto([_ev(i * 10, 5) for i in range(5)] + [_ev(-9223372036854775.808, 1)]),
    "ts_int64_max": _kineto([_ev(i * 10, 5) for i in range(5)] + [_ev(9223372036854775, 1)]),
    "dur_int64_max": _kineto([_ev(i * 10, 5) for i in range(5)] + [_ev(0, 9223372036854775)]),
    "base_time_int64_max": _kineto([_ev(i * 10, 5) for i in range(5)], baseTimeNanoseconds=2**63 - 10),
    "ts_1e300": _kineto([_ev(1e300, 5)]),
    "ts_nan": _kineto([_ev(5, 5)]).replace('"ts": 5', '"ts": NaN'),
    "dur_infinity": _kineto([_ev(5, 5)]).replace('"dur": 5', '"dur": Infinity'),
}


def _check(path: Path, json_out: bool = True) -> None:
    r = srtscope("diagnose", *(["--json"] if json_out else []), path)
    assert r.code in (0, 2), (r.code, r.stderr[-2000:])
    if r.code == 2:
        r.error_line(str(path))
    else:
        assert r.stderr.strip() == "", r.stderr[-2000:]   # no numpy overflow warnings either
        if json_out:
            assert json.loads(r.stdout)["verdict"]["bottleneck"]


@pytest.mark.parametrize("case", sorted(NSYS_CASES))
def test_degenerate_nsys(tmp_path, case):
    w = NsysWriter(tmp_path / f"{case}.sqlite")
    NSYS_CASES[case](w)
    _check(w.close())


@pytest.mark.parametrize("case", sorted(KINETO_CASES))
def test_degenerate_kineto(tmp_path, case):
    p = tmp_path / f"{case}.json"
    p.write_text(KINETO_CASES[case])
    _check(p)


@pytest.mark.parametrize("case", ["all_at_one_time", "sched_zero_length_api", "kernel_far_back"])
def test_degenerate_terminal_report(tmp_path, case):
    w = NsysWriter(tmp_path / f"{case}.sqlite")
    NSYS_CASES[case](w)
    _check(w.close(), json_out=False)


def test_times_beyond_int64_room_are_refused(tmp_path):
    w = NsysWriter(tmp_path / "t.sqlite")
    _extra(K, I64_MIN, I64_MIN + 1_000)(w)
    with pytest.raises(TraceError, match="time values out of range"):
        load_timeline([w.close()])
    w = NsysWriter(tmp_path / "u.sqlite")
    _extra(K, -MAX_ABS_NS, -MAX_ABS_NS + 10)(w)
    with pytest.raises(TraceError, match="the events span"):
        load_timeline([w.close()])


STAGES = ["loop.step", "sched.schedule", "prep.batch", "run.eager", "run.graph_replay", "sched.result",
          "ProfilerStep#1", "comm.all_reduce"]
KERNELS = ["gemm", "ncclDevKernel_AllReduce"]
CALLS = ["cudaLaunchKernel", "cudaStreamSynchronize", "cudaGraphLaunch", "cudaMemcpyAsync", "cudaDeviceSynchronize"]


def test_degenerate_timelines_diagnose():
    """Random tiny timelines where every event sits at one or a few instants and most last 0 ns:
    the analyses complete (no IndexError, no ZeroDivisionError, no numpy warning)."""
    import warnings

    rnd = random.Random(6)
    for _ in range(400):
        mode = rnd.choice(["same", "zero", "few"])
        times = {"same": [5.0], "few": [5.0, 5.001, 5.002], "zero": [0, 1, 5, 8]}[mode]
        durations = [0] if mode in ("same", "zero") else [0, 0, 0.001, 1]

        def t(times: list = times) -> float:
            return rnd.choice(times)

        def d(durations: list = durations) -> float:
            return rnd.choice(durations)

        dev = [kernel(s, s + d(), rnd.choice(KERNELS), corr=rnd.randint(-1, 3), stream=rnd.choice([7, 8]),
                      rank=rnd.choice([0, 0, 1]), kind=rnd.choice(["kernel", "kernel", "memcpy"]))
               for s in (t() for _ in range(rnd.randint(1, 5)))]
        calls = [api(s, s + d(), rnd.choice(CALLS), corr=rnd.randint(-1, 3), rank=rnd.choice([0, 0, 1]))
                 for s in (t() for _ in range(rnd.randint(0, 4)))]
        ranges = [rng(s, s + d(), rnd.choice(STAGES), rank=rnd.choice([0, 0, 1]),
                      **rnd.choice([{}, {"step": 1, "mode": "decode", "bs": 0}]))
                  for s in (t() for _ in range(rnd.randint(0, 4)))]
        ranks = sorted({r["rank"] for r in dev + calls + ranges})
        tl = timeline(dev, calls, ranges, ranks=ranks)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            diagnose(tl)
