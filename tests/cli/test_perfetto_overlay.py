"""``diagnose --perfetto`` overlays the source capture for every source (issue 29): our file merged
with the source's own events — Kineto with and without ``baseTimeNanoseconds`` (and on an epoch-µs
clock), nsys, a probe trace's Chrome export — puts each bubble between two device activities of the
source: its start on the end of one, its end on the start of the next."""
from __future__ import annotations

import bisect
import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from formats import check_perfetto
from typer.testing import CliRunner

from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
TOL_US = 0.01                 # the source's own precision: Kineto and Chrome write µs with 3 decimals


def _ours(trace: Path, tmp: Path) -> dict:
    out = tmp / "ours.json"
    r = CliRunner().invoke(app, ["diagnose", str(trace), "--perfetto", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(out.read_text())
    check_perfetto(doc, json.loads(r.stdout))
    return doc


def _kineto_device(path: Path) -> list[tuple[float, float]]:
    doc = json.load(gzip.open(path) if path.suffix == ".gz" else open(path))
    cats = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in cats]


def _nsys_device(path: Path) -> list[tuple[float, float]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        try:
            out += [(s / 1e3, e / 1e3) for s, e in con.execute(f"SELECT start, end FROM {table}")]
        except sqlite3.OperationalError:
            pass
    con.close()
    return out


def _chrome_device(path: Path) -> list[tuple[float, float]]:
    doc = json.loads(path.read_text())
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("name") in ("run.eager", "run.graph_replay", "comm.all_reduce")]


def _touch(ours: dict, device: list[tuple[float, float]], tol: float = TOL_US) -> int:
    """How many bubbles have a source activity ending at their start and one starting at their end."""
    bubbles = [e for e in ours["traceEvents"] if e.get("cat") == "bubble"]
    assert bubbles and device
    ends, starts = sorted(e for _, e in device), sorted(s for s, _ in device)

    def near(xs: list[float], x: float) -> float:
        i = bisect.bisect_left(xs, x)
        return min(abs(x - xs[j]) for j in (i - 1, i) if 0 <= j < len(xs))

    for b in bubbles:
        lo, hi = b["ts"], b["ts"] + b["dur"]
        assert near(ends, lo) <= tol, (b, near(ends, lo))
        assert near(starts, hi) <= tol, (b, near(starts, hi))
    return len(bubbles)


def test_kineto_with_base_time(tmp_path):
    trace = SAMPLES / "profiler_steps.json.gz"
    assert json.load(gzip.open(trace))["baseTimeNanoseconds"]
    ours = _ours(trace, tmp_path)
    assert ours["otherData"]["clock_offsets_ns"] == {"0": 1764460800000000000}
    assert _touch(ours, _kineto_device(trace)) > 3


@pytest.mark.parametrize("shift_us", [0, 1_711_964_646_000_000.0], ids=["relative", "epoch-us"])
def test_kineto_without_base_time(tmp_path, shift_us):
    src = json.load(gzip.open(SAMPLES / "profiler_steps.json.gz"))
    del src["baseTimeNanoseconds"]
    for e in src["traceEvents"]:
        if "ts" in e:
            e["ts"] = round(float(e["ts"]) + shift_us, 3)
    trace = tmp_path / "nobase.json"
    trace.write_text(json.dumps(src))
    ours = _ours(trace, tmp_path)
    assert ours["otherData"]["clock_offsets_ns"] == {"0": 0}
    # an epoch-µs clock has ~0.25 µs steps as a float: the source's own values carry the same rounding
    assert _touch(ours, _kineto_device(trace), TOL_US if not shift_us else 0.5) > 3


def test_kineto_ranks_with_their_own_base_times(tmp_path):
    files = []
    for rank, base in ((0, 1764460800000000000), (1, 1764460800250000000)):
        src = json.load(gzip.open(SAMPLES / "profiler_steps.json.gz"))
        src["baseTimeNanoseconds"] = base
        src["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        files.append(tmp_path / f"t.rank{rank}.json")
        files[-1].write_text(json.dumps(src))
    out = tmp_path / "ours.json"
    r = CliRunner().invoke(app, ["diagnose", *map(str, files), "--perfetto", str(out)])
    assert r.exit_code == 0, r.stderr
    ours = json.loads(out.read_text())
    assert ours["otherData"]["clock_offsets_ns"] == {"0": 1764460800000000000, "1": 1764460800250000000}
    for rank, f in enumerate(files):
        mine = {"traceEvents": [e for e in ours["traceEvents"] if e["pid"] == rank]}
        assert _touch(mine, _kineto_device(f)) > 3


def test_nsys(tmp_path):
    trace = SAMPLES / "prep_bound.sqlite"
    assert _touch(_ours(trace, tmp_path), _nsys_device(trace)) > 3


def test_real_kineto_with_base_time(tmp_path, real_traces):
    trace = real_traces / "kineto/hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz"
    ours = _ours(trace, tmp_path)
    assert ours["otherData"]["clock_offsets_ns"] == {"0": 1711964646000000000}
    assert _touch(ours, _kineto_device(trace)) > 10


def test_real_kineto_without_base_time(tmp_path, real_traces):
    trace = real_traces / "kineto/hta_alexnet_a100_single.json.gz"
    assert _touch(_ours(trace, tmp_path), _kineto_device(trace)) > 3


def test_real_nsys(tmp_path, real_traces):
    trace = real_traces / "nsys/saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite"
    assert _touch(_ours(trace, tmp_path), _nsys_device(trace)) > 3


def test_probe_trace_overlays_its_chrome_export(tmp_path, recorder):
    """A probe trace's bubbles sit between the forward spans of the Chrome file the engine writes."""
    import time

    from srtscope.probes.export import write_chrome_trace, write_probe_trace

    t = time.monotonic_ns()
    for i in range(6):                       # forward spans with host gaps between them
        s = t + i * 3_000_000
        recorder.add_span("run.eager", s, s + 2_000_000, tid=1)
        recorder.add_span("sched.schedule", s + 2_000_000, s + 2_900_000, tid=1)
    probe = write_probe_trace(recorder, tmp_path / "probe.rank0.json")
    chrome = write_chrome_trace(recorder, tmp_path / "chrome.rank0.json")
    assert _touch(_ours(Path(probe), tmp_path), _chrome_device(Path(chrome))) >= 5
