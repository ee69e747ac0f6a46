"""Ranges: nesting and ordering, threads kept apart, attributes, decorator, disabled cost path."""
import threading

from srtscope.probes import ranges
from srtscope.probes.ranges import record_span, stage


def test_nesting_order_and_depth(recorder):
    with stage("loop.step", step=0):
        with stage("sched.schedule"):
            pass
        with stage("prep.batch"):
            with stage("sync.wait"):
                pass
    spans = recorder.spans()
    assert [s.name for s in spans] == ["loop.step", "sched.schedule", "prep.batch", "sync.wait"]
    assert [s.depth for s in spans] == [0, 1, 1, 2]
    outer = spans[0]
    for inner in spans[1:]:
        assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
    assert spans[1].end_ns <= spans[2].start_ns


def test_attributes_round_trip_and_late_set(recorder):
    with stage("loop.step", step=7) as r:
        r.set(mode="decode", bs=32)
    (span,) = recorder.spans()
    assert span.attrs == {"step": 7, "mode": "decode", "bs": 32}
    assert span.rank == 0 and span.pid > 0 and span.tid > 0


def test_threads_kept_apart(recorder):
    barrier = threading.Barrier(3)

    def work(tag):
        barrier.wait()
        for i in range(50):
            with stage("sched.schedule", tag=tag, i=i):
                with stage("prep.batch", tag=tag):
                    pass

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = recorder.spans()
    assert len(spans) == 300
    by_tid = {}
    for s in spans:
        by_tid.setdefault(s.tid, set()).add(s.attrs["tag"])
    assert len(by_tid) == 3 and all(len(tags) == 1 for tags in by_tid.values())
    # nesting depth is per thread: every prep.batch is depth 1, every sched.schedule depth 0
    assert {s.depth for s in spans if s.name == "prep.batch"} == {1}
    assert {s.depth for s in spans if s.name == "sched.schedule"} == {0}


def test_decorator_checks_enabled_at_call_time(recorder):
    ranges.disable()

    @stage("run.sample", kind="greedy")
    def sample(x):
        return x + 1

    assert sample(1) == 2
    assert recorder.spans() == []
    ranges.enable(nvtx=False)
    assert sample(2) == 3
    (span,) = recorder.spans()
    assert span.name == "run.sample" and span.attrs == {"kind": "greedy"}


def test_disabled_records_nothing(recorder):
    ranges.disable()
    with stage("sched.schedule", bs=1) as r:
        r.set(bs=2)
    record_span("run.eager", 1, 2)
    assert recorder.spans() == []


