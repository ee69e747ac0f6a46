"""The batched Kineto reader (msgspec in blocks, columns in numpy) gives the exact streaming reader's
Timeline, quirk for quirk; what it does not take falls back to that reader, whose answer or one-line
error stands; and a Kineto trace over ``--memory-budget`` is diagnosed in windows to the same JSON.
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import srtscope.analyzers.readers.kineto_stream as kstream
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from srtscope.analyzers.pipeline.stream import diagnose_streamed
from srtscope.analyzers.readers import TraceError, load_timeline, read_spilled
from srtscope.analyzers.readers.jsonstream import _parse_float, us_to_ns
from srtscope.analyzers.readers.kineto import _read_exact, read_kineto, read_kineto_batched
from srtscope.analyzers.readers.kineto_stream import Fallback
from srtscope.analyzers.readers.kineto_times import literals_ns, literals_ns_numpy
from srtscope.analyzers.traces import diagnose_traces

REPO = Path(__file__).resolve().parents[2]
REAL = REPO.parent / "shared" / "traces" / "real" / "kineto"
KINETO = (sorted(REAL.glob("*.json.gz")) if REAL.is_dir() else []) + [
    p for p in sorted((REPO / "sample_traces").glob("**/*.json.gz"))
    if "instrument" not in p.name and "probe" not in p.name]          # srtscope's probe traces are no Kineto
PARAMS = DiagnoseParams()


def _same(a, b) -> None:
    for t in ("device", "api", "ranges"):
        pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t))
    assert a.meta.extra == b.meta.extra and a.meta.warnings == b.meta.warnings
    assert a.meta.traced == b.meta.traced and a.meta.devices == b.meta.devices
    assert (a.meta.window_start_ns, a.meta.window_end_ns) == (b.meta.window_start_ns, b.meta.window_end_ns)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 32 KiB: every trace is decoded in many batches, cut between events."""
    monkeypatch.setattr(kstream, "BLOCK", 32 << 10)


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_batched_equals_exact_on_every_shared_trace(path: Path, small_blocks) -> None:
    _same(read_kineto_batched(path), _read_exact(path, 0))


def _write(tmp_path: Path, text: str, gz: bool = True) -> Path:
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    if gz:
        with gzip.open(p, "wt") as fh:
            fh.write(text)
    else:
        p.write_text(text)
    return p


QUIRKS = """{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU", "numSms": 8}],
 "traceEvents": [
  {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": "12.0004", "dur": 2},
  {"ph": "s", "cat": "ac2g", "id": 77, "pid": 1, "tid": 2, "ts": "12.0004", "name": "ac2g"},
  {"ph": "f", "cat": "ac2g", "id": 77, "pid": 0, "tid": 7, "ts": 15.5, "name": "ac2g", "bp": "e"},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 15.5, "dur": 4.0005,
   "args": {"device": 0, "stream": "stream 7"}},
  {"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 1695835543008415.1235, "dur": 1,
   "args": null},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": "0", "tid": 7, "ts": 16, "dur": "0.5e1",
   "args": {"correlation": 9, "bytes": 4096, "stream": "stream 8", "device": 0}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 11, "dur": 3, "args": {}},
  {"ph": "X", "cat": "cpu_op", "name": "run.eager", "pid": 1, "tid": 2, "ts": 11.25, "dur": 2},
  {"ph": "X", "cat": "python_function", "name": "x.py(1): f", "pid": 1, "tid": 2, "ts": 10, "dur": 9},
  {"ph": "X", "cat": "python_function", "pid": 1, "tid": 2, "ts": 10.5, "dur": 1},
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 2, "ts": 9},
  {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": 0, "tid": 7, "ts": 9, "dur": 30},
  {"ph": "X", "name": "no category", "pid": 1, "tid": 2, "ts": "x", "dur": 1},
  {"ph": "i", "cat": "kernel", "name": "instant", "pid": 1, "tid": 2, "ts": 3},
  {"name": "no ph"}, {},
  {"ph": "X", "cat": "Trace", "name": "whole", "pid": 1, "tid": 2, "ts": 1, "dur": 100}
 ],
 "distributedInfo": {"rank": 3, "world_size": 4}, "baseTimeNanoseconds": 1000000000}"""


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_quirks_read_in_batches_as_the_exact_reader_reads_them(tmp_path: Path, gz: bool, monkeypatch) -> None:
    """Decimal strings, exponents, ns decimals past 15 characters, flows standing in for
    ``args.correlation``, ``"stream 7"``, absent and null members, elements that are no event, a
    time that is not a number in a category nobody reads, the header after ``traceEvents``."""
    p = _write(tmp_path, QUIRKS, gz)
    got = read_kineto_batched(p)            # no Fallback: the batched path takes all of it
    _same(got, _read_exact(p, 0))
    assert list(got.device["correlation"]) == [77, 9, -1]
    assert list(got.device["stream"]) == [7, 8, 7] and got.meta.ranks == [3]
    assert got.meta.extra["kineto.thread_names"] == {"1:2": "main"}
    assert got.meta.extra["kineto.events"] == 18 and got.meta.extra["kineto.categories"][""] == 1
    assert int(got.device["start_ns"].iloc[-1]) == 1_695_835_543_008_415_124 + 1_000_000_000
    import srtscope.analyzers.readers.kineto_columns as kcols
    import srtscope.analyzers.readers.kineto_times as ktimes
    monkeypatch.setattr(kcols, "_FC", None)                  # without the C extensions: the same
    monkeypatch.setattr(ktimes, "_C", None)
    _same(read_kineto_batched(p), got)


