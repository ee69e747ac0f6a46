"""The table cache (``analyzers/cache/table_cache.py``): hit, miss, invalidation, damage, eviction, an
unwritable directory, the read-only promise, and results identical with and without it."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import pandas.testing as pdt
import pytest
from typer.testing import CliRunner

from srtscope.analyzers.cache import cache_store
from srtscope.analyzers.cache import table_cache as C
from srtscope.analyzers.readers import TraceError, load_timeline, read_one
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "eager.sqlite"
    shutil.copyfile(SAMPLES / "eager_fallback.sqlite", p)
    return p


class Reads:
    """Counts the readers' full reads (``_read_format``): a cache hit makes none."""

    def __init__(self, monkeypatch) -> None:
        import srtscope.analyzers.readers as R

        self.n = 0
        real = R._read_format

        def counted(*a, **kw):
            self.n += 1
            return real(*a, **kw)

        monkeypatch.setattr(R, "_read_format", counted)


def _entries() -> list[Path]:
    """The table entries (the diagnosis cache's ``diagnosis-*`` entries share the folder)."""
    root = C.cache_dir()
    return [e for e in root.iterdir() if e.is_dir() and not e.name.startswith((".", "diagnosis-"))] \
        if root.exists() else []


def _same(a, b) -> None:
    for t in C.TABLES:
        pdt.assert_frame_equal(getattr(a, t), getattr(b, t))
    assert a.meta == b.meta


@pytest.mark.parametrize("name", ["eager_fallback.sqlite", "comm_straggler.rank1.sqlite", "osrt_io.sqlite",
                                  "profiler_steps.json.gz", "python_frames.json.gz"])
def test_miss_then_hit_restores_the_same_timeline(name, tmp_path, monkeypatch):
    p = tmp_path / name
    shutil.copyfile(SAMPLES / name, p)
    reads = Reads(monkeypatch)
    plain = read_one(p, 3)
    first = read_one(p, 3, cache=True)
    assert reads.n == 2 and len(_entries()) == 1
    second = read_one(p, 3, cache=True)
    assert reads.n == 2                      # from the cache
    _same(plain, first)
    _same(plain, second)
    if len(plain.ranges):
        pdt.assert_series_equal(plain.ranges["attrs"], second.ranges["attrs"])


def test_other_rank_is_another_entry(trace, monkeypatch):
    reads = Reads(monkeypatch)
    a, b = read_one(trace, 0, cache=True), read_one(trace, 5, cache=True)
    assert reads.n == 2 and len(_entries()) == 2
    assert set(a.device["rank"]) == {0} and set(b.device["rank"]) == {5}


def test_source_is_the_path_as_given(trace, monkeypatch):
    read_one(trace, cache=True)
    monkeypatch.chdir(trace.parent)
    tl = read_one(Path(trace.name), cache=True)
    assert tl.meta.sources == [trace.name]


