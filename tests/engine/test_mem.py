"""ReqToTokenPool and the KV slot allocator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.req_to_token import ReqToTokenPool


def test_slot_zero_is_never_handed_out():
    a = TokenSlotAllocator(8)
    got = a.alloc(8)
    assert sorted(got.tolist()) == list(range(1, 9))
    assert a.alloc(1) is None


def test_alloc_is_all_or_nothing():
    a = TokenSlotAllocator(10)
    first = a.alloc(7)
    assert a.alloc(4) is None and a.available_size() == 3      # nothing taken
    a.free(first[:2])
    got = a.alloc(5)                                           # merges the pending frees
    assert len(got) == 5 and a.available_size() == 0
    assert len(set(got.tolist()) | set(first[2:].tolist())) == 10


@pytest.mark.parametrize("bad, msg", [
    (lambda a: a.free(np.array([1])), "twice"),                 # double free
    (lambda a: a.free(np.array([0])), "outside 1..size"),       # the dummy slot
])
def test_check_catches_double_free_and_dummy(bad, msg):
    a = TokenSlotAllocator(4)
    bad(a)
    with pytest.raises(AssertionError, match=msg):
        a.check()


def test_check_accounts_for_slots_held_elsewhere():
    a = TokenSlotAllocator(6)
    held = a.alloc(2)
    a.check(in_use=held)
    with pytest.raises(AssertionError, match="slot accounting"):
        a.check(in_use=held[:1])                                 # one slot leaked


def test_alloc_rejects_negative():
    with pytest.raises(ValueError, match="n: must be >= 0"):
        TokenSlotAllocator(4).alloc(-1)


def test_req_to_token_rows_and_device_writes():
    pool = ReqToTokenPool(3, 16)
    rows = [pool.alloc() for _ in range(3)]
    assert rows == [0, 1, 2] and pool.alloc() is None
    pool.write(1, 2, np.array([5, 6, 7]))
    pool.write_many(np.array([0, 2]), np.array([0, 4]), np.array([9, 11]))
    assert pool.table.sum() == 0                                  # device copy not touched yet
    pool.write_device(pool.take_dirty("cpu"))
    assert pool.table[1, 2:5].tolist() == [5, 6, 7]
    assert pool.table[0, 0] == 9 and pool.table[2, 4] == 11
    assert torch.equal(pool.table, torch.from_numpy(pool.cpu))
    assert pool.take_dirty("cpu") is None
    with pytest.raises(AssertionError, match="rows still held"):
        pool.check_all_free()
    for r in rows:
        pool.free(r)
    pool.check_all_free()
