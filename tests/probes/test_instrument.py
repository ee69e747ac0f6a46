"""``--instrument``: engine functions wrapped in stage ranges at import, on engines shaped by the
declared tables (``tests/probes/fake_engine.py``). The promises: each target's range appears with
its stage name, the program's results and exceptions are unchanged, a moved function or an
unknown version is one warning line, never an exception."""
from __future__ import annotations

import importlib
import sys

import pytest
from fake_engine import forget, write_fake_engine

from srtscope.probes import ranges
from srtscope.probes.engine_tables import ENGINES, SGLANG, VLLM, mode_of_token_counts
from srtscope.probes.instrument import WARNED_ENV, Instrumenter


@pytest.fixture
def engine_root(tmp_path, monkeypatch):
    """A folder on sys.path for a fake engine; its modules forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(WARNED_ENV, "")         # restored (removed) afterwards
    yield tmp_path
    for table in ENGINES.values():
        forget(table.package)
    importlib.invalidate_caches()


@pytest.fixture
def instrumented():
    made: list[Instrumenter] = []

    def make(table, warnings):
        inst = Instrumenter([table], warn=warnings.append).install()
        made.append(inst)
        return inst

    yield make
    for inst in made:
        inst.uninstall()


def _call(table, qualname_target, **kw):
    module = importlib.import_module(qualname_target.module)
    cls_name, _, meth = qualname_target.qualname.rpartition(".")
    obj = getattr(module, cls_name)() if cls_name else module
    return getattr(obj, meth)(**kw)


@pytest.mark.parametrize("table", [VLLM, SGLANG], ids=lambda t: t.name)
def test_every_declared_target_gets_its_stage_range(engine_root, recorder, instrumented, table):
    # scenario: a checked version with every declared function present; each one called once
    write_fake_engine(engine_root, table, table.checked[-1] + ".1")
    warnings: list[str] = []
    inst = instrumented(table, warnings)
    for t in table.targets:
        assert _call(table, t, x=1).who == t.qualname
    spans = [(name, attrs) for name, _s, _e, _tid, _d, attrs in recorder.raw_spans()]
    assert [name for name, _ in spans] == [t.stage.value for t in table.targets]
    for (_name, attrs), t in zip(spans, table.targets):
        assert (attrs or {}).items() >= t.attrs.items(), (t.where, attrs)
    assert warnings == []
    assert sum(inst.calls.values()) == len(table.targets)
    assert len(inst.patched) == len(table.targets) and inst.missing == []


def test_results_and_exceptions_pass_through_unchanged(engine_root, recorder, instrumented):
    # scenario: the same calls with and without instrumentation; one of them raises
    write_fake_engine(engine_root, VLLM, "0.32.0")
    from vllm.v1.core.sched.scheduler import Scheduler

    plain = Scheduler().update_from_output({"a": 1})
    with pytest.raises(ValueError) as plain_exc:
        Scheduler().update_from_output(fail=True)
    instrumented(VLLM, [])
    assert Scheduler().update_from_output({"a": 1}) == plain
    with pytest.raises(ValueError) as exc:
        Scheduler().update_from_output(fail=True)
    assert str(exc.value) == str(plain_exc.value) == "Scheduler.update_from_output failed"
    # the range of the call that raised is closed and recorded, and nothing stays open
    names = [r[0] for r in recorder.raw_spans()]
    assert names == ["sched.result", "sched.result"]
    assert ranges._thread_state().depth == 0
    assert Scheduler.update_from_output.__name__ == "update_from_output"


def test_disabled_ranges_record_nothing(engine_root, recorder, instrumented):
    write_fake_engine(engine_root, VLLM, "0.32.0")
    inst = instrumented(VLLM, [])
    ranges.disable()
    from vllm.v1.core.sched.scheduler import Scheduler

    assert Scheduler().schedule(3).x == 3
    assert recorder.raw_spans() == [] and inst.calls == {}


@pytest.mark.parametrize("version, skip, expected", [
    # a version the table was not checked against: one line naming it, all functions still wrapped
    ("9.1.0", (), ["vllm 9.1.0 is not a version srtscope's table was checked against"]),
    # a function that moved: one line naming it and its module
    ("0.32.0", ("Scheduler.update_from_output",),
     ["vllm.v1.core.sched.scheduler of vllm 0.32.0 has no Scheduler.update_from_output"]),
    # an optional target (present in some versions only) is not warned about
    ("0.32.0", ("EngineCore.step_with_batch_queue",), []),
])
def test_version_and_missing_functions_warn_once(engine_root, recorder, instrumented,
                                                 version, skip, expected):
    write_fake_engine(engine_root, VLLM, version, skip=skip)
    warnings: list[str] = []
    instrumented(VLLM, warnings)
    for t in VLLM.targets:
        if t.qualname not in skip:
            _call(VLLM, t)
    forget("vllm")                        # imported again (a second process of the tree): no repeat
    for t in VLLM.targets:
        if t.qualname not in skip:
            _call(VLLM, t)
    assert len(warnings) == len(expected), warnings
    for w, e in zip(warnings, expected):
        assert e in w and "\n" not in w
    assert len(recorder.raw_spans()) == 2 * (len(VLLM.targets) - len(skip))


def test_modules_imported_before_install_are_patched(engine_root, recorder, instrumented):
    write_fake_engine(engine_root, VLLM, "0.32.0")
    from vllm.v1.engine.core import EngineCore

    instrumented(VLLM, [])
    EngineCore().step()
    assert [r[0] for r in recorder.raw_spans()] == ["loop.step"]


def test_uninstall_restores_the_engine(engine_root, recorder):
    write_fake_engine(engine_root, SGLANG, "0.5.2")
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    original = ForwardBatch.__dict__["init_new"]
    inst = Instrumenter([SGLANG], warn=lambda m: None).install()
    assert ForwardBatch.__dict__["init_new"] is not original
    inst.uninstall()
    assert ForwardBatch.__dict__["init_new"] is original and inst._finder not in sys.meta_path


def test_class_and_static_methods_keep_their_kind(engine_root, recorder, instrumented):
    # scenario: SGLang's ForwardBatch.init_new is a classmethod in SGLang itself
    write_fake_engine(engine_root, SGLANG, "0.5.2")
    mod = importlib.import_module("sglang.srt.model_executor.forward_batch_info")

    def init_new(cls, x=0):
        return (cls.__name__, x)

    def helper(x):
        return x * 2

    mod.ForwardBatch.init_new = classmethod(init_new)
    mod.ForwardBatch.helper = staticmethod(helper)
    instrumented(SGLANG, [])
    assert mod.ForwardBatch.init_new(5) == ("ForwardBatch", 5)
    assert isinstance(mod.ForwardBatch.__dict__["init_new"], classmethod)
    assert mod.ForwardBatch.helper(4) == 8
    assert [(r[0], r[5]) for r in recorder.raw_spans()] == [("prep.batch", {"part": "lower"})]


@pytest.mark.parametrize("counts, mode", [
    ({"a": 1, "b": 1}, "decode"), ({"a": 7, "b": 9}, "extend"), ({"a": 7, "b": 1}, "mixed"),
    ({}, None), (None, None), ({"a": "x"}, None),
])
def test_mode_of_token_counts(counts, mode):
    assert mode_of_token_counts(counts) == mode


def test_step_mode_reaches_the_enclosing_step(engine_root, recorder, instrumented):
    # scenario: vLLM's EngineCore.step calls Scheduler.schedule; the step takes the schedule's mode
    write_fake_engine(engine_root, VLLM, "0.32.0")
    core = importlib.import_module("vllm.v1.engine.core")
    sched = importlib.import_module("vllm.v1.core.sched.scheduler")

    def step(self, x=0, **kw):
        return sched.Scheduler().schedule(x)

    core.EngineCore.step = step
    instrumented(VLLM, [])
    core.EngineCore().step({"r1": 12, "r2": 1})
    core.EngineCore().step({"r1": 1})
    by_name: dict = {}
    for name, _s, _e, _t, _d, attrs in recorder.raw_spans():
        by_name.setdefault(name, []).append((attrs or {}).get("mode"))
    assert by_name == {"loop.step": ["mixed", "decode"], "sched.schedule": ["mixed", "decode"]}
    # steps numbered in order, as the engine's own loop.step ranges are (diagnose --steps A:B)
    assert [(r[5] or {}).get("step") for r in recorder.raw_spans() if r[0] == "loop.step"] == [0, 1]


@pytest.fixture
def slow_turn(monkeypatch):
    """An idle turn is kept from 50 ms on (not 1 ms): a loaded test machine's pauses never reach it."""
    monkeypatch.setattr("srtscope.probes.engine_tables.IDLE_TURN_NS", 50_000_000)
    return 0.06