def test_exception_inside_range_still_closes_it(recorder):
    try:
        with stage("sched.result"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with stage("sched.recv"):
        pass
    assert [(s.name, s.depth) for s in recorder.spans()] == [("sched.result", 0), ("sched.recv", 0)]


def test_nvtx_enabled_path_records_the_same(recorder):
    ranges.enable(nvtx=True)  # without a collector attached the NVTX calls are cheap no-ops
    with stage("sched.schedule", bs=4):
        pass
    (span,) = recorder.spans()
    assert span.name == "sched.schedule" and span.attrs == {"bs": 4}


def _annotations(prof) -> list[tuple[str, int]]:
    return [(e.name, e.thread) for e in prof.events() if e.name.startswith(("sched.", "prep."))]


def test_torch_annotations_name_stages_in_a_kineto_capture(recorder):
    # scenario: `capture --backend torch` turns annotations on, so the Kineto trace names our stages
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges.torch_annotations(True)
        try:
            with stage("sched.schedule", bs=4):
                torch.ones(4) + 1
            with stage("prep.batch"):
                pass
        finally:
            ranges.torch_annotations(False)
        with stage("sched.schedule", bs=8):  # after the capture turned it off: recorder only
            pass
    assert [n for n, _ in _annotations(prof)] == ["sched.schedule bs=4", "prep.batch"]
    assert [s.name for s in recorder.spans()] == ["sched.schedule", "prep.batch", "sched.schedule"]


def test_torch_annotations_take_the_cheap_calls_and_fall_back_on_older_torch():
    # scenario: the bare torch.ops exit costs ~20 µs a range (its __torch_function__ dispatch): the
    # autograd entry points where torch has them, else the ops with that dispatch switched off
    from types import SimpleNamespace

    log: list[tuple] = []

    class NoDispatch:
        def __enter__(self):
            log.append(("no_dispatch", "on"))

        def __exit__(self, *exc):
            log.append(("no_dispatch", "off"))

    exit_op = SimpleNamespace(_RecordFunction=lambda h: log.append(("op_exit", h)))
    ops = SimpleNamespace(profiler=SimpleNamespace(
        _record_function_enter_new=lambda name, args: log.append(("op_enter", name)) or "h",
        _record_function_exit=exit_op))
    new = SimpleNamespace(_record_function_with_args_enter=lambda name: log.append(("enter", name)) or "h",
                          _record_function_with_args_exit=lambda h: log.append(("exit", h)))
    for autograd, want in ((new, [("enter", "prep.batch"), ("exit", "h")]),
                           (SimpleNamespace(), [("op_enter", "prep.batch"), ("no_dispatch", "on"),
                                                ("op_exit", "h"), ("no_dispatch", "off")])):
        log.clear()
        fake = SimpleNamespace(autograd=autograd, ops=ops, _C=SimpleNamespace(DisableTorchFunctionSubclass=NoDispatch))
        enter, leave = ranges._record_function_calls(fake)
        leave(enter("prep.batch", None))
        assert log == want


def test_torch_annotations_off_without_a_capture(recorder):
    # scenario: a plain `srtscope run` pays no record_function cost and emits no annotation
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with stage("sched.schedule", bs=4):
            torch.ones(4) + 1
    assert _annotations(prof) == []
    assert len(recorder.spans()) == 1


def test_recorded_spans_give_the_gc_nothing_to_scan(recorder):
    # scenario: a long run records millions of spans; none may stay tracked by Python's GC, or every
    # full collection rescans them all (benchmarks/probe_overhead.py measures the cost)
    import gc

    for i in range(100):
        with stage("loop.step", step=i, mode="decode"):
            pass
    gc.collect()
    assert not gc.is_tracked(recorder._spans[5]) and recorder._spans[5] == {"step": 0, "mode": "decode"}
    assert sum(gc.is_tracked(x) for x in recorder._spans) == 0
    assert len(recorder.spans()) == 100 and recorder.spans()[99].attrs["step"] == 99


def test_torch_annotation_cost_lies_inside_the_span(recorder, monkeypatch):
    # scenario: under a capture, record_function costs µs per range; charged outside the span it
    # would read as unannotated host time between stages and could flip the verdict
    from time import perf_counter_ns

    calls = []
    enter = lambda name, args: calls.append(("enter", name, perf_counter_ns())) or "handle"  # noqa: E731
    leave = lambda handle: calls.append(("exit", handle, perf_counter_ns()))  # noqa: E731
    monkeypatch.setattr(ranges._STATE, "torch_rf", (enter, leave))
    with stage("prep.batch", bs=2):
        pass
    (span,) = recorder.spans()
    (_, name, t_enter), (_, handle, t_exit) = calls
    assert name == "prep.batch bs=2" and handle == "handle"
    assert span.start_ns <= t_enter <= t_exit <= span.end_ns


def test_nvtx_status_says_why_it_is_off(monkeypatch):
    # scenario: a GPU machine without the nvtx package: ranges still record, and the run can say so
    import builtins

    real_import = builtins.__import__

    def no_nvtx(name, *args, **kwargs):
        if name == "nvtx":
            raise ModuleNotFoundError("No module named 'nvtx'")
        return real_import(name, *args, **kwargs)

    was = ranges.is_enabled()
    try:
        monkeypatch.setattr(builtins, "__import__", no_nvtx)
        assert ranges.enable(nvtx=True) is False
        assert ranges.nvtx_status() == "unavailable: ModuleNotFoundError: No module named 'nvtx'"
        ranges.enable(nvtx=False)
        assert ranges.nvtx_status() == "off"
    finally:
        monkeypatch.undo()
        ranges.enable(nvtx=False) if was else ranges.disable()


def test_nvtx_with_a_collector_pushes_and_pops_each_range(recorder, monkeypatch):
    # scenario: under nsys (a collector attached) every range is an NVTX push/pop with its message
    from tests.probes import _fake_nvtx

    domain = _fake_nvtx.install(monkeypatch, live=True)
    try:
        assert ranges.enable(nvtx=True) is True and ranges.nvtx_status() == "on"
        with stage("sched.schedule", bs=4):
            with stage("prep.batch"):
                pass
    finally:
        ranges.enable(nvtx=False)
    assert domain.calls == [("push", "sched.schedule bs=4"), ("push", "prep.batch"), ("pop", None), ("pop", None)]
    assert [(s.name, s.depth) for s in recorder.spans()] == [("sched.schedule", 0), ("prep.batch", 1)]


def test_nvtx_without_a_collector_is_idle(recorder, monkeypatch):
    # scenario: NVTX asked for (a CUDA run) but no nsys: nothing would receive the ranges, so no NVTX
    # call is made; the recorder gets the same spans and the run says NVTX is idle
    from tests.probes import _fake_nvtx

    domain = _fake_nvtx.install(monkeypatch, live=False)
    try:
        assert ranges.enable(nvtx=True) is True and ranges.nvtx_status() == "idle"
        with stage("sched.schedule", bs=4):
            pass
    finally:
        ranges.enable(nvtx=False)
    assert domain.calls == []
    (span,) = recorder.spans()
    assert span.name == "sched.schedule" and span.attrs == {"bs": 4}
    assert ranges.nvtx_status() == "off"
