"""The C ranges (probes/_fastrange.c) against the Python path: the same spans for the same code.

Each scenario runs once per implementation; their spans must agree exactly in everything but the
times (name, thread, depth, attributes, recording order per thread), and the times must be
CLOCK_MONOTONIC ns (``perf_counter_ns``) nested as the ranges were.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns

import pytest

from srtscope.probes import ranges
from srtscope.probes.ranges import record_span, stage
from srtscope.probes.recorder import Recorder, get_recorder, set_recorder
from tests.probes import _fake_nvtx

needs_c = pytest.mark.skipif(ranges._C is None, reason="C extension not built (or SRTSCOPE_PROBES_PURE=1)")
IMPLS = [pytest.param("C", marks=needs_c), "Python"]


# -- scenarios: each takes the recorder the test started with and returns the recorders to read ---

def nested(rec: Recorder) -> list[Recorder]:
    with stage("loop.step", step=0):
        with stage("sched.schedule"):
            pass
        with stage("prep.batch", part="alloc"):
            with stage("sync.wait"):
                pass
    return [rec]


def late_attrs(rec: Recorder) -> list[Recorder]:
    with stage("loop.step", step=7) as r:
        r.set(mode="decode", bs=32)
    with stage("sched.schedule") as r:      # attributes only from set()
        r.set(bs=4)
    with stage("prep.batch", bs=1) as r:    # set() overrides a given attribute
        r.set(bs=2)
    with stage("sync.wait") as r:           # an empty set() leaves no attributes: None
        r.set()
    with stage("run.eager", reason=None, big=2**70, f=1.5, s="x"):
        pass
    return [rec]


def exceptions(rec: Recorder) -> list[Recorder]:
    with pytest.raises(RuntimeError, match="boom"):
        with stage("sched.result", bs=3):
            with stage("prep.batch"):
                raise RuntimeError("boom")
    try:
        with stage("sched.recv") as r:
            r.set(caught=True)
            raise KeyError("k")
    except KeyError:
        pass
    with stage("loop.step"):                # depth back at 0 after both
        pass
    return [rec]


def decorated(rec: Recorder) -> list[Recorder]:
    @stage("run.sample", kind="greedy")
    def sample(x: int) -> int:
        with stage("sync.wait"):
            return x + 1

    @stage("sched.schedule")
    def schedule() -> None:
        sample(1)

    ranges.disable()

    @stage("prep.batch", part="attn")       # decorated while disabled, called enabled
    def later() -> str:
        return "ok"

    assert later() == "ok" and schedule() is None and rec.raw_spans() == []
    ranges.enable(nvtx=False)
    assert sample(2) == 3
    schedule()
    assert later() == "ok"
    return [rec]


def swapped(rec: Recorder) -> list[Recorder]:
    new = Recorder()
    with stage("loop.step", step=1):
        with stage("sched.schedule"):
            pass
        set_recorder(new)                   # looked up at exit: the outer span lands in `new`
        with stage("prep.batch"):
            pass
    set_recorder(rec)
    with stage("sched.result"):
        pass
    return [rec, new]


def cleared(rec: Recorder) -> list[Recorder]:
    with stage("loop.step", step=1):
        with stage("sched.schedule"):
            pass
        rec.clear()                         # the new list gets the outer span
        with stage("prep.batch"):
            pass
    return [rec]


def disabled(rec: Recorder) -> list[Recorder]:
    ranges.disable()
    with stage("sched.schedule") as r:
        r.set(bs=2)
    with stage("loop.step", step=1, mode="decode") as r:
        r.set(bs=2)

    @stage("run.sample", kind="greedy")
    def sample() -> int:
        return 1

    assert sample() == 1
    record_span("run.eager", 1, 2, reason="x")
    return [rec]


def threads(rec: Recorder) -> list[Recorder]:
    barrier = threading.Barrier(3)
    tids: dict[int, int] = {}

    def work(tag: int) -> None:
        tids[tag] = threading.get_native_id()
        barrier.wait()
        for i in range(20):
            with stage("sched.schedule", tag=tag, i=i):
                with stage("prep.batch", tag=tag) as r:
                    r.set(i=i)
                record_span("run.graph_replay", 5, 6, tag=tag)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    _THREAD_TIDS.update({tid: f"thread{tag}" for tag, tid in tids.items()})
    return [rec]


def record_span_depth(rec: Recorder) -> list[Recorder]:
    record_span("run.eager", 10, 20)
    with stage("loop.step"):
        with stage("run.graph_replay"):
            record_span("run.eager", 30, 40, reason="cuda_graph_off")
    return [rec]


def odd_calls(rec: Recorder) -> list[Recorder]:
    with stage(name="sched.recv", bs=1):    # the name as a keyword: handed to the Python stage()
        pass
    with pytest.raises(TypeError):
        stage()
    with pytest.raises(TypeError):
        stage("a", "b")
    r = stage("prep.batch", bs=1)           # kept after exit: still names itself and its attributes
    with r:
        pass
    assert r.name == "prep.batch" and r.attrs == {"bs": 1}
    return [rec]


def exit_stack(rec: Recorder) -> list[Recorder]:
    # contextlib calls the type's __enter__ / __exit__ unbound, with the range as first argument
    with contextlib.ExitStack() as stack:
        r = stack.enter_context(stage("loop.step", step=2))
        r.set(mode="decode")
        stack.enter_context(stage("sched.schedule"))
    with pytest.raises(ValueError):
        with contextlib.ExitStack() as stack:
            stack.enter_context(stage("sched.result"))
            raise ValueError
    return [rec]


def interleaved(rec: Recorder) -> list[Recorder]:
    # a generator (or coroutine) closes its range after one opened later: each range keeps its own
    # start, and depth counts what is open on the thread
    def gen():
        with stage("run.sample"):
            yield

    g = gen()
    next(g)
    with stage("sched.schedule"):
        next(g, None)
    return [rec]


SCENARIOS: dict[str, Callable[[Recorder], list[Recorder]]] = {
    f.__name__: f for f in (nested, late_attrs, exceptions, decorated, swapped, cleared, disabled, threads,
                            record_span_depth, odd_calls, exit_stack, interleaved)}
UNNESTED = {"interleaved"}
_THREAD_TIDS: dict[int, str] = {}


def run(scenario: str, impl: str) -> list[list[tuple]]:
    """Spans per recorder, times dropped after checking them; threads named, not numbered."""
    ranges.set_pure(impl == "Python")
    rec = Recorder()
    old = set_recorder(rec)
    ranges.enable(nvtx=False)
    _THREAD_TIDS.clear()
    _THREAD_TIDS[threading.get_native_id()] = "main"
    try:
        t_start = perf_counter_ns()
        recorders = SCENARIOS[scenario](rec)
        t_end = perf_counter_ns()
    finally:
        ranges.disable()
        set_recorder(old)
        ranges.set_pure(False)
    check_times([s for r in recorders for s in r.raw_spans()], t_start, t_end, scenario not in UNNESTED)
    out = []
    for r in recorders:
        spans = r.raw_spans()
        named = [(n, _THREAD_TIDS[tid], d, a) for (n, _, _, tid, d, a) in spans]
        # threads interleave differently from run to run: compare each thread's own order
        out.append(sorted(named, key=lambda s: s[1]))
    return out


def check_times(spans: list[tuple], t_start: int, t_end: int, nested: bool) -> None:
    """Ranges' times lie within the scenario's perf_counter_ns and nest as their depths say."""
    by_tid: dict[int, list[tuple]] = {}
    for s in spans:
        by_tid.setdefault(s[3], []).append(s)
    for own in by_tid.values():
        timed = [s for s in own if s[1] > 1000]     # record_span's made-up times apart
        for name, t0, t1, _, depth, _ in timed:
            assert t_start <= t0 <= t1 <= t_end, name
            if depth and nested:   # closed before its parent: some later span of this thread, one level up, holds it
                assert any(p[4] == depth - 1 and p[1] <= t0 and t1 <= p[2] for p in timed), name


@needs_c
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_implementations_record_the_same_spans(scenario):
    c, py = run(scenario, "C"), run(scenario, "Python")
    assert c == py
    if scenario == "disabled":
        assert c == [[]]
    else:
        assert any(c)


EXPECTED = {   # the Python path's answer, written out for a few scenarios (both paths must give it)
    "nested": [[("sched.schedule", "main", 1, None), ("sync.wait", "main", 2, None),
                ("prep.batch", "main", 1, {"part": "alloc"}), ("loop.step", "main", 0, {"step": 0})]],
    "late_attrs": [[("loop.step", "main", 0, {"step": 7, "mode": "decode", "bs": 32}),
                    ("sched.schedule", "main", 0, {"bs": 4}), ("prep.batch", "main", 0, {"bs": 2}),
                    ("sync.wait", "main", 0, None),
                    ("run.eager", "main", 0, {"reason": None, "big": 2**70, "f": 1.5, "s": "x"})]],
    "exceptions": [[("prep.batch", "main", 1, None), ("sched.result", "main", 0, {"bs": 3}),
                    ("sched.recv", "main", 0, {"caught": True}), ("loop.step", "main", 0, None)]],
    "swapped": [[("sched.schedule", "main", 1, None), ("sched.result", "main", 0, None)],
                [("prep.batch", "main", 1, None), ("loop.step", "main", 0, {"step": 1})]],
    "exit_stack": [[("sched.schedule", "main", 1, None), ("loop.step", "main", 0, {"step": 2, "mode": "decode"}),
                    ("sched.result", "main", 0, None)]],
    "interleaved": [[("run.sample", "main", 1, None), ("sched.schedule", "main", 0, None)]],
    "cleared": [[("prep.batch", "main", 1, None), ("loop.step", "main", 0, {"step": 1})]],
    "record_span_depth": [[("run.eager", "main", 0, None), ("run.eager", "main", 2, {"reason": "cuda_graph_off"}),
                           ("run.graph_replay", "main", 1, None), ("loop.step", "main", 0, None)]],
    "decorated": [[("sync.wait", "main", 1, None), ("run.sample", "main", 0, {"kind": "greedy"}),
                   ("sync.wait", "main", 2, None), ("run.sample", "main", 1, {"kind": "greedy"}),
                   ("sched.schedule", "main", 0, None), ("prep.batch", "main", 0, {"part": "attn"})]],
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scenario", EXPECTED)
def test_spans_as_expected(scenario, impl):
    assert run(scenario, impl) == EXPECTED[scenario]


@pytest.mark.parametrize("impl", IMPLS)
def test_threads_record_their_native_ids(impl):
    (spans,) = run("threads", impl)
    assert len(spans) == 3 * 20 * 3
    assert {s[1] for s in spans} == {"thread0", "thread1", "thread2"}  # every tid was a thread's native id
    for s in spans:
        assert s[3]["tag"] == int(s[1][-1])
        assert s[2] == {"prep.batch": 1, "sched.schedule": 0, "run.graph_replay": 1}[s[0]]


# -- the C path itself ----------------------------------------------------------------------------

@needs_c
def test_c_clock_is_perf_counter_ns():
    # the analyzers put these ns beside other clocks' (nsys, CUDA), converted to perf_counter_ns's
    clock = ranges._C.clock_ns
    for _ in range(1000):
        a = perf_counter_ns()
        b = clock()
        c = perf_counter_ns()
        assert a <= b <= c
    assert c - a < 10_000_000   # the same clock, not merely monotonic ones a constant apart


@needs_c
def test_c_span_times_lie_between_perf_counter_reads(recorder):
    a = perf_counter_ns()
    with stage("sched.schedule"):
        b = perf_counter_ns()
    c = perf_counter_ns()
    ((_, t0, t1, tid, depth, attrs),) = recorder.raw_spans()
    assert a <= t0 <= b <= t1 <= c and tid == threading.get_native_id() and depth == 0 and attrs is None


def _kind(obj: object) -> str:
    return type(obj).__module__.rsplit(".", 1)[-1] + "." + type(obj).__name__


@needs_c
@pytest.mark.parametrize("setup, expected", [
    ("disable", "_fastrange.NullRange"),
    ("recorder", "_fastrange.Range"),
    ("nvtx", "ranges._Range"),              # a collector attached: NVTX calls on the Python path
    ("nvtx_idle", "_fastrange.Range"),      # none attached: NVTX would be no-ops, the ranges stay in C
    ("torch", "ranges._Range"),
    ("pure", "ranges._Range"),
])
def test_which_path_a_range_takes(recorder, monkeypatch, setup, expected):
    # live NVTX, torch annotations and the forced pure path go to the Python ranges, the rest stays in C
    if setup == "disable":
        ranges.disable()
    elif setup in ("nvtx", "nvtx_idle"):
        _fake_nvtx.install(monkeypatch, live=setup == "nvtx")
        assert ranges.enable(nvtx=True)
    elif setup == "torch":
        monkeypatch.setattr(ranges._STATE, "torch_rf", (lambda name, args: None, lambda handle: None))
    elif setup == "pure":
        ranges.set_pure(True)
    try:
        assert _kind(stage("sched.schedule", bs=1)) == expected
        assert _kind(stage("sched.schedule")) == expected
    finally:
        ranges.set_pure(False)
        ranges.enable(nvtx=False)
    monkeypatch.undo()
    assert _kind(stage("sched.schedule")) == "_fastrange.Range"


@needs_c
def test_python_and_c_ranges_share_one_depth(recorder, monkeypatch):
    # torch annotations switched on inside a C range: the Python range nests under it, and back
    with stage("loop.step"):
        monkeypatch.setattr(ranges._STATE, "torch_rf", (lambda name, args: None, lambda handle: None))
        with stage("sched.schedule"):
            monkeypatch.undo()
            with stage("prep.batch"):
                pass
    assert [(n, d) for (n, _, _, _, d, _) in recorder.raw_spans()] == [
        ("prep.batch", 2), ("sched.schedule", 1), ("loop.step", 0)]
    assert ranges._thread_state() is ranges._C.thread_state()


@needs_c
def test_c_span_attrs_give_the_gc_nothing_to_scan(recorder):
    import gc

    for i in range(50):
        with stage("loop.step", step=i) as r:
            r.set(mode="decode")
    gc.collect()
    assert sum(gc.is_tracked(x) for x in recorder._spans) == 0


@needs_c
def test_enter_and_exit_bound_and_unbound(recorder):
    # the C types bind __enter__ / __exit__ themselves: check the calls a `with` does not make
    for r in (stage("a", x=1), ranges._C.stage("b")):
        kind = type(r)
        assert kind.__enter__(r) is r and r.__enter__ is not r.__enter__
        assert kind.__exit__(r, None, None, None) is None
        with pytest.raises(TypeError):
            r.__exit__(None)
        with pytest.raises(TypeError):
            kind.__enter__(object())
        with pytest.raises(TypeError):
            r.__enter__(1)
    ranges.disable()
    n = stage("c", y=2)
    assert type(n).__enter__(n) is n and n.__exit__(None, None, None) is None
    with pytest.raises(TypeError):
        type(n).__exit__(recorder, None, None, None)
    assert [(s[0], s[4], s[5]) for s in recorder.raw_spans()] == [("a", 0, {"x": 1}), ("b", 0, None)]


@needs_c
def test_many_ranges_reuse_objects_safely(recorder):
    # freed Ranges are recycled: one kept alive must not be reused under it
    kept = [stage("a", i=i) for i in range(100)]
    for r in kept:
        with r:
            with stage("b"):
                pass
    assert [r.attrs["i"] for r in kept] == list(range(100))
    spans = recorder.raw_spans()
    assert len(spans) == 200 and [s[5]["i"] for s in spans if s[0] == "a"] == list(range(100))


def test_pure_env_var_forces_the_python_path():
    code = ("from srtscope.probes import ranges; "
            "print(ranges.implementation(), ranges._C is None, ranges.stage is ranges._py_stage)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SRTSCOPE_PROBES_PURE": "1"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["Python", "True", "True"]


def test_implementation_names_the_path(recorder):
    assert ranges.implementation() == ("Python" if ranges._C is None else "C")
    assert ranges.set_pure(True) is True and ranges.implementation() == "Python"
    ranges.set_pure(False)
    assert get_recorder() is recorder
