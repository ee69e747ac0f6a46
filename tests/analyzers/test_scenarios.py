"""Labelled sample traces: regenerated into tmp_path, read back through the nsys reader, diagnosed.

Each scenario asserts its verdict, its summary, the attributed time of the injected class (within
10% of what the scenario injects), and its own checks; the committed files must match the generator.
The hand-built captures (``capture_scenarios``) add expected capture warnings, the step source, and
``refused``: files that loading must refuse (no diagnosis then).
"""
import gzip
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from sample_traces import capture_scenarios, generate
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.analyzers.readers.errors import TraceError
from srtscope.engine.engine import Engine

COMMITTED = Path(generate.__file__).resolve().parent
NAMES = [s.name for s in generate.SCENARIOS] + list(capture_scenarios.NAMES)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample_traces")
    generate.generate(out)
    return out


@pytest.fixture(scope="module")
def expected(generated):
    return json.loads((generated / "expected.json").read_text())


@pytest.fixture(scope="module")
def diagnoses(generated, expected):
    return {n: diagnose(load_timeline([generated / f for f in e["files"]]))
            for n, e in expected.items() if not e.get("refused")}


@pytest.mark.parametrize("name", NAMES)
def test_verdict_and_attribution(name, expected, diagnoses, generated):
    e = expected[name]
    if e.get("refused"):
        with pytest.raises(TraceError, match=e["refused"]):
            load_timeline([generated / f for f in e["files"]])
        return
    d = diagnoses[name]
    v = d.verdict
    assert v.bottleneck == e["bottleneck"], v.summary
    assert v.cause == e["cause"], v.summary
    assert v.summary.startswith(e["summary_prefix"]), v.summary
    # the causes account for every lost bubble nanosecond
    assert sum(d.bubbles.by_cause.values()) == d.bubbles.total_ns
    if e["steps"] is not None:
        assert d.steps.count == e["steps"], d.steps.per_rank
    if e.get("steps_source"):
        assert d.steps.source == e["steps_source"]
    codes = {w["code"] for w in d.capture.warnings}
    assert set(e.get("warnings", ())) <= codes, codes
    for cls, ns in e["injected_ns"].items():
        got = d.bubbles.by_class[cls]
        assert abs(got - ns) <= 0.10 * ns, f"{cls}: attributed {got} ns vs injected {ns} ns"
    checks = e["checks"]
    if "straggler_rank" in checks:
        assert d.comm.straggler_rank == checks["straggler_rank"]
        assert d.comm.exposed_ns > 0.5 * d.comm.total_ns
    if "eager_reason" in checks:
        assert d.eager.eager_decode_steps == checks["eager_decode_steps"]
        assert set(d.eager.reasons) == {checks["eager_reason"]}
        assert d.eager.extra_ns > 0 and d.eager.eager_mean_launches > d.eager.graph_mean_launches
    if "healthy" in checks:
        assert v.healthy is checks["healthy"]
    else:
        assert not v.healthy
    _capture_checks(checks, d)


def _capture_checks(checks: dict, d) -> None:
    """The hand-built captures' checks, one line per key (absent keys are not checked)."""
    window = d.bubbles.window_ns
    for direction, gbps in checks.get("memcpy_gbps", {}).items():
        assert abs(d.device.memcpy[direction].gbps - gbps) <= 0.02 * gbps, d.device.memcpy[direction]
    for direction, nbytes in checks.get("memcpy_bytes", {}).items():
        assert d.device.memcpy[direction].bytes == nbytes
    if "exposed_memcpy_share_min" in checks:
        assert d.device.exposed_memcpy_ns >= checks["exposed_memcpy_share_min"] * d.device.busy_ns
    if "max_confidence" in checks:
        assert d.verdict.confidence <= checks["max_confidence"]
    if "comm_partial" in checks:
        comm = d.comm.to_json()
        assert comm["partial"] is checks["comm_partial"] and d.comm.total_ns > 0
        assert comm["skew_ns"] is None and comm["straggler_rank"] is None
    if "ranks" in checks:
        assert list(d.capture.ranks) == checks["ranks"]
        assert set(d.steps.per_rank) == set(checks["ranks"])
    if "step_numbers" in checks:
        assert d.steps.table["step"].tolist() == checks["step_numbers"]
    if "sub_threshold_share_min" in checks:
        assert d.bubbles.sub_threshold_ns >= checks["sub_threshold_share_min"] * window
    if "bubble_share_max" in checks:
        assert d.bubbles.total_ns <= checks["bubble_share_max"] * window


