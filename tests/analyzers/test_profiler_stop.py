"""The profiler's own stop is never engine work: a Kineto trace's trailing range still open at the
stop (it ends at the ``Record Window End`` instant, holding nothing) is cut, with a note; ranges
open at the stop that hold work, or that are their thread's only range, stay."""
import gzip
import json

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.readers.kineto import read_kineto

MS = 1000.0          # µs per ms: Kineto times are µs


def _ann(name, ts_ms, dur_ms, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts_ms * MS,
            "dur": dur_ms * MS}


def _op(name, ts_ms, dur_ms, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts_ms * MS, "dur": dur_ms * MS}


def _sglang_loop(steps: int, stop_hold_ms: float) -> list[dict]:
    """SGLang 0.5.23's loop turns, 10 ms a step (8 ms forward), then the turn that handles
    stop_profile: its process_input_requests still open when the profiler stops."""
    ev, t = [], 0.0
    for _ in range(steps):
        ev += [_ann("scheduler.recv_requests", t, 0.2), _ann("scheduler.process_input_requests", t + 0.2, 0.1),
               _ann("scheduler.get_next_batch_to_run", t + 0.3, 0.5), _ann("scheduler.run_batch", t + 0.8, 8.6),
               _ann("step[DECODE bs=8]", t + 1.0, 8.0), _op("aten::mm", t + 2.0, 1.0),
               _ann("scheduler.process_batch_result", t + 9.4, 0.5)]
        t += 10.0
    ev += [_ann("scheduler.recv_requests", t, 0.2), _ann("scheduler.process_input_requests", t + 0.2, stop_hold_ms)]
    return ev


def _write(tmp_path, events, stop_ms):
    events = events + [{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": stop_ms * MS}]
    p = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"schemaVersion": 1, "traceEvents": events}, f)
    return p


def test_the_trailing_range_that_holds_the_stop_is_cut_with_a_note(tmp_path):
    # scenario: 6 steps of 10 ms, then a 700 ms process_input_requests open at the stop (SGLang's last
    # range: the stop_profile request is handled inside it)
    ev = _sglang_loop(6, 700.0)
    tl = load_timeline(_write(tmp_path, ev, 60.2 + 700.0))
    names = tl.host_ranges["name"].astype(str).tolist()
    assert names.count("scheduler.process_input_requests") == 6          # the 7th, open at the stop, is gone
    d = diagnose(tl).to_json()
    w = [x for x in d["capture"]["warnings"] if x["code"] == "profiler_stop"]
    assert len(w) == 1 and "scheduler.process_input_requests (700.0 ms)" in w[0]["message"]
    # the steps run to the last forward's turn: none holds the 700 ms, no scheduler loss from it
    assert d["steps"]["count"] == 6
    assert max(s["wall_ns"] for s in d["steps"]["per_step"]) < 11_000_000
    assert d["verdict"]["scores_ns"].get("scheduler", 0) / 6 < 2_000_000


def test_without_the_cut_the_stop_would_be_a_step_of_scheduler_time(tmp_path):
    # the same run with the profiler stopped right after the last turn: nothing is open at the stop
    ev = _sglang_loop(6, 0.1)
    tl = load_timeline(_write(tmp_path, ev, 70.0))
    assert "profiler_stop" not in [w.code.value for w in tl.meta.warnings]
    assert tl.host_ranges["name"].astype(str).tolist().count("scheduler.process_input_requests") == 7


def test_a_range_open_at_the_stop_that_holds_work_is_kept(tmp_path):
    # an outer range around the whole run (a ProfilerStep, a user's own annotation) ends at the stop too
    ev = [_ann("ProfilerStep#3", 0.0, 70.0)] + _sglang_loop(6, 0.1)
    tl = load_timeline(_write(tmp_path, ev, 70.0))
    assert "ProfilerStep#3" in tl.host_ranges["name"].astype(str).tolist()
    assert "profiler_stop" not in [w.code.value for w in tl.meta.warnings]


def test_a_threads_only_range_open_at_the_stop_is_kept(tmp_path):
    # a schedule-driven profiler's step marker on a thread of its own, holding nothing recorded
    ev = [_ann("ProfilerStep#1", 5.0, 65.0, tid=9), _op("aten::add", 6.0, 1.0, tid=2),
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 6.5 * MS, "dur": 100.0,
           "args": {"device": 0, "stream": 7, "correlation": 1}}]
    tl = read_kineto(_write(tmp_path, ev, 70.0))
    assert tl.host_ranges["name"].astype(str).tolist() == ["ProfilerStep#1"]
