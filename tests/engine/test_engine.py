"""Engine facade on the real tiny model (CPU): generate, bad input, equivalences, traces, faults."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from srtscope.engine.config import EngineConfig, FaultInjection
from srtscope.engine.engine import Engine
from srtscope.engine.runner.tp_worker import TpModelWorker
from srtscope.probes.recorder import get_recorder
from srtscope.probes.stages import Stage
from tests.engine.sched_helpers import byte_prompt

pytestmark = pytest.mark.usefixtures("probes_off")

torch.set_num_threads(1)

CFG = EngineConfig(device="cpu", max_total_tokens=2048, max_running_requests=16,
                   context_length=256, chunked_prefill_size=-1, enable_probes=False)


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(CFG)


def engine(worker, **kw) -> Engine:
    cfg = dataclasses.replace(CFG, **kw)
    return Engine(cfg, worker=worker)


SYSTEM = byte_prompt(7, 48)
PROMPTS = [SYSTEM + byte_prompt(i, n) for i, n in enumerate([3, 20, 9, 1, 31, 12])]


def outputs(eng: Engine, prompts=PROMPTS, **sp) -> list[list[int]]:
    sp = {"max_new_tokens": 6, **sp}
    with eng:
        outs = eng.generate(prompts, sp)
        eng.check_invariants()
    return [o.output_ids for o in outs]


def test_generate_text_and_token_ids(worker):
    eng = engine(worker)
    text_out, ids_out = eng.generate(["Hello, world", list(b"Hello, world")],
                                     {"max_new_tokens": 5})
    assert text_out.prompt_ids == ids_out.prompt_ids == list(b"Hello, world")
    assert text_out.output_ids == ids_out.output_ids and len(text_out.output_ids) == 5
    assert text_out.finish_reason["type"] == "length" and text_out.ttft_ms > 0
    assert len(text_out.itl_ms) == 4
    single = eng.generate("Hello, world", {"max_new_tokens": 5})
    assert single[0].output_ids == text_out.output_ids
    eng.check_invariants()


def test_decode_path_equals_full_recompute(worker):
    """Each greedy token from the engine (prefix cache, decode steps) equals a fresh prefill of
    prompt + outputs so far with no cache — the same checkpoint computed another way."""
    prompt = PROMPTS[1]
    got = outputs(engine(worker), [prompt], max_new_tokens=5)[0]
    ref, seq = [], list(prompt)
    for _ in range(5):
        tok = outputs(engine(worker, disable_radix_cache=True), [seq], max_new_tokens=1)[0][0]
        ref.append(tok)
        seq.append(tok)
    assert got == ref


def test_stop_token_from_the_stream(worker):
    eng = engine(worker)
    free = eng.generate([PROMPTS[0]], {"max_new_tokens": 6})[0].output_ids
    stop = free[3]
    out = eng.generate([PROMPTS[0]], {"max_new_tokens": 6, "stop_token_ids": [stop]})[0]
    assert out.output_ids == free[:free.index(stop) + 1]
    assert out.finish_reason == {"type": "stop_token", "matched": stop, "message": ""}
    eng.check_invariants()


def test_stop_string_from_the_stream(worker):
    eng = engine(worker)
    free = eng.generate(PROMPTS, {"max_new_tokens": 12})
    i, k = next((i, k) for i, o in enumerate(free) for k, t in enumerate(o.output_ids)
                if 32 < t < 127 and k > 0)
    stop = chr(free[i].output_ids[k])
    out = eng.generate([PROMPTS[i]], {"max_new_tokens": 12, "stop": [stop]})[0]
    first = free[i].output_ids.index(ord(stop))
    assert out.output_ids == free[i].output_ids[:first + 1]
    assert out.finish_reason == {"type": "stop_str", "matched": stop, "message": ""}
    eng.check_invariants()


@pytest.mark.parametrize("bad, field", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1] * 300}, "prompt"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"beam_width": 4}, "beam_width"),
])
def test_bad_request_fails_alone(worker, bad, field):
    eng = engine(worker)
    prompt = bad.pop("prompt", "fine")
    params = [{"max_new_tokens": 4}, {"max_new_tokens": 4, **bad}, {"max_new_tokens": 4}]
    prompts = ["a good prompt", prompt, "another good one"]
    with pytest.raises(ValueError, match=rf"^request 1: {field}: "):
        eng.generate(prompts, params)
    eng.check_invariants()                       # nothing was queued, nothing leaked
    outs = eng.generate(prompts, params, on_error="return")
    assert outs[1].error.startswith(f"{field}: ") and outs[1].output_ids == []
    assert [len(o.output_ids) for o in (outs[0], outs[2])] == [4, 4]
    eng.check_invariants()


def test_chunked_equals_unchunked(worker):
    want = outputs(engine(worker))
    assert outputs(engine(worker, chunked_prefill_size=16)) == want


def test_prefix_cache_on_equals_off(worker):
    on, off = engine(worker), engine(worker, disable_radix_cache=True)
    want = [outputs(off, [p]) for p in PROMPTS]
    got = [outputs(on, [p]) for p in PROMPTS]
    assert got == want
    assert on.stats.prefill_tokens < off.stats.prefill_tokens - 4 * len(SYSTEM)
    assert on.stats.cache_hit_rate > 0.5 and off.stats.cache_hit_rate == 0


def test_retraction_under_tiny_pool_equals_roomy(worker):
    prompts = [byte_prompt(i, 10) for i in range(5)]
    want = outputs(engine(worker), prompts, max_new_tokens=20)
    tiny = engine(worker, max_total_tokens=64, init_new_token_ratio=0.05,
                  min_new_token_ratio=0.0)
    assert outputs(tiny, prompts, max_new_tokens=20) == want
    assert tiny.stats.retractions > 0


def test_write_traces_has_every_scheduler_stage(worker, tmp_path):
    eng = engine(worker, enable_probes=True)
    get_recorder().clear()
    eng.generate(PROMPTS[:3], {"max_new_tokens": 4})
    paths = eng.write_traces(tmp_path)
    doc = json.loads(paths["probe"].read_bytes())
    assert doc["format"] == "srtscope-probe" and doc["meta"]["device"] == "cpu"
    assert doc["meta"]["engine_config"]["max_total_tokens"] == CFG.max_total_tokens
    names = {doc["strings"][i] for i in doc["spans"]["name"]}
    for st in (Stage.LOOP_STEP, Stage.SCHED_RECV, Stage.SCHED_SCHEDULE, Stage.PREP_BATCH,
               Stage.SCHED_RESULT, Stage.SYNC_WAIT, Stage.RUN_EAGER):
        assert st.value in names, st
    steps = [a for i, a in zip(doc["spans"]["name"], doc["spans"]["attrs"])
             if doc["strings"][i] == Stage.LOOP_STEP.value]
    assert {s["mode"] for s in steps} >= {"extend", "decode"}     # the ForwardMode values
    assert all({"step", "mode", "bs", "tokens"} <= set(s) for s in steps)
    chrome = json.loads(paths["chrome"].read_bytes())
    assert any(e.get("name") == Stage.LOOP_STEP.value for e in chrome["traceEvents"])
    eng.close()


def test_write_traces_needs_probes(worker, tmp_path):
    with pytest.raises(ValueError, match="^enable_probes: "):
        engine(worker).write_traces(tmp_path)


@pytest.mark.parametrize("field, stage_name", [
    ("sched_us", Stage.SCHED_SCHEDULE.value),
    ("prep_us", Stage.PREP_BATCH.value),
    ("result_us", Stage.SCHED_RESULT.value),
])
def test_fault_injection_lands_in_its_stage(worker, field, stage_name):
    eng = engine(worker, enable_probes=True, inject=FaultInjection(**{field: 3000}))
    get_recorder().clear()
    eng.generate(PROMPTS[:2], {"max_new_tokens": 3})
    spans = [s for s in get_recorder().spans() if s.name == stage_name and
             (stage_name != Stage.PREP_BATCH.value or "part" not in s.attrs)]
    assert spans and min(s.dur_ns for s in spans) >= 3_000_000
    others = [s for s in get_recorder().spans() if s.name in
              {Stage.SCHED_SCHEDULE.value, Stage.SCHED_RESULT.value} - {stage_name}]
    assert others and min(s.dur_ns for s in others) < 3_000_000
    eng.close()