def test_no_nvtx_scenario_states_the_caveat(diagnoses):
    v = diagnoses["host_sync_bound"].verdict
    assert any(c.startswith("no_nvtx") for c in v.caveats)


def test_each_file_is_small(generated):
    for p in [*generated.glob("*.sqlite"), *generated.glob("*.json.gz")]:
        assert p.stat().st_size < 300_000, p.name


def test_refused_files_load_one_at_a_time(generated, expected):
    """Files refused together are each a valid trace: the refusal is about the set, not a file."""
    for e in expected.values():
        for f in e["files"] if e.get("refused") else ():
            assert len(load_timeline([generated / f]).device) > 0


def _fingerprint(path: Path) -> dict[str, tuple]:
    if path.name.endswith(".json.gz"):           # Kineto captures: the JSON, not the gzip header
        return {"sha256": (hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest(),)}
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        out = {}
        for t in tables:
            cols = {r[1] for r in con.execute(f"PRAGMA table_info({t})")}
            agg = "COUNT(*)" + (", SUM(start), SUM(end)" if {"start", "end"} <= cols else "")
            out[t] = tuple(con.execute(f"SELECT {agg} FROM {t}").fetchone())
        return out
    finally:
        con.close()


def test_committed_files_match_the_generator(generated, expected):
    committed = json.loads((COMMITTED / "expected.json").read_text())
    assert committed == expected, "sample_traces/expected.json is stale: run python -m sample_traces.generate"
    for e in expected.values():
        for f in e["files"]:
            assert (COMMITTED / f).is_file(), f"{f} not committed"
            assert _fingerprint(COMMITTED / f) == _fingerprint(generated / f), f"{f} differs from the generator"


def test_unknown_scenario_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario"):
        generate.generate(tmp_path, ("nope",))


# -- the reference engine's own probe traces (CPU): injected host delays come out as their class ----

@pytest.mark.parametrize("field, stage, bottleneck", [
    ("sched_us", "sched.schedule", "scheduler"),
    ("prep_us", "prep.batch", "prep"),
    ("result_us", "sched.result", "scheduler"),
])
def test_engine_probe_trace_injected_delay(tmp_path, recorder, field, stage, bottleneck):
    from srtscope.engine.config import EngineConfig, FaultInjection

    delay_us = 40_000                    # large against a tiny CPU forward: the verdict must name it
    cfg = EngineConfig(device="cpu", enable_probes=True, inject=FaultInjection(**{field: delay_us}))
    with Engine(cfg) as eng:
        eng.generate(["ab"], {"max_new_tokens": 5})
        paths = eng.write_traces(tmp_path)
    tl = load_timeline([paths["probe"]])
    d = diagnose(tl)
    assert d.verdict.bottleneck == bottleneck, d.verdict.summary
    assert next(iter(d.bubbles.by_stage)) == stage
    # every gap between two forwards holds one injected delay (sleep never returns early) ...
    names = tl.ranges["name"].astype(str)
    own = tl.ranges[names == stage]
    n = int((names == "run.eager").sum()) - 1
    assert n >= 3 and d.bubbles.by_stage[stage] >= 0.9 * n * delay_us * 1000
    # ... and attribution never exceeds what the trace's own ranges of that stage last
    assert d.bubbles.by_stage[stage] <= int((own["end_ns"] - own["start_ns"]).sum())
