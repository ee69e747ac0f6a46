"""Probe-trace reader: files written with the real probes API, several ranks merged."""
from __future__ import annotations

import json
import time

import pytest

from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat, Traced, WarningCode
from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.analyzers.readers.detect import detect_format
from srtscope.probes import Recorder, stage
from srtscope.probes.export import probe_trace_name, write_probe_trace
from srtscope.probes.ranges import disable, enable
from srtscope.probes.recorder import set_recorder


@pytest.fixture
def recording():
    """Enable probes (no NVTX) with a fresh recorder per rank; restore afterwards."""
    old = set_recorder(Recorder())
    enable(nvtx=False)
    yield
    disable()
    set_recorder(old)


def _run_rank(tmp_path, rank: int, world: int, steps: int = 3):
    rec = Recorder(rank=rank, world_size=world)
    set_recorder(rec)
    for i in range(steps):
        with stage("loop.step", step=i, mode="decode", bs=4):
            with stage("sched.schedule", bs=4):
                time.sleep(0.0005)
            with stage("run.graph_replay" if i % 2 else "run.eager", bs=4) as r:
                with stage("comm.all_reduce", bytes=4096):
                    time.sleep(0.0002)
                r.set(padded_bs=8)
            with stage("sched.result"):
                pass
        rec.add_counter("gpu.util_pct", time.perf_counter_ns(), 50.0 + i, device=rank)
    return write_probe_trace(rec, tmp_path / probe_trace_name(rank))


def test_probe_trace_reads_into_timeline(tmp_path, recording):
    path = _run_rank(tmp_path, 0, 1)
    assert detect_format(path) is SourceFormat.PROBE
    tl = load_timeline([path])
    r = tl.ranges
    assert len(r) == 3 * 5 and set(r["domain"]) == {"srtscope"}
    step = r[r["name"] == "loop.step"].sort_values("start_ns")
    assert [a["step"] for a in step["attrs"]] == [0, 1, 2]
    fwd = r[r["name"].isin(["run.eager", "run.graph_replay"])]
    assert all(a["padded_bs"] == 8 for a in fwd["attrs"])         # set() at exit is kept
    d = tl.device
    assert set(d["kind"]) == {DeviceKind.CPU_FORWARD.value}
    assert sorted(d["name"].astype(str)) == sorted(["run.eager", "run.graph_replay", "run.eager"]
                                                   + ["comm.all_reduce"] * 3)
    assert tl.meta.has_warning(WarningCode.CPU_STAND_IN)
    assert tl.meta.traced == {Traced.NVTX, Traced.KERNELS, Traced.COUNTERS}
    assert list(tl.counters["value"]) == [50.0, 51.0, 52.0]
    outer = r.loc[r["name"] == "loop.step", "depth"]
    inner = r.loc[r["name"] == "comm.all_reduce", "depth"]
    assert inner.min() > outer.max()


def test_ranks_merged(tmp_path, recording):
    paths = [_run_rank(tmp_path, rk, 2) for rk in (1, 0)]
    tl = load_timeline([tmp_path])                     # a directory stands for its files
    assert tl.meta.ranks == [0, 1] and tl.meta.world_size == 2
    assert tl.device.groupby("rank").size().to_dict() == {0: 6, 1: 6}
    assert set(tl.device["device"]) == {0, 1}
    assert len(tl.meta.sources) == 2 and {str(p) for p in paths} == set(tl.meta.sources)


def test_probe_trace_without_forward_spans_needs_allow_no_kernels(tmp_path, recording):
    rec = Recorder()
    set_recorder(rec)
    with stage("sched.schedule"):
        pass
    path = write_probe_trace(rec, tmp_path / "p.json.gz")
    # a process that schedules but runs no forward (vLLM's engine core): the error says which to read
    with pytest.raises(TraceError, match="zero kernels .*only srtscope stages sched.schedule: the process "
                                         "that wrote it ran no model step.* merges them into NAME.json.gz"):
        load_timeline([path])
    tl = load_timeline([path], allow_no_kernels=True)
    assert tl.meta.has_warning(WarningCode.NO_KERNELS) and len(tl.ranges) == 1


@pytest.mark.parametrize("edit,msg", [
    (lambda d: d.update(version=99), "version 99 is not supported"),
    (lambda d: d["spans"].update(start_ns=[]), "column 'start_ns'"),
    (lambda d: d["spans"].update(name=[999] * len(d["spans"]["name"])), "outside the strings"),
    (lambda d: d.update(spans={}, counters={}), "empty trace"),
])
def test_bad_probe_traces(tmp_path, recording, edit, msg):
    doc = json.loads(_run_rank(tmp_path, 0, 1, steps=1).read_text())
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=msg) as ei:
        load_timeline([bad])
    assert str(ei.value).startswith(f"{bad}: ")


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("name", ["eng.pid7.json.gz", "eng.pid7.json"])
def test_stream_of_a_killed_process_is_read_with_a_warning(tmp_path, recording, name, cut):
    # scenario: a process flushed once a step and was SIGKILLed (an engine's shutdown); with
    # cut, in the middle of its fourth flush: three whole steps stay
    from srtscope.probes.export import ProbeStreamWriter
    from srtscope.probes.recorder import get_recorder

    path = tmp_path / name
    w = ProbeStreamWriter(get_recorder(), path)
    sizes = []
    for i in range(4):
        with stage("loop.step", step=i, mode="decode", bs=4):
            with stage("sched.schedule"):
                time.sleep(0.0003)
            with stage("run.eager", bs=4):
                time.sleep(0.0003)
        w.flush()
        sizes.append(path.stat().st_size)
    if cut:
        path.write_bytes(path.read_bytes()[:(sizes[2] + sizes[3]) // 2])
    tl = load_timeline([path])
    steps = tl.ranges[tl.ranges["name"] == "loop.step"]
    assert sorted(a["step"] for a in steps["attrs"]) == list(range(4 if not cut else 3))
    assert tl.meta.has_warning(WarningCode.ENDED_EARLY)
    (msg,) = [w.message for w in tl.meta.warnings if w.code == WarningCode.ENDED_EARLY]
    assert "without its exit flush" in msg and ("cut and dropped" in msg) == cut
    w.flush(final=True)                      # a process that ended normally: no warning
    if not cut:
        assert not load_timeline([path]).meta.has_warning(WarningCode.ENDED_EARLY)


def test_damage_before_a_streams_last_chunk_is_refused(tmp_path, recording):
    from srtscope.probes.export import ProbeStreamWriter
    from srtscope.probes.recorder import get_recorder

    path = tmp_path / "s.pid1.json"
    w = ProbeStreamWriter(get_recorder(), path)
    for _ in range(2):
        with stage("run.eager"):
            pass
        w.flush()
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second.replace(":", ";", 3) + "\n" + first + "\n")
    with pytest.raises(TraceError, match="not a valid srtscope-probe trace"):
        load_timeline([path])
