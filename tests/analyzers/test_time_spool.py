"""``time_spool``'s file: every column's values back exactly, in the bytes they need, one file a
spool, space freed by splits and merges given back, bad chunks refused."""
from __future__ import annotations

import os

import numpy as np
import pytest

from srtscope.analyzers.spill.time_spool import TimeSpool

_RNG = np.random.default_rng(11)
N = 3000


def _stored_bytes(spool: TimeSpool) -> int:
    return sum(s.size for b in spool.buckets for s in b.segments)


@pytest.mark.parametrize("case, values, width", [
    ("one value over the chunk: no bytes at all", np.full(N, -7, np.int64), 0),
    ("ids 10**15 apart by under 256: one byte each", 10**15 + _RNG.integers(0, 256, N), 1),
    ("spread under 65536: two bytes", -(10**12) + _RNG.integers(0, 65536, N), 2),
    ("spread under 2**32: four bytes", _RNG.integers(0, 2**32, N), 4),
    ("spread past 2**32: kept as they are", _RNG.integers(-(2**40), 2**40, N), 8),
    # an int32's whole range: its difference from the lowest wraps in int32 arithmetic
    ("int32 from its lowest to its highest", np.resize(np.array([-(2**31), 2**31 - 1, 0, 5], np.int32), N), 4),
    ("uint64 past int64's highest, under 256 apart", np.resize(np.array([2**64 - 1, 2**64 - 200], np.uint64), N), 1),
    ("uint64 spread over its range", np.resize(np.array([2**64 - 1, 0, 2**63 + 9], np.uint64), N), 8),
    ("int8 is one byte already", _RNG.integers(-128, 128, N).astype(np.int8), 1),
    ("floats (NaN too) kept as they are", np.resize(np.array([0.5, np.nan, -3e300]), N), 8),
    ("booleans kept as they are", _RNG.integers(0, 2, N).astype(bool), 1),
    ("ids counting up by one: no bytes at all", np.arange(N, dtype=np.int64) + 10**12, 0),
    ("ids climbing by steps under 256, 400 k apart overall: a byte a step", np.cumsum(_RNG.integers(0, 256, N)), 1),
    ("int32 ids falling by steps under 65536", -np.cumsum(_RNG.integers(0, 65536, N)).astype(np.int32), 2),
    # each step wraps to -1 or +1 in int64: a byte a step, each value back exactly
    ("int64 from its lowest to its highest and back", np.resize(np.array([-(2**63), 2**63 - 1], np.int64), N), 1),
])
def test_every_column_comes_back_exactly_in_the_bytes_it_needs(tmp_path, case, values, width):
    # starts one step apart, arriving in reverse (the spool sorts them: a gather), one duration:
    # neither takes a byte, all the segment's bytes are v's
    start = (np.arange(N, dtype=np.int64) * 1000 + 10**16)[::-1].copy()
    spool = TimeSpool(tmp_path, "t", 1 << 20, expect_rows=N)
    spool.add({"start_ns": start, "end_ns": start + 10, "v": values})
    back = list(spool.chunks())
    assert len(back) == 1
    got = back[0]["v"]
    assert got.dtype == values.dtype, case
    np.testing.assert_array_equal(got, values[::-1], err_msg=case)     # sorted by start: reversed
    assert back[0]["end_ns"].tolist() == (start + 10)[::-1].tolist()
    assert _stored_bytes(spool) == pytest.approx(N * width, abs=8), case
    spool.remove()
    assert not list(tmp_path.iterdir())


def test_columns_of_one_value_a_chunk_keep_their_values_through_a_sort(tmp_path):
    # chunks arrive out of time order into one bucket: the bucket is sorted on reading, and a column
    # of one value in each chunk (a device) but two over the bucket is gathered with the rest
    spool = TimeSpool(tmp_path, "t", 1 << 20, expect_rows=6)
    rows = []
    for dev, starts in ((3, [50, 10, 30]), (4, [20, 60, 40])):
        s = np.asarray(starts, np.int64)
        spool.add({"start_ns": s, "end_ns": s + dev, "dev": np.full(3, dev, np.int64),
                   "kind": np.full(3, 9, np.int32)})
        rows += [(t, dev) for t in starts]
    got = next(spool.chunks())
    assert list(zip(got["start_ns"].tolist(), got["dev"].tolist())) == sorted(rows)
    assert (got["end_ns"] - got["start_ns"]).tolist() == [d for _, d in sorted(rows)]
    assert got["kind"].tolist() == [9] * 6 and got["kind"].dtype == np.int32
    spool.remove()


def _punches(folder) -> bool:
    """Whether the file system under ``folder`` gives back a hole punched in a file."""
    from srtscope.analyzers.spill import time_spool

    probe = folder / "probe"
    probe.write_bytes(os.urandom(1 << 20))
    fd = os.open(probe, os.O_RDWR)
    try:
        os.fsync(fd)
        before = os.fstat(fd).st_blocks
        time_spool._punch(fd, 0, 1 << 20)
        return os.fstat(fd).st_blocks < before
    finally:
        os.close(fd)
        probe.unlink()


def test_space_of_split_and_merged_segments_is_given_back(tmp_path):
    if not _punches(tmp_path):
        pytest.skip("this file system punches no holes")
    spool = TimeSpool(tmp_path, "t", 400, expect_rows=400)
    n = 0
    # rows spread thin over every bucket, chunk after chunk: buckets split, their segments merged
    for _ in range(300):
        s = _RNG.integers(0, 10**9, 50).astype(np.int64)
        spool.add({"start_ns": s, "end_ns": s + 1, "row": np.arange(n, n + 50)})
        n += 50
    live = sum(s.span for b in spool.buckets for s in b.segments)
    (path,) = spool.files
    on_disk = os.stat(path).st_blocks * 512
    assert os.stat(path).st_size > 3 * live          # rewritten more than once
    assert on_disk <= live + (1 << 20), (on_disk, live)
    rows = np.concatenate([c["row"] for c in spool.chunks()])
    assert sorted(rows.tolist()) == list(range(n))
    spool.remove()


@pytest.mark.parametrize("case, second, message", [
    ("a column the first chunk had not", {"start_ns": [5], "end_ns": [6], "v": [1], "w": [2]}, "columns"),
    ("a fraction where the column holds integers", {"start_ns": [5], "end_ns": [6], "v": [1.5]}, "cannot hold"),
])
def test_a_chunk_unlike_the_first_is_refused(tmp_path, case, second, message):
    spool = TimeSpool(tmp_path, "t", 10)
    spool.add({"start_ns": np.array([1], np.int64), "end_ns": np.array([2], np.int64), "v": np.array([3], np.int64)})
    with pytest.raises(ValueError, match=message):
        spool.add({k: np.asarray(v) for k, v in second.items()})
    spool.remove()


def test_objects_are_refused(tmp_path):
    spool = TimeSpool(tmp_path, "t", 10)
    with pytest.raises(ValueError, match="not objects"):
        spool.add({"start_ns": np.array([1], np.int64), "v": np.array(["a"], object)})
    spool.remove()
    assert not list(tmp_path.iterdir())