@pytest.mark.parametrize("doc, says", [
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}, 0]}', None),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}', "without 'ts'"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1, '
     '"args": {"correlation": 1}}]}', "time is out of range or not a number"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}, ]}', "invalid JSON"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": [1]}]}',
     "AttributeError"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e400, "dur": 1, '
     '"args": {"correlation": 1}}]}', "out of range"),
])
def test_what_the_batched_path_does_not_take_the_exact_reader_reads(tmp_path: Path, doc: str, says: str | None) -> None:
    p = _write(tmp_path, doc)
    with pytest.raises(Fallback):
        read_kineto_batched(p)
    if says is None:
        _same(read_kineto(p), _read_exact(p, 0))
        return
    with pytest.raises(TraceError, match=says) as ei:
        load_timeline([p])
    assert str(ei.value).startswith(f"{p}: ") and "\n" not in str(ei.value)


def test_truncated_gzip_says_so_in_one_line(tmp_path: Path) -> None:
    whole = (REPO / "sample_traces" / "vllm" / "vllm_cpu_stack_sched.pt.trace.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt") as ei:
        load_timeline([p])
    assert "\n" not in str(ei.value)


def test_time_literals_in_bulk_as_one_by_one() -> None:
    lits = [b"0", b"12", b"4.07", b"0.0005", b"0.0015", b"1.0005", b"999999999999.9995", b"1695835543008415.123",
            b"1695835543008415.1235", b"1695835543008415", b"9223372036854775", b"99999999999999999", b"12.",
            b"-1.5", b"2.5e3", b'"12.5"', b"", b"1.2.3", b"123456789012345678901234567"]
    for ns, ok in (literals_ns(lits), literals_ns_numpy(lits)):
        for lit, v, k in zip(lits, ns.tolist(), ok.tolist()):
            if k:
                assert v == us_to_ns(json.loads(lit, parse_float=_parse_float)), lit
        assert ok.tolist() == [True] * 9 + [False] * 10 or ok.tolist() == [True] * 10 + [False] * 9
    assert literals_ns(lits)[1].tolist() == literals_ns_numpy(lits)[1].tolist()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> Path:
    """A trace of ``gen_kineto_stacks.py``: Python stacks, operators, launches, flows and kernels."""
    out = tmp_path_factory.mktemp("gen") / "stacks.json.gz"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_kineto_stacks.py"), "--events", "40000",
                    "--frames", "8", str(out)], check=True, capture_output=True, cwd=REPO)
    return out


def test_spilled_tables_are_the_whole_reads(stacks: Path, tmp_path: Path) -> None:
    tl = read_kineto(stacks)
    from srtscope.analyzers.spill.kineto_spill import KinetoSpilled, read_kineto_spilled
    with read_spilled(stacks, 0, tmp_path / "spill") as src:          # the readers' entry takes Kineto
        assert isinstance(src, KinetoSpilled) and src.device_rows == len(tl.device)
    with read_kineto_spilled(stacks, folder=tmp_path / "spill", chunk_rows=500, flush_rows=300) as src:
        for got, want in ((src.iter_device(), tl.device), (src.iter_api(), tl.api)):
            pd.testing.assert_frame_equal(pd.concat(list(got)), want, check_dtype=False)
        pd.testing.assert_frame_equal(src.ranges, tl.ranges)
        assert src.meta.extra == tl.meta.extra and src.meta.warnings == tl.meta.warnings
        assert src.extent().spans[0] == (int(tl.device["start_ns"].min()), int(tl.device["end_ns"].max()))
        assert diagnose_streamed(src, PARAMS, 700).to_json() == diagnose(tl, PARAMS).to_json()
    assert not list((tmp_path / "spill").iterdir())          # its files removed


def test_kineto_over_the_budget_is_diagnosed_in_windows(stacks: Path) -> None:
    """Through the one entry (``diagnose_traces``): a budget under the whole read's estimate takes
    the windowed path (it says so: its windows' model passes so small a budget) and gives the
    whole read's JSON."""
    notes: list[str] = []
    from srtscope.analyzers.traces import ReadHooks
    whole = diagnose_traces([stacks], PARAMS, None).diagnosis.to_json()
    got = diagnose_traces([stacks], PARAMS, 100 << 20, hooks=ReadHooks(note=notes.append))
    assert got.diagnosis.to_json() == whole and not got.cut
    assert any("diagnosis in windows holds" in n for n in notes), notes
    assert whole["steps"]["count"] >= 5 and whole["bubbles"]["count"] > 0


@pytest.mark.parametrize("path", [p for p in KINETO if p.stat().st_size < 500_000], ids=lambda p: p.name)
def test_without_the_c_extensions_the_same_timeline(path: Path, small_blocks, monkeypatch) -> None:
    """Where ``_kineto_fields`` / ``_kineto_times`` were not built, numpy and C-level maps do it."""
    import srtscope.analyzers.readers.kineto_columns as kcols
    import srtscope.analyzers.readers.kineto_times as ktimes
    with_c = read_kineto_batched(path)
    monkeypatch.setattr(kcols, "_FC", None)
    monkeypatch.setattr(ktimes, "_C", None)
    _same(read_kineto_batched(path), with_c)