def _rewrite_same_size(path: Path) -> None:
    """Change a byte of the SQLite header's change counter (offset 24), keep size and mtime."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(24)
        b = fh.read(1)
        fh.seek(24)
        fh.write(bytes([(b[0] + 1) % 256]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("change", ["touched", "rewritten", "replaced"])
def test_a_changed_trace_is_read_again(trace, monkeypatch, change):
    reads = Reads(monkeypatch)
    read_one(trace, cache=True)
    if change == "touched":
        st = trace.stat()
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "rewritten":
        _rewrite_same_size(trace)
    else:                                    # another capture under the same name
        shutil.copyfile(SAMPLES / "kernel_bound.sqlite", trace)
    tl = read_one(trace, cache=True)
    assert reads.n == 2 and len(_entries()) == 1          # the stale entry replaced
    _same(tl, read_one(trace))


def test_a_truncated_trace_is_not_served_from_the_cache(trace):
    read_one(trace, cache=True)
    with open(trace, "r+b") as fh:
        fh.truncate(trace.stat().st_size // 2)
    with pytest.raises(TraceError):
        read_one(trace, cache=True)


@pytest.mark.parametrize("damage", ["truncate", "garble", "meta", "missing", "meta_garbage"])
def test_a_damaged_entry_is_dropped_and_rebuilt(trace, monkeypatch, damage):
    """Damaged table files are dropped quietly; an edited meta.json does not verify with the
    user's key: one note, then rebuilt."""
    reads = Reads(monkeypatch)
    want = read_one(trace, cache=True)
    (entry,) = _entries()
    f = entry / "device.arrow"
    if damage == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size // 2)
    elif damage == "garble":
        data = bytearray(f.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 16] = bytes(16)
        f.write_bytes(bytes(data))
    elif damage == "meta":
        doc = json.loads((entry / "meta.json").read_text())
        doc["tables"]["device"]["rows"] += 1
        (entry / "meta.json").write_text(json.dumps(doc))
    elif damage == "missing":
        (entry / "ranges.arrow").unlink()
    else:
        (entry / "meta.json").write_bytes(b"\x00garbage{")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = read_one(trace, cache=True)
    notes = [str(w.message) for w in seen]
    if damage.startswith("meta"):
        assert len(notes) == 1 and f"ignored entry {entry.name} (not written by this user's" in notes[0]
    else:
        assert notes == []
    assert reads.n == 2
    _same(want, got)
    assert read_one(trace, cache=True) is not None and reads.n == 2     # rebuilt entry serves again


def test_least_recently_used_entries_are_evicted(tmp_path, monkeypatch):
    files = []
    for i, name in enumerate(["healthy.sqlite", "kernel_bound.sqlite", "prep_bound.sqlite"]):
        p = tmp_path / f"t{i}.sqlite"
        shutil.copyfile(SAMPLES / name, p)
        files.append(p)
    read_one(files[0], cache=True)
    one = C.TimelineCache().entries()[0][1]
    monkeypatch.setattr(cache_store, "max_bytes", lambda: int(2.6 * one))
    read_one(files[1], cache=True)
    t = C.TimelineCache().entries()
    for k, (_, _, e) in enumerate(t):         # entry 0 used long ago, entry 1 just now
        os.utime(e / "meta.json", (1_000_000 + k, 1_000_000 + k))
    reads = Reads(monkeypatch)
    read_one(files[0], cache=True)            # a hit: entry 0 is now the most recently used
    assert reads.n == 0
    read_one(files[2], cache=True)            # over the cap: entry 1 goes
    kept = {C.trace_key(f, 0).entry_name for f in files}
    names = {e.name for e in _entries()}
    assert names == kept - {C.trace_key(files[1], 0).entry_name}
    assert sum(b for _, b, _ in C.TimelineCache().entries()) <= 2.6 * one


