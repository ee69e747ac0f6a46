"""Gzip bombs and huge values (issue 14, item 7): whatever the inflated size, the streaming readers
stay bounded — a value, a whitespace run and a number literal are capped, probe traces are read
element by element — so a bomb is refused (exit 2, one line) or read, quickly and in bounded memory.

Bombs are streamed through gzip here (never held in memory). The suite inflates to
``INFLATED`` bytes (past every cap) in the CLI cases; ``SRTSCOPE_BOMB_BYTES=3221225472`` runs them
at 3 GiB (~5 s of writing each). The in-process cases lower the caps instead.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

import srtscope.analyzers.readers.jsonstream as jsonstream
import srtscope.analyzers.readers.probe as probe
from srtscope.analyzers.readers import TraceError, load_timeline
from tests.analyzers._cli import srtscope

INFLATED = int(os.environ.get("SRTSCOPE_BOMB_BYTES", 80 << 20))
MAX_RSS_MB = 500
MAX_S = 30
BLOCK = 1 << 20

KERNEL = b'{"ph":"X","cat":"kernel","name":"k","ts":%d,"dur":1,"args":{"device":0,"stream":7,"correlation":%d}}'
PROBE = b'{"format":"srtscope-probe","version":1,'

#: name -> (head, repeated filler, tail, what the refusal says)
SHAPES: dict[str, tuple[bytes, bytes, bytes, str]] = {
    "kineto_spaces_in_event": (b'{"traceEvents":[{"ph":"X","cat":"kernel",', b" ",
                               b'"name":"k","ts":1,"dur":1}]}', "a value longer than"),
    "kineto_spaces_between_events": (b'{"traceEvents":[', b" \n\t", KERNEL % (1, 1) + b"]}", "run of over"),
    "kineto_int_literal": (b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","dur":1,"ts":1', b"1", b"}]}",
                           "number literal too long"),
    "kineto_float_literal": (b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","dur":1,"ts":1.', b"1",
                             b"}]}", "number literal of over"),
    "kineto_string": (b'{"traceEvents":[{"ph":"X","cat":"kernel","dur":1,"ts":1,"name":"', b"a", b'"}]}',
                      "string unterminated or longer than"),
    "kineto_header_string": (b'{"schemaVersion":"', b"9", b'","traceEvents":[' + KERNEL % (1, 1) + b"]}",
                             "string unterminated or longer than"),
    # issue 26: ``0,`` repeated to 3 GiB ran past 120 s (each tiny element cost ~1 µs to skip)
    "kineto_zeros": (b'{"traceEvents":[', b"0,", KERNEL % (1, 1) + b"]}", "that are not trace events"),
    "kineto_empty_objects": (b'{"traceEvents":[', b"{},", KERNEL % (1, 1) + b"]}", "that are not trace events"),
    "probe_string": (PROBE + b'"strings":["', b"a", b'"],"spans":{},"counters":{}}',
                     "string unterminated or longer than"),
    "probe_spaces": (PROBE + b'"strings":[', b" ", b'"a"],"spans":{},"counters":{}}', "run of over"),
    "probe_int_literal": (PROBE + b'"strings":["a"],"spans":{"start_ns":[1', b"1", b"]},\"counters\":{}}",
                          "number literal too long"),
    "probe_rows": (PROBE + b'"strings":["a"],"spans":{"name":[0', b",0", b"]},\"counters\":{}}",
                   "holds more than"),
    "probe_attrs": (PROBE + b'"strings":["a"],"spans":{"attrs":[{}', b',{"a":0}', b"]},\"counters\":{}}",
                    "holds more than"),
}


def bomb(path: Path, head: bytes, filler: bytes, size: int, tail: bytes) -> Path:
    """``head``, then ``filler`` repeated to ``size`` bytes, then ``tail``: streamed through gzip."""
    block = filler * max(1, BLOCK // len(filler))
    with gzip.open(path, "wb", compresslevel=1) as gz:
        gz.write(head)
        left = size
        while left > 0:
            gz.write(block[:left])
            left -= len(block)
        gz.write(tail)
    return path


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bomb_refused_in_bounded_time_and_memory(tmp_path, shape):
    head, filler, tail, says = SHAPES[shape]
    p = bomb(tmp_path / f"{shape}.json.gz", head, filler, INFLATED, tail)
    r = srtscope("diagnose", "--json", p, timeout=MAX_S)
    r.error_line(str(p), says)
    assert r.peak_rss_mb < MAX_RSS_MB, r.peak_rss_mb


def test_probe_document_cap(tmp_path):
    """Many names of 1 MB each (each under the value cap): refused at MAX_PROBE_CHARS."""
    name = b',"' + b"a" * 1_000_000 + b'"'
    p = bomb(tmp_path / "names.json.gz", PROBE + b'"strings":["a"', name, probe.MAX_PROBE_CHARS + (8 << 20),
             b'],"spans":{},"counters":{}}')
    r = srtscope("diagnose", "--json", p, timeout=MAX_S)
    r.error_line(str(p), "document longer than")
    assert r.peak_rss_mb < MAX_RSS_MB, r.peak_rss_mb


def test_whitespace_runs_under_the_cap_are_read(tmp_path):
    """A valid trace padded with long whitespace runs (each under MAX_WS_RUN) is read: in bulk."""
    run = b" " * (24 << 20)
    p = tmp_path / "padded.json.gz"
    with gzip.open(p, "wb", compresslevel=1) as gz:
        gz.write(b'{"traceEvents":[')
        for i in range(max(2, INFLATED // len(run))):
            gz.write(KERNEL % (i * 10, i) + b",")
            gz.write(run)
        gz.write(KERNEL % (10**6, 10**6) + b"]}")
    r = srtscope("diagnose", "--json", p, timeout=MAX_S)
    assert r.code == 0, r.stderr[-2000:]
    assert r.peak_rss_mb < MAX_RSS_MB, r.peak_rss_mb


@pytest.fixture
def small_caps(monkeypatch):
    """Caps lowered 32x so small bombs exercise the same refusals in process."""
    monkeypatch.setattr(jsonstream, "MAX_VALUE_CHARS", 1 << 20)
    monkeypatch.setattr(jsonstream, "MAX_WS_RUN", 1 << 20)
    monkeypatch.setattr(probe, "MAX_PROBE_VALUE", 1 << 15)
    monkeypatch.setattr(probe, "MAX_PROBE_ROWS", 30_000)
    monkeypatch.setattr(probe, "MAX_PROBE_CHARS", 4 << 20)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_bomb_refused_in_process(tmp_path, small_caps, shape, gz):
    head, filler, tail, says = SHAPES[shape]
    p = tmp_path / f"{shape}.json"
    if gz:
        p = bomb(p.with_suffix(".json.gz"), head, filler, 6 << 20, tail)
    else:
        p.write_bytes(head + filler * ((6 << 20) // len(filler)) + tail)
    with pytest.raises(TraceError, match=says) as ei:
        load_timeline([p])
    assert str(ei.value).startswith(f"{p}: ") and "\n" not in str(ei.value)


def test_probe_columns_stream_into_int64(tmp_path):
    """A probe trace's integer columns come back as int64 arrays (8 bytes a value, not ~40)."""
    import io

    import numpy as np
    doc = (b'{"format":"srtscope-probe","version":1,"strings":["run.eager"],"meta":{"rank":0},'
           b'"spans":{"name":[0,0],"start_ns":[1,' + str(2**62).encode() + b'],"end_ns":[2,3],'
           b'"attrs":[null,{"a":1}]},"counters":{}}')
    out = jsonstream.load_columns(io.StringIO(doc.decode()), max_rows=10, chunk=7)
    assert out["spans"]["start_ns"].dtype == np.int64 and out["spans"]["start_ns"][1] == 2**62
    assert out["spans"]["attrs"] == [None, {"a": 1}] and out["strings"] == ["run.eager"]
    with pytest.raises(jsonstream.JsonStreamError, match="holds more than 1 elements"):
        jsonstream.load_columns(io.StringIO(doc.decode()), max_rows=1)
