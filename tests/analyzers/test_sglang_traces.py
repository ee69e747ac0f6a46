"""Real SGLang traces (sample_traces/sglang/, made by its make.sh: SGLang 0.5.23 on the CPU, its own
profiler with activities CPU and no stacks, offline and as a server, busy-waits injected into SGLang's
own functions) read, stepped and diagnosed as their generating command says — without SGLang.

Ground truth: each busy-wait sits in a ``srtscope.rig.inject`` range of the trace, and the driver
measured the time inside every one (``manifest_<mode>.json``, ``inside_fault_ns``), apart from it."""
import json
from pathlib import Path

import numpy as np
import pytest

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model import intervals as iv
from srtscope.analyzers.readers import load_timeline

SGLANG = Path(__file__).resolve().parents[2] / "sample_traces" / "sglang"
MODES = ("offline", "server")
MS = 1_000_000
#: fault -> (class, cause) it must be named as
EXPECT = {"sched": ("scheduler", "sched_cpu"), "sched4": ("scheduler", "sched_cpu"), "prep": ("prep", "batch_prep")}
_CACHE: dict[tuple[str, str], tuple] = {}


def _read(mode: str, run: str):
    if (mode, run) not in _CACHE:
        tl = load_timeline(SGLANG / f"sglang_{mode}_{run}.trace.json.gz")
        _CACHE[(mode, run)] = (tl, diagnose(tl).to_json())
    return _CACHE[(mode, run)]


def _manifest(mode: str) -> dict:
    return json.loads((SGLANG / f"manifest_{mode}.json").read_text())


def _inside_steps(tl, d) -> int:
    """The injected busy-waits' time inside the diagnosed steps, ns (a fire in the turn after the
    last forward belongs to no step)."""
    per = d["steps"]["per_step"]
    window = (np.array([min(s["start_ns"] for s in per)]), np.array([max(s["start_ns"] + s["wall_ns"] for s in per)]))
    rg = tl.host_ranges
    inj = rg[rg["name"].astype(str).str.startswith("srtscope.rig.inject")]
    return int(iv.overlap(window, inj["start_ns"].to_numpy(), inj["end_ns"].to_numpy()).sum())


@pytest.mark.parametrize("mode", MODES)
def test_the_traces_say_how_they_were_made(mode):
    m = _manifest(mode)
    assert (m["sglang"], m["mode"], m["tokens"], m["requests"]) == ("0.5.23", mode, 8, 4)
    assert "sglang_driver.py" in m["command"] and "no stacks" in m["profiler"]
    runs = {r["name"]: r for r in m["runs"]}
    assert set(runs) == {"clean", "sched", "prep", "sched4"}
    assert runs["clean"]["fired"] == 0 and runs["clean"]["inside_fault_ns"] == 0
    # every-step faults fire once a step (a prefill split in two is two steps); sched4 every 4th call
    assert all(runs[f]["fired"] >= 7 for f in ("sched", "prep")) and runs["sched4"]["fired"] >= 1
    for f in ("sched", "prep", "sched4"):        # what was measured inside the busy-waits, ns
        assert runs[f]["inside_fault_ns"] >= runs[f]["fired"] * runs[f]["delay_ms"] * MS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("run", ["clean", "sched", "prep", "sched4"])
def test_read_and_stepped_from_sglangs_own_ranges(mode, run):
    tl, d = _read(mode, run)
    codes = [w["code"] for w in d["capture"]["warnings"]]
    # no device on the CPU: the forward's step[...] spans stand in, and the sampling run_batch does
    # after each (the model's work, no range of its own), and the capture says so
    assert "cpu_stand_in" in codes
    names = tl.device["name"].astype(str)
    assert {n.split(" ")[0][:5] for n in names.unique()} == {"step[", "sched"}
    assert set(names[~names.str.startswith("step[")]) == {"scheduler.run_batch after the forward"}
    assert (names == "scheduler.run_batch after the forward").sum() == (names.str.startswith("step[")).sum()
    # the trailing process_input_requests that held the profiler's stop is cut, with a note
    stop = [w["message"] for w in d["capture"]["warnings"] if w["code"] == "profiler_stop"]
    assert len(stop) == 1 and "scheduler.process_input_requests" in stop[0]
    st = d["steps"]
    modes = [s["mode"] for s in st["per_step"]]
    # 8 tokens a request: the prefill (one step, or two when the requests arrive apart) and 7 decodes,
    # each step's mode and batch size read from its step[MODE bs=N] span
    assert st["source"] == "sglang" and modes.count("decode") == 7 and set(modes) == {"extend", "decode"}
    assert sum(s["bs"] for s in st["per_step"] if s["mode"] == "extend") == 4
    assert all(s["bs"] == 4 for s in st["per_step"] if s["mode"] == "decode")
    assert d["eager"]["eager_decode_steps"] == 0             # nothing is an eager fallback on the CPU


@pytest.mark.parametrize("mode", MODES + ("offline_sampled",))
def test_a_clean_run_is_not_accused(mode):
    _, d = _read(mode, "clean")
    n = d["steps"]["count"]
    assert d["verdict"]["bottleneck"] not in ("scheduler", "prep")
    assert d["verdict"]["scores_ns"].get("scheduler", 0) / n < 2 * MS
    assert d["verdict"]["scores_ns"].get("prep", 0) / n < 2 * MS


@pytest.mark.parametrize("mode, fault", [(m, f) for m in MODES for f in ("sched", "prep", "sched4")]
                         + [("offline_sampled", "prep")])
def test_an_injected_fault_is_named_and_recovered_within_15_percent(mode, fault):
    tl, d = _read(mode, fault)
    _, clean = _read(mode, "clean")
    cls, cause = EXPECT[fault]
    assert (d["verdict"]["bottleneck"], d["verdict"]["cause"]) == (cls, cause)
    n, n_clean = d["steps"]["count"], clean["steps"]["count"]
    injected = _inside_steps(tl, d) / n
    run = next(r for r in _manifest(mode)["runs"] if r["name"] == fault)
    if fault != "sched4":       # every-step faults: all fires but the finishing turn's lie in the steps
        assert injected * n >= 0.7 * run["inside_fault_ns"]
    recovered = d["verdict"]["causes_ns"][cause] / n - clean["verdict"]["causes_ns"].get(cause, 0) / n_clean
    assert abs(recovered - injected) <= 0.15 * injected, (recovered / MS, injected / MS)


def test_sglangs_sampling_after_the_forward_is_the_models_work():
    """The offline_sampled set: SGLang's default sampling (temperature 1) draws each step's tokens in
    run_batch after the step[...] forward, with no range of its own. That time stands in for the
    device beside the forward (a GPU samples with kernels); the clean run is healthy, its batch
    preparation the build before the forward alone."""
    m = _manifest("offline_sampled")
    assert m["sampling"] == "default" and "--sampling default" in m["command"]
    tl, d = _read("offline_sampled", "clean")
    names = tl.device["name"].astype(str)
    after = tl.device[names == "scheduler.run_batch after the forward"]
    n = d["steps"]["count"]
    sampling = int((after["end_ns"] - after["start_ns"]).sum()) / n
    prep = d["verdict"]["scores_ns"].get("prep", 0) / n
    assert d["verdict"]["healthy"] and d["verdict"]["bottleneck"] == "kernel"
    assert sampling > 2 * prep, (sampling / MS, prep / MS)      # what had been read as preparation
