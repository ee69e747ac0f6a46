"""``spill_writes``: a spill's bytes land the same whether written past the page cache or through it,
and a file system or block size that refuses direct writes falls back without losing a byte."""
from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from srtscope.analyzers.spill import spill_writes
from srtscope.analyzers.spill.spill_writes import BLOCK, DIRECT_ENV, SpillWriter
from srtscope.analyzers.spill.time_spool import TimeSpool

_RNG = np.random.default_rng(5)


@contextmanager
def _writer(tmp_path) -> Iterator[tuple[int, SpillWriter]]:
    """A fresh spill file, its descriptor and its writer (both closed after)."""
    path = tmp_path / "s.spool"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    w = SpillWriter(path, fd)
    try:
        yield fd, w
    finally:
        w.close()
        os.close(fd)


def _direct_or_skip(w: SpillWriter) -> None:
    if not w.direct:
        pytest.skip("this file system refuses O_DIRECT: only the page cache's way is there to test")


@pytest.mark.parametrize("case, sizes, offset", [
    ("a few bytes: one block on disk, zeros after them", [5], 0),
    ("columns of odd lengths gathered in order", [3, 4096, 17, 9000], BLOCK * 3),
    ("past the 1 MiB staging buffer: it grows", [3 << 20, 123], 0),
    ("an offset off the block: written through the page cache", [100], 100),
])
def test_bytes_written_come_back_exactly(tmp_path, case, sizes, offset):
    with _writer(tmp_path) as (fd, w):
        bufs = [_RNG.integers(0, 256, n, dtype=np.uint8) for n in sizes]
        w.write(bufs, offset)
        want = np.concatenate(bufs).tobytes()
        got = os.pread(fd, len(want), offset)
        assert got == want, case
        if w.direct and offset % BLOCK == 0:       # whole blocks on disk, zeros past the bytes
            end = offset + -(-len(want) // BLOCK) * BLOCK
            assert os.fstat(fd).st_size == end
            assert os.pread(fd, end, offset)[len(want):] == bytes(end - offset - len(want))


def test_switched_off_writes_through_the_page_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(DIRECT_ENV, "0")
    with _writer(tmp_path) as (fd, w):
        assert not w.direct
        w.write([b"abc"], 0)
        assert os.fstat(fd).st_size == 3 and os.pread(fd, 3, 0) == b"abc"


def test_a_refused_direct_write_falls_back_with_every_byte(tmp_path, monkeypatch):
    with _writer(tmp_path) as (fd, w):
        _direct_or_skip(w)
        real = os.pwritev

        def refuse_direct(f, bufs, off):         # a device whose blocks are larger than 4 KiB
            if f == w.direct_fd:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(f, bufs, off)
        monkeypatch.setattr(spill_writes.os, "pwritev", refuse_direct)
        data = _RNG.integers(0, 256, 10_000, dtype=np.uint8)
        w.write([data], BLOCK)
        assert not w.direct                  # and stays off for the file's later writes
        w.write([b"xyz"], 4 * BLOCK)
        assert os.pread(fd, len(data), BLOCK) == data.tobytes()
        assert os.pread(fd, 3, 4 * BLOCK) == b"xyz"


@pytest.mark.parametrize("short_first", [False, True], ids=["at once", "after a short write"])
def test_other_write_errors_are_raised_and_leave_no_view_of_the_buffer(tmp_path, monkeypatch, short_first):
    """A full disk is the write's own OSError; no view of the staging buffer outlives it (one kept by
    the traceback made ``close`` raise BufferError in place of the ENOSPC)."""
    with _writer(tmp_path) as (fd, w):
        _direct_or_skip(w)
        calls = []

        def full(f, bufs, off):
            calls.append(1)
            if short_first and len(calls) == 1:
                return BLOCK                                # a short write: the rest sliced off
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(spill_writes.os, "pwritev", full)
        with pytest.raises(OSError, match="No space left") as raised:
            w.write([b"abc", bytes(3 * BLOCK)], 0)
        stage = w._stage
        assert stage is not None
        w.close()                               # raised BufferError before
        assert stage.closed and raised.value.errno == errno.ENOSPC


def test_a_spool_reads_back_the_same_rows_direct_or_not(tmp_path, monkeypatch):
    # rows arriving out of order over many buckets (splits and merges rewrite segments)
    n = 60_000
    start = _RNG.integers(0, 10**9, n)
    cols = {"start_ns": start, "end_ns": start + _RNG.integers(0, 5000, n),
            "correlation": _RNG.integers(0, 2**40, n), "stream": _RNG.integers(0, 7, n).astype(np.int32)}
    got = {}
    for direct in ("1", "0"):
        monkeypatch.setenv(DIRECT_ENV, direct)
        sp = TimeSpool(tmp_path, f"t{direct}", 1000)
        try:
            for a in range(0, n, 7000):
                sp.add({k: v[a:a + 7000] for k, v in cols.items()})
            got[direct] = [c for c in sp.chunks()]
        finally:
            sp.remove()
    assert len(got["1"]) == len(got["0"]) > 10
    for a, b in zip(got["1"], got["0"]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    order = np.argsort(start, kind="stable")
    assert np.array_equal(np.concatenate([c["correlation"] for c in got["1"]]), cols["correlation"][order])


@pytest.mark.parametrize("case, least_rate, direct_after", [
    ("a disk slower than the least pace: the rest through the page cache", 1e18, False),
    ("a disk at any pace over none asked: direct kept", 0.0, True),
])
def test_direct_writes_kept_only_on_a_disk_fast_enough(tmp_path, monkeypatch, case, least_rate, direct_after):
    monkeypatch.setattr(spill_writes, "PROBE_BYTES", 3 * BLOCK)
    monkeypatch.setattr(spill_writes, "PROBE_WRITE", BLOCK)
    monkeypatch.setattr(spill_writes, "MIN_DIRECT_RATE", least_rate)
    with _writer(tmp_path) as (fd, w):
        _direct_or_skip(w)
        data = [_RNG.integers(0, 256, 2 * BLOCK + 7, dtype=np.uint8) for _ in range(3)]
        for i, d in enumerate(data):
            w.write([d], 4 * BLOCK * i)
        assert w.direct is direct_after, case
        for i, d in enumerate(data):
            assert os.pread(fd, len(d), 4 * BLOCK * i) == d.tobytes()