def test_unwritable_cache_dir_warns_once_and_reads(trace, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = read_one(trace, cache=True)
        b = read_one(trace, cache=True)
    assert len([w for w in seen if issubclass(w.category, C.CacheWarning)]) == 1
    assert len(seen) == 1
    _same(a, read_one(trace))
    _same(b, a)


def test_trace_bytes_and_mtime_untouched(trace):
    before = (hashlib.sha256(trace.read_bytes()).hexdigest(), trace.stat().st_mtime_ns, trace.stat().st_size)
    read_one(trace, cache=True)
    read_one(trace, cache=True)
    after = (hashlib.sha256(trace.read_bytes()).hexdigest(), trace.stat().st_mtime_ns, trace.stat().st_size)
    assert before == after
    assert sorted(p.name for p in trace.parent.iterdir()) == sorted(["eager.sqlite", "cache", "config"])


def test_cache_dir_default_and_moves(monkeypatch, tmp_path):
    monkeypatch.delenv("SRTSCOPE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.cache_dir() == tmp_path / "xdg" / "srtscope"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert C.cache_dir() == Path.home() / ".cache" / "srtscope"
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(tmp_path / "x"))
    assert C.cache_dir() == tmp_path / "x"


def test_small_files_skip_the_cache(trace, monkeypatch):
    monkeypatch.setenv("SRTSCOPE_CACHE_MIN_BYTES", str(10 << 20))
    read_one(trace, cache=True)
    assert _entries() == []


def _diagnose_json(*args: str) -> dict:
    r = CliRunner().invoke(app, ["diagnose", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("files", [["eager_fallback.sqlite"], ["comm_straggler.rank0.sqlite",
                                                               "comm_straggler.rank1.sqlite"]])
def test_diagnose_json_identical_with_and_without_cache(files, tmp_path):
    paths = []
    for f in files:
        shutil.copyfile(SAMPLES / f, tmp_path / f)
        paths.append(str(tmp_path / f))
    plain = _diagnose_json("--no-cache", *paths)
    assert _entries() == []
    miss = _diagnose_json(*paths)
    assert len(_entries()) == len(files)
    answered = _diagnose_json(*paths)                       # from the diagnosis cache
    for d in C.cache_dir().glob("diagnosis-*"):
        shutil.rmtree(d)
    hit = _diagnose_json(*paths)                            # the analyses over the cached tables
    assert plain == miss == answered == hit


def test_load_timeline_with_cache(tmp_path):
    paths = [SAMPLES / "comm_straggler.rank0.sqlite", SAMPLES / "comm_straggler.rank1.sqlite"]
    plain = load_timeline(paths)
    load_timeline(paths, cache=True)
    _same(plain, load_timeline(paths, cache=True))


def test_deferred_writes_happen_beside_the_caller_and_are_waited_for(trace, monkeypatch):
    """Inside ``deferred_writes`` a new entry is written on a thread of its own (the CLI's analyses
    run meanwhile) and the block's end waits for it; outside, on the caller's thread."""
    import threading

    writers: list[str] = []
    real_put = C.TimelineCache.put

    def put(self, key, tl):
        writers.append(threading.current_thread().name)
        real_put(self, key, tl)

    monkeypatch.setattr(C.TimelineCache, "put", put)
    with C.deferred_writes():
        tl = read_one(trace, 0, cache=True)
    assert writers == ["srtscope-cache-write"] and len(_entries()) == 1
    _same(tl, read_one(trace, 0, cache=True))                 # a hit: nothing written
    assert writers == ["srtscope-cache-write"]
    for e in _entries():
        shutil.rmtree(e)
    with pytest.raises(RuntimeError), C.deferred_writes():
        read_one(trace, 0, cache=True)
        raise RuntimeError("the caller fails while the entry is written")
    assert len(_entries()) == 1                              # waited for all the same
    for e in _entries():
        shutil.rmtree(e)
    read_one(trace, 0, cache=True)
    assert writers[-1] == threading.current_thread().name


def test_a_failing_background_write_is_one_warning(trace, monkeypatch):
    """Whatever breaks in the writer thread costs one CacheWarning, not a traceback or the answer."""
    import warnings

    def broken(self, key, tl):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(C.TimelineCache, "put", broken)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with C.deferred_writes():
            tl = read_one(trace, 0, cache=True)
    assert len(tl.device) and _entries() == []
    assert [str(w.message) for w in seen if issubclass(w.category, C.CacheWarning)] == \
        ["srtscope cache not used: RuntimeError: disk on fire"]


def test_folders_that_are_not_entries_are_never_evicted_or_cleared(trace, tmp_path, monkeypatch):
    """$SRTSCOPE_CACHE_DIR pointed at a shared folder: only srtscope's own entries are ever removed."""
    from typer.testing import CliRunner as Runner

    shared = tmp_path / "shared"
    monkeypatch.setenv("SRTSCOPE_CACHE_DIR", str(shared))
    keep = [shared / "photos", shared / "0123", shared / ("a" * 32 + "x")]
    for d in keep:
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")
    read_one(trace, 0, cache=True)
    monkeypatch.setattr(cache_store, "max_bytes", lambda: 0)          # everything over the cap
    C.TimelineCache().evict()
    assert Runner().invoke(app, ["cache", "--clear"]).exit_code == 0
    assert all(d.is_dir() and (d / "meta.json").exists() for d in keep)
    assert C.TimelineCache().entries() == []                         # srtscope's own entry went
