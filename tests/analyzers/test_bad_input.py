"""Bad input: every unusable file gives exactly one TraceError line naming it — never another
exception, never a hang. Corrupts and truncates copies of the real files (in tmp_path)."""
from __future__ import annotations

import gzip
import shutil
import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from sample_traces.nsys_schema import NsysWriter
from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.readers import TraceError, load_timeline
from tests.conftest import REAL_TRACES as REAL

needs_real = pytest.mark.usefixtures("real_traces")   # conftest: skips without the shared traces
HANG_GUARD_S = 120


@pytest.fixture
def hang_guard():
    """Fail (instead of hanging the suite) if reading a damaged file never returns."""
    def boom(*_):
        raise AssertionError(f"reader did not return within {HANG_GUARD_S} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(HANG_GUARD_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _outcome(path: Path) -> str:
    """'ok' for a valid Timeline, 'error' for a well-formed TraceError; anything else fails."""
    try:
        tl = load_timeline([path], allow_no_kernels=True)
    except TraceError as exc:
        msg = str(exc)
        assert msg.startswith(f"{path}: ") and "\n" not in msg and len(msg) > len(str(path)) + 3
        return "error"
    assert isinstance(tl, Timeline)
    return "ok"


def _offsets(size: int, n: int) -> list[int]:
    return sorted({int(x) for x in np.linspace(0, size - 1, n)} | {1, 16, 100})


def _nsys_reals():
    files = (REAL / "nsys").glob("*.sqlite") if REAL.is_dir() else []
    return sorted(files, key=lambda p: p.stat().st_size)


def _kineto_reals():
    """Smallest first: every schema feature is in the small ones, and they read fast."""
    files = (REAL / "kineto").glob("*.json.gz") if REAL.is_dir() else []
    return sorted(files, key=lambda p: p.stat().st_size)


@needs_real
@pytest.mark.parametrize("src", _nsys_reals()[:3] + _kineto_reals()[:4], ids=lambda p: p.name[:24])
def test_truncated_files(tmp_path, hang_guard, src):
    data = src.read_bytes()
    outcomes = []
    for cut in _offsets(len(data), 9):
        p = tmp_path / f"cut{cut}"
        p.write_bytes(data[:cut])
        outcomes.append(_outcome(p))
    assert outcomes.count("error") >= len(outcomes) - 2   # a cut file is nearly always unusable


@needs_real
@pytest.mark.parametrize("src", _nsys_reals(), ids=lambda p: p.name[:24])
def test_corrupted_sqlite(tmp_path, hang_guard, src):
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(len(data))
    for off in _offsets(len(data), 10):
        bad = bytearray(data)
        bad[off:off + 64] = rng.integers(0, 256, min(64, len(data) - off), dtype=np.uint8).tobytes()
        p = tmp_path / f"bad{off}.sqlite"
        p.write_bytes(bytes(bad))
        _outcome(p)


@needs_real
@pytest.mark.parametrize("src", _kineto_reals()[:4], ids=lambda p: p.name[:24])
def test_corrupted_kineto(tmp_path, hang_guard, src):
    raw = src.read_bytes()
    text = gzip.decompress(raw)
    rng = np.random.default_rng(len(raw))
    for off in _offsets(len(raw), 6):                    # damage the compressed stream
        bad = bytearray(raw)
        bad[off] ^= 0xFF
        p = tmp_path / f"gz{off}"
        p.write_bytes(bytes(bad))
        _outcome(p)
    for off in _offsets(len(text), 8):                   # damage the JSON itself
        bad = bytearray(text)
        bad[off:off + 3] = bytes(rng.choice(list(b'{}[],:"x0'), 3))
        p = tmp_path / f"js{off}"
        p.write_bytes(bytes(bad))
        _outcome(p)


def _zero_kernel_export(path: Path) -> Path:
    with NsysWriter(path) as w:
        w.add_runtime([0, 10], [5, 15], ["cudaMalloc_v3020", "cudaFree_v3020"], pid=1, tid=1,
                      correlation=[1, 2])
    return path


def _other_program_db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.execute("INSERT INTO users VALUES (1, 'x')")
    con.commit()
    con.close()
    return path


def _write(content: bytes):
    def make(path: Path) -> Path:
        path.write_bytes(content)
        return path
    return make


def _empty_nsys(path: Path) -> Path:
    NsysWriter(path).close()
    return path


BAD = [
    ("empty file", _write(b""), "empty file"),
    ("whitespace", _write(b" \n\t "), "empty file"),
    ("not a database", _write(b"\x00\x01binary garbage" * 50), "unrecognised format"),
    ("other program's sqlite", _other_program_db, "not an Nsight Systems export"),
    ("empty nsys export", _empty_nsys, "no CUDA or NVTX events"),
    ("zero kernels", _zero_kernel_export, "zero kernels"),
    ("json not a trace", _write(b'{"hello": [1, 2, 3]}'), "not a trace"),
    ("json array", _write(b'[{"ph": "X"}]'), "JSON array"),
    ("json truncated", _write(b'{"traceEvents": [{"ph": "X", "cat": "ker'), "invalid JSON"),
    ("empty trace", _write(b'{"traceEvents": []}'), "no GPU, CUDA API or annotation events"),
    ("gzip garbage", _write(b"\x1f\x8b\x08\x00garbage-not-deflate"), "corrupt gzip"),
    ("sqlite header only", _write(b"SQLite format 3\x00" + b"\x00" * 84), "SQLite"),
    ("bad utf-8", _write(b'{"traceEvents": ["\xff\xfe"]}'), "truncated or corrupt"),
]


@pytest.mark.parametrize("label,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_give_one_line_errors(tmp_path, hang_guard, label, make, msg):
    path = make(tmp_path / "input.trace")
    with pytest.raises(TraceError, match=msg) as ei:
        load_timeline([path])
    text = str(ei.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert isinstance(ei.value, ValueError)


def test_missing_paths_and_empty_directory(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_timeline([tmp_path / "nope.sqlite"])
    (tmp_path / "d").mkdir()
    with pytest.raises(TraceError, match="no trace files"):
        load_timeline([tmp_path / "d"])
    with pytest.raises(TraceError, match="no trace files given"):
        load_timeline([])


@needs_real
def test_mixed_formats_refused(tmp_path):
    nsys = sorted((REAL / "nsys").glob("pytorch_tiny*"))[0]
    kin = sorted((REAL / "kineto").glob("hta_triton*"))[0]
    shutil.copy(kin, tmp_path / "rank1.json.gz")
    with pytest.raises(TraceError, match="different formats"):
        load_timeline([nsys, tmp_path / "rank1.json.gz"])
