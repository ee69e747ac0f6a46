"""Exporters: probe-trace round trip, Chrome JSON validity, atomic writes."""
import gzip
import json
import os

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


def test_probe_trace_name():
    assert export.probe_trace_name(3) == "probe.rank3.json"