def test_sglang_batch_mode_from_forward_mode(engine_root, recorder, instrumented, slow_turn):
    write_fake_engine(engine_root, SGLANG, "0.5.2")
    instrumented(SGLANG, [])
    from sglang.srt.managers.scheduler import Scheduler

    Scheduler().get_next_batch_to_run("extend")
    Scheduler().get_next_batch_to_run("")         # a batch of no forward mode: no mode
    Scheduler().get_next_batch_to_run(None)       # no batch: the first idle turn after work, no mode
    Scheduler().get_next_batch_to_run(None)       # ... and the next idle turn: not recorded (own test)
    assert [(r[5] or {}).get("mode") for r in recorder.raw_spans()] == ["extend", None, None]


def test_sglang_forward_opens_with_its_batchs_mode_and_size(engine_root, recorder, instrumented):
    # scenario: ModelRunner.forward(forward_batch) — the range opens with the batch's mode and size (a
    # Kineto trace keeps only what a range opens with); a mode that is none of ours (a draft model's
    # TARGET_VERIFY) and a batch it cannot read give what they can
    from types import SimpleNamespace as NS

    write_fake_engine(engine_root, SGLANG, "0.5.2")
    instrumented(SGLANG, [])
    from sglang.srt.model_executor.model_runner import ModelRunner

    ModelRunner().forward(NS(forward_mode=NS(name="DECODE"), batch_size=8))
    ModelRunner().forward(NS(forward_mode=NS(name="TARGET_VERIFY"), batch_size=4))
    ModelRunner().forward(None)
    assert [r[5] or {} for r in recorder.raw_spans()] == [{"mode": "decode", "bs": 8}, {"bs": 4}, {}]


