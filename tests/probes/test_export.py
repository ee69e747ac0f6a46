"""Exporters: probe-trace round trip, Chrome JSON validity, atomic writes."""
import gzip
import json
import os
import time

import pytest

from srtscope.probes import export
from srtscope.probes.ranges import stage


def _record(recorder):
    recorder.meta["device"] = "cpu"
    recorder.meta["engine_config"] = {"max_running_requests": 8}
    with stage("loop.step", step=0, mode="prefill") as r:
        with stage("run.eager", reason="no_cuda", bs=2):
            pass
        r.set(bs=2)
    recorder.add_counter("gpu.util_pct", 123, 55.0, device=0)


@pytest.mark.parametrize("name", ["probe.rank0.json", "probe.rank0.json.gz"])
def test_probe_trace_round_trip(recorder, tmp_path, name):
    _record(recorder)
    path = export.write_probe_trace(recorder, tmp_path / name)
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
    assert doc["format"] == "srtscope-probe" and doc["version"] == 1
    meta = doc["meta"]
    assert meta["rank"] == 0 and meta["world_size"] == 1 and meta["device"] == "cpu"
    assert meta["engine_config"] == {"max_running_requests": 8} and meta["host"]
    spans = doc["spans"]
    names = [doc["strings"][i] for i in spans["name"]]
    assert names == ["loop.step", "run.eager"]
    assert spans["attrs"][0] == {"step": 0, "mode": "prefill", "bs": 2}
    assert spans["depth"] == [0, 1]
    orig = recorder.spans()
    assert spans["start_ns"] == [s.start_ns for s in orig]
    assert spans["end_ns"] == [s.end_ns for s in orig]
    assert doc["counters"]["value"] == [55.0]


def test_chrome_trace_is_valid(recorder, tmp_path):
    _record(recorder)
    path = export.write_chrome_trace(recorder, tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["loop.step", "run.eager"]
    spans = recorder.spans()
    for e, s in zip(xs, spans):
        assert e["ts"] == pytest.approx(s.start_ns / 1000.0)
        assert e["dur"] == pytest.approx((s.end_ns - s.start_ns) / 1000.0)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    (c,) = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert c["args"] == {"value": 55.0}


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "probe.rank0.json"
    export.atomic_write_json(target, {"a": 1})

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        export.atomic_write_json(target, {"a": Unserialisable()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["probe.rank0.json"]  # no temp files left behind


def test_autoflusher_writes_last_complete_flush(recorder, tmp_path):
    target = tmp_path / "probe.rank0.json"
    flusher = export.AutoFlusher(recorder, target, interval_s=0.01).start()
    with stage("sched.recv"):
        pass
    flusher.stop()
    doc = json.loads(target.read_text())
    assert [doc["strings"][i] for i in doc["spans"]["name"]] == ["sched.recv"]
    with pytest.raises(ValueError, match="interval_s"):
        export.AutoFlusher(recorder, target, interval_s=0)


def _names(doc):
    return [doc["strings"][i] for i in doc["spans"]["name"]]


@pytest.mark.parametrize("name", ["p.pid1.json.gz", "p.pid1.json"])
def test_stream_appends_only_the_new_rows_and_reads_back_whole(recorder, tmp_path, name):
    # scenario: a process flushes twice while it runs, then once at exit
    path = tmp_path / name
    path.write_bytes(b"an older capture's file: the first chunk replaces it")
    w = export.ProbeStreamWriter(recorder, path)
    assert not w.flush()                               # nothing recorded: no file written
    with stage("sched.schedule"):
        pass
    assert w.flush()
    size = path.stat().st_size
    with stage("run.eager", bs=2):
        pass
    recorder.add_counter("gpu.util_pct", 7, 50.0)
    assert w.flush()
    os.utime(path, (0, 0))
    assert not w.flush() and path.stat().st_mtime > 0  # nothing new: only touched (the process is alive)
    assert w.flush(final=True) and w.chunks == 3       # the exit flush, empty, says the process ended
    raw = path.read_bytes()
    lines = (gzip.decompress(raw) if name.endswith(".gz") else raw).decode().splitlines()
    chunks = [json.loads(ln) for ln in lines]
    assert [(c["chunk"], c["final"], _names(c)) for c in chunks] == \
        [(0, False, ["sched.schedule"]), (1, False, ["run.eager"]), (2, True, [])]
    assert len(raw) > size                             # appended, the first chunk kept
    st = export.read_probe_stream(path)
    assert (st.chunks, st.final, st.cut, st.note(path)) == (3, True, "", "")
    assert _names(st.doc) == ["sched.schedule", "run.eager"] and st.doc["counters"]["value"] == [50.0]
    assert st.doc["meta"]["pids"] == [os.getpid()] and "chunk" not in st.doc


def test_stream_of_a_killed_process_keeps_its_whole_chunks(recorder, tmp_path):
    # scenario: SIGKILL mid-write: the last gzip member is cut; no exit flush ever came
    path = tmp_path / "k.pid9.json.gz"
    w = export.ProbeStreamWriter(recorder, path)
    for step in range(3):
        with stage("loop.step", step=step):
            pass
        w.flush()
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])
    st = export.read_probe_stream(path)
    assert st.chunks == 2 and not st.final and "unfinished gzip member" in st.cut
    assert [a["step"] for a in st.doc["spans"]["attrs"]] == [0, 1]
    note = st.note(path)
    assert note.startswith("k.pid9.json.gz: process ") and "without its exit flush" in note and "cut" in note
    path.write_bytes(whole)                            # killed between two flushes: nothing cut
    st = export.read_probe_stream(path)
    assert (st.chunks, st.final, st.cut) == (3, False, "")
    path.write_bytes(whole[:5])
    with pytest.raises(ValueError, match="no probe trace"):
        export.read_probe_stream(path)


def test_autoflusher_appends_while_the_process_runs(recorder, tmp_path):
    target = tmp_path / "a.pid1.json.gz"
    flusher = export.AutoFlusher(recorder, target, interval_s=0.01).start()
    with stage("sched.recv"):
        pass
    st = None
    for _ in range(1000):                             # flushed by the thread, with no stop
        try:
            st = export.read_probe_stream(target)     # (the file exists before its first write ends)
            break
        except (OSError, ValueError):
            time.sleep(0.01)
    assert st is not None and _names(st.doc) == ["sched.recv"] and not st.final
    flusher.stop()
    assert export.read_probe_stream(target).final


def test_probe_trace_name():
    assert export.probe_trace_name(3) == "probe.rank3.json"


def test_autoflusher_writes_soon_after_the_process_goes_quiet(recorder, tmp_path):
    # scenario: an engine's run ends and its shutdown may SIGKILL the process next: the rows left
    # are written within a few QUIET_S, not at the end of a long interval
    target = tmp_path / "q.pid1.json.gz"
    flusher = export.AutoFlusher(recorder, target, interval_s=60).start()
    try:
        with stage("run.eager"):
            pass
        t0 = time.monotonic()
        st = None
        while st is None and time.monotonic() - t0 < 30:
            try:
                st = export.read_probe_stream(target)  # (the file exists before its first write ends)
            except (OSError, ValueError):
                time.sleep(0.01)
        waited = time.monotonic() - t0
        assert st is not None and _names(st.doc) == ["run.eager"]
        assert waited < 30          # well before the 60 s interval
    finally:
        flusher.stop()