def test_a_later_monkeypatch_is_wrapped_again_at_the_next_step(engine_root, recorder, instrumented):
    # scenario: a fault injector replaces Scheduler.update_from_output after the instrumentation,
    # with a delay before it calls the (wrapped) original: the next engine step wraps it again, so
    # the sched.result range encloses the delay, once (no nested duplicate)
    import time

    write_fake_engine(engine_root, VLLM, "0.32.0")
    inst = instrumented(VLLM, [])
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    orig = Scheduler.update_from_output

    def slow(self, *a, **k):
        time.sleep(0.02)
        return orig(self, *a, **k)

    Scheduler.update_from_output = slow
    EngineCore().step()                          # the refresh happens here
    assert Scheduler().update_from_output(7).x == 7
    results = [(r[0], r[2] - r[1]) for r in recorder.raw_spans() if r[0] == "sched.result"]
    assert len(results) == 1 and results[0][1] >= 20_000_000
    assert inst.calls["sched.result"] == 1
    inst.uninstall()                             # no wrapper of ours is left behind
    assert not hasattr(Scheduler.__dict__["update_from_output"], "__srtscope_target__")


def test_a_step_inside_a_step_is_not_a_step_of_its_own(engine_root, recorder, instrumented):
    # scenario: vLLM's in-process engine: LLMEngine.step calls EngineCore.step, then processes the
    # outputs; the whole is one engine step (the output processing inside it)
    write_fake_engine(engine_root, VLLM, "0.32.0")
    from vllm._fake_out import HOOKS

    inst = instrumented(VLLM, [])
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor

    def llm_step(x):
        EngineCore().step()
        OutputProcessor().process_outputs()

    HOOKS["LLMEngine.step"] = llm_step
    LLMEngine().step()
    LLMEngine().step()
    spans = sorted(recorder.raw_spans(), key=lambda r: r[1])
    steps = [r for r in spans if r[0] == "loop.step"]
    assert [(r[5] or {}).get("step") for r in steps] == [0, 1] and inst.calls["loop.step"] == 2
    results = [r for r in spans if r[0] == "sched.result"]
    assert len(results) == 2 and all(s[1] <= r[1] and r[2] <= s[2] for s, r in zip(steps, results))


def test_the_engines_shutdown_runs_the_hook_first_and_is_restored(engine_root, recorder):
    # scenario: SGLang's Engine.shutdown SIGKILLs the scheduler: the capture asks for its trace first
    write_fake_engine(engine_root, SGLANG, "0.5.23")
    from sglang._fake_out import HOOKS
    from sglang.srt.entrypoints.engine import Engine

    original = Engine.__dict__["shutdown"]
    order: list[str] = []
    HOOKS["Engine.shutdown"] = lambda x: order.append("shutdown")
    inst = Instrumenter([SGLANG], warn=lambda m: None).install()
    inst.on_shutdown = lambda: order.append("hook")
    Engine().shutdown()
    inst.on_shutdown = lambda: 1 / 0                  # a failing hook never stops the shutdown
    Engine().shutdown()
    assert order == ["hook", "shutdown", "shutdown"]
    inst.uninstall()
    assert Engine.__dict__["shutdown"] is original


@pytest.mark.parametrize("shutdown", ["Engine.shutdown", "vllm.x:Engine.shutdown", "sglang.srt.engine:"])
def test_an_engines_shutdown_is_a_function_of_its_package(shutdown):
    from srtscope.probes.engine_tables import EngineTable

    with pytest.raises(ValueError, match="shutdown"):
        EngineTable(name="sglang", package="sglang", distributions=("sglang",), checked=("0.5",),
                    targets=SGLANG.targets, shutdown=shutdown)


def _sglang_turn(recv_x, batch_x, sleep_s=0.0):
    """One turn of SGLang's scheduler loop on the fake engine: receive, take in, pick a batch
    (``batch_x`` None: nothing to run, an idle turn)."""
    recv = importlib.import_module("sglang.srt.managers.scheduler_components.request_receiver")
    sched = importlib.import_module("sglang.srt.managers.scheduler")
    recv.SchedulerRequestReceiver().recv_requests(x=recv_x, sleep_s=sleep_s)
    sched.Scheduler().process_input_requests(x=recv_x)
    return sched.Scheduler().get_next_batch_to_run(x=batch_x)


def test_an_idle_sglang_turn_records_nothing(engine_root, recorder, instrumented, slow_turn):
    # scenario: SGLang's scheduler spins when idle (about 15,000 turns a second here): 500 idle turns
    # (the first kept: it follows the start), a slow idle turn (a poll over the line: its time is
    # worth seeing), 2 turns that run a decode batch, the first idle turn after them (kept: its start ends
    # the last step) and 100 more, and the loop's last polls (no decision: recorded as they are)
    write_fake_engine(engine_root, SGLANG, SGLANG.checked[-1] + ".1")
    instrumented(SGLANG, [])
    for _ in range(500):
        assert _sglang_turn(0, None) is None                 # results pass through unchanged
    _sglang_turn(0, None, sleep_s=slow_turn)
    assert _sglang_turn(1, "decode").who == "Scheduler.get_next_batch_to_run"
    _sglang_turn(0, "decode")
    for _ in range(101):
        _sglang_turn(0, None)
    importlib.import_module("sglang.srt.managers.scheduler").Scheduler().process_input_requests(x=0)
    spans = recorder.raw_spans()
    names = [n for n, *_ in spans]
    # 5 kept turns of recv, process, schedule: the first idle one, the slow idle one, the two busy
    # ones, the first idle one after them
    assert names.count("sched.schedule") == 5 and names.count("sched.recv") == 10, names
    modes = [a.get("mode") if a else None for n, _s, _e, _t, _d, a in spans if n == "sched.schedule"]
    assert modes == [None, None, "decode", "decode", None]
    # each kept turn's spans in order, the slow poll 2 ms or more
    slow = [e - s for n, s, e, *_ in spans if n == "sched.recv"][2]
    assert slow >= slow_turn * 1e9
    # the instrumenter's own pending polls are recorded once the loop has polled 64 times undecided
    for _ in range(70):
        importlib.import_module("sglang.srt.managers.scheduler").Scheduler().process_input_requests(x=0)
    assert [n for n, *_ in recorder.raw_spans()].count("sched.recv") >= 10 + 64


@pytest.mark.parametrize("profiling, kept", [(False, 3), (True, 30)])
def test_idle_turns_are_kept_while_a_torch_profiler_records_them(engine_root, recorder, instrumented,
                                                                 slow_turn, profiling, kept):
    # scenario: `--backend probe` turns torch annotations on (a profiler the engine runs itself sees
    # the stages); idle turns are dropped unless such a profiler is recording: its trace keeps them
    torch = pytest.importorskip("torch")
    write_fake_engine(engine_root, SGLANG, SGLANG.checked[-1] + ".1")
    instrumented(SGLANG, [])
    ranges.torch_annotations(True)
    try:
        if profiling:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                for _ in range(10):
                    _sglang_turn(0, None)
        else:
            for _ in range(10):
                _sglang_turn(0, None)
    finally:
        ranges.torch_annotations(False)
    assert len(recorder.raw_spans()) == kept          # 10 turns of 3 ranges each, or the first turn


class _Plan:
    """SGLang 0.5.23's NextBatchPlan, as far as the table reads it."""

    def __init__(self, batch):
        self.batch_to_run = batch
        self.running_batch = None


@pytest.mark.parametrize("result, idle", [
    (_Plan(None), True),            # 0.5.23: the loop spins with no batch to run
    (_Plan(object()), False),       # 0.5.23: a batch to run
    (None, True),                   # before 0.5.23: no batch
    (object(), False),              # before 0.5.23: the ScheduleBatch itself
])
def test_an_sglang_turn_is_idle_when_its_plan_runs_no_batch(result, idle):
    target = next(t for t in SGLANG.targets if t.qualname == "Scheduler.get_next_batch_to_run")
    assert target.turn == "decide" and target.idle_if is not None and target.idle_if(result) is idle
