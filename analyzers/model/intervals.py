"""Interval primitives — the one home of union / intersection / difference / gaps (numpy, vectorised).

An *interval set* is a pair ``(starts, ends)`` of int64 arrays, sorted, disjoint and non-touching
(``ends[i] < starts[i+1]``), each ``start < end``: the normal form every function here returns.
Times are integer nanoseconds; every measure is exact integer arithmetic.

NOTE: intervals are half-open ``[start, end)``; zero-length inputs vanish from unions.
"""
from __future__ import annotations

import numpy as np

IntervalSet = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int64)


def empty() -> IntervalSet:
    return _EMPTY.copy(), _EMPTY.copy()


def _as_i64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def sorted_unique(x) -> np.ndarray:
    """Sorted distinct values of an int64 array.

    NOTE: a stable (run-aware) sort plus a neighbour test: linear on the concatenated sorted runs
    the interval code produces, where ``np.unique``'s hashing takes seconds per 10 M values.
    """
    x = np.sort(_as_i64(x), kind="stable")
    if len(x) < 2:
        return x
    keep = np.empty(len(x), dtype=bool)
    keep[0] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


def running_max(x: np.ndarray) -> np.ndarray:
    """``np.maximum.accumulate(x)`` of a 1-D int64 array.

    NOTE: returns ``x`` itself (not a copy) when it is already non-decreasing — one stream's
    kernels, one thread's calls: a comparison pass instead of a running max into a fresh array.
    Callers only read the result.
    """
    if is_sorted(x):
        return x
    return np.maximum.accumulate(x)


def _all_positive(s: np.ndarray, e: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether every ``e > s`` (no empty interval), chunk by chunk like ``is_sorted``."""
    for i in range(0, len(s), chunk):
        if not (e[i:i + chunk] > s[i:i + chunk]).all():
            return False
    return True


def is_sorted(x: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether ``x`` never decreases; checked chunk by chunk, so a disorder near the start costs
    little (small temporaries, early exit)."""
    for i in range(0, len(x) - 1, chunk):
        seg = x[i:i + chunk + 1]
        if (seg[1:] < seg[:-1]).any():
            return False
    return True


def union(starts, ends) -> IntervalSet:
    """Merge any intervals (unsorted, overlapping, touching) into normal form."""
    s, e = _as_i64(starts), _as_i64(ends)
    if not _all_positive(s, e):
        keep = e > s
        s, e = s[keep], e[keep]
    if len(s) == 0:
        return empty()
    if not is_sorted(s):          # device/api rows arrive start-sorted: skip the gather
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = running_max(e)
    # A new merged interval begins where the start lies beyond every earlier end.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], run_end[last]


def may_touch(starts: np.ndarray, run_end: np.ndarray, iv: IntervalSet) -> np.ndarray:
    """Indices (ascending) of the intervals that may overlap a normal-form set, a superset of those
    that do: ``starts`` sorted, ``run_end`` the running max of their ends (``running_max``).

    Interval i can reach ``[s_j, e_j)`` only if it starts before ``e_j`` and some interval up to i
    ends after ``s_j``: per ``j`` one index range, found by two binary searches — the cost is the
    set's size and the candidates', not every interval's.
    """
    qs, qe = iv
    if len(qs) == 0 or len(starts) == 0:
        return np.zeros(0, np.int64)
    lo = np.searchsorted(run_end, qs, side="right")
    hi = np.searchsorted(starts, qe, side="left")
    lo, hi = union(lo, hi)                   # index ranges, merged
    n = hi - lo
    first = np.cumsum(n) - n                 # where each range begins in the output
    return np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first - lo, n)


def total(iv: IntervalSet) -> int:
    """Summed length of a normal-form set, ns."""
    return int((iv[1] - iv[0]).sum())


def covered_upto(iv: IntervalSet, t) -> np.ndarray:
    """Measure of ``iv ∩ (-inf, t)`` for each ``t`` (vectorised; ``iv`` in normal form)."""
    s, e = iv
    t = _as_i64(t)
    if len(s) == 0:
        return np.zeros(t.shape, dtype=np.int64)
    cum = np.r_[0, np.cumsum(e - s)]
    i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    prev = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.clip(t - s[prev], 0, (e - s)[prev]), 0)
    return cum[np.maximum(i - 1, 0)] * (i > 0) + partial


#: intervals a chunk of ``measure_in``: its temporaries stay a few MiB whatever the set's size
_CHUNK = 1 << 20


def measure_in(iv: IntervalSet, lo: int, hi: int) -> int:
    """Measure of ``iv ∩ [lo, hi)``, ns (``iv`` in normal form), a chunk at a time: no array of the
    set's size is made (``overlap`` of one query makes three)."""
    s, e = iv
    i0 = int(np.searchsorted(e, lo, side="right"))                 # the first interval ending past lo
    i1 = int(np.searchsorted(s, hi, side="left"))                  # ... and those starting before hi
    total = 0
    for a in range(i0, i1, _CHUNK):
        b = min(a + _CHUNK, i1)
        total += int((np.minimum(e[a:b], hi) - np.maximum(s[a:b], lo)).sum())   # lengths: no sum of times
    return total


def count_gaps_from(iv: IntervalSet, lo: int, hi: int) -> int:
    """How many holes between consecutive intervals of a normal-form set start in ``[lo, hi)``
    (``gaps(iv, 0)``'s, counted by search: each starts where an interval but the last ends)."""
    e = iv[1][:-1]
    return int(np.searchsorted(e, hi, side="left") - np.searchsorted(e, lo, side="left"))


def overlap(iv: IntervalSet, q_starts, q_ends) -> np.ndarray:
    """Per query interval, the length of its overlap with the normal-form set ``iv``, ns."""
    qs, qe = _as_i64(q_starts), _as_i64(q_ends)
    return np.maximum(covered_upto(iv, qe) - covered_upto(iv, qs), 0)


def touches(iv: IntervalSet, q_starts: np.ndarray, q_ends: np.ndarray) -> np.ndarray:
    """Per query interval, whether it overlaps the normal-form set ``iv`` (a positive overlap): one
    search a query, where ``overlap`` takes two and its sums."""
    s, e = iv
    qs, qe = _as_i64(q_starts), _as_i64(q_ends)
    if len(s) == 0:
        return np.zeros(qs.shape, bool)
    i = np.searchsorted(e, qs, side="right")          # the first interval ending past the query's start
    ok = i < len(s)
    ok[ok] = np.maximum(s[i[ok]], qs[ok]) < qe[ok]
    return ok


def _points(iv: IntervalSet) -> np.ndarray:
    """A normal-form set as its strictly increasing boundaries ``s0, e0, s1, e1, ...``."""
    out = np.empty(2 * len(iv[0]), dtype=np.int64)
    out[0::2], out[1::2] = iv
    return out


def _combine(a: IntervalSet, b: IntervalSet, op) -> IntervalSet:
    pa, pb = _points(a), _points(b)
    bounds = sorted_unique(np.concatenate([pa, pb]))      # two sorted runs: a linear merge
    if len(bounds) < 2:
        return empty()
    left, right = bounds[:-1], bounds[1:]
    # inside a set <=> an odd number of its boundaries lie at or before the point
    in_a = (np.searchsorted(pa, left, side="right") & 1).astype(bool)
    in_b = (np.searchsorted(pb, left, side="right") & 1).astype(bool)
    keep = op(in_a, in_b)
    return union(left[keep], right[keep])


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """``a ∩ b`` of two normal-form sets.

    NOTE: each side is first cut (views, a binary search) to the intervals that reach into the
    other's span: a thread's launch bursts over a whole trace against one window's few bubbles
    costs the bubbles, not the bursts."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return empty()
    a = _near(a, int(b[0][0]), int(b[1][-1]))
    if len(a[0]) == 0:
        return empty()
    b = _near(b, int(a[0][0]), int(a[1][-1]))
    if len(b[0]) == 0:
        return empty()
    b = _pick(b, _touching(b, a))
    if len(b[0]) == 0:
        return empty()
    return _combine(_pick(a, _touching(a, b)), b, np.logical_and)


def _near(iv: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The intervals of a normal-form set that overlap ``[lo, hi)`` (views, whole intervals)."""
    s, e = iv
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    return s[i0:max(i0, i1)], e[i0:max(i0, i1)]


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """``a \\ b`` of two normal-form sets."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    b = _pick(b, _touching(b, a))
    if len(b[0]) == 0:
        return a
    hit = _touching(a, b)
    if hit is None:
        return _combine(a, b, lambda x, y: x & ~y)
    # the intervals of ``a`` no interval of ``b`` reaches stay whole; they touch no piece of the rest
    s, e = _combine(_pick(a, hit), b, lambda x, y: x & ~y)
    s, e = np.concatenate([a[0][~hit], s]), np.concatenate([a[1][~hit], e])
    order = np.argsort(s, kind="stable")
    return s[order], e[order]


def _touching(x: IntervalSet, y: IntervalSet) -> np.ndarray | None:
    """Mask of the intervals of ``x`` that overlap some interval of ``y`` (both normal form), or
    None when all do: per interval of ``y`` one index range of ``x``, two binary searches.
    NOTE: an interval of ``x`` that only shares an end point with ``y`` does not overlap it."""
    n = len(x[0])
    lo = np.searchsorted(x[1], y[0], side="right")    # first x ending after the y interval's start
    hi = np.searchsorted(x[0], y[1], side="left")     # first x starting at or after its end
    ok = hi > lo
    depth = np.cumsum(np.bincount(lo[ok], minlength=n + 1) - np.bincount(hi[ok], minlength=n + 1))
    hit = depth[:n] > 0
    return None if hit.all() else hit


def _pick(x: IntervalSet, mask: np.ndarray | None) -> IntervalSet:
    return x if mask is None else (x[0][mask], x[1][mask])


def gaps(iv: IntervalSet, min_len_ns: int = 0) -> IntervalSet:
    """The holes between consecutive intervals of a normal-form set longer than ``min_len_ns``.

    NOTE: only inside the set's own span: nothing before its first start or after its last end.
    """
    s, e = iv
    if len(s) < 2:
        return empty()
    gs, ge = e[:-1], s[1:]
    keep = (ge - gs) > min_len_ns
    return gs[keep], ge[keep]


def clip(iv: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The part of a normal-form set inside ``[lo, hi)``."""
    s, e = iv
    s2, e2 = np.maximum(s, lo), np.minimum(e, hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def split_at(starts, ends, cuts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each interval at every point of the sorted ``cuts`` strictly inside it.

    Returns ``(piece_starts, piece_ends, source_index)``; the pieces of one interval are contiguous
    and add up to it exactly.
    """
    s, e = _as_i64(starts), _as_i64(ends)
    c = sorted_unique(cuts)
    lo = np.searchsorted(c, s, side="right")
    hi = np.searchsorted(c, e, side="left")
    k = np.maximum(hi - lo, 0)
    n_pieces = k + 1
    src = np.repeat(np.arange(len(s)), n_pieces)
    first = np.r_[0, np.cumsum(n_pieces)[:-1]]
    j = np.arange(len(src)) - np.repeat(first, n_pieces)  # piece number inside its interval
    kk = np.repeat(k, n_pieces)
    lo_r = np.repeat(lo, n_pieces)
    ps = np.where(j == 0, s[src], c[np.minimum(lo_r + j - 1, max(len(c) - 1, 0))] if len(c) else s[src])
    pe = np.where(j == kk, e[src], c[np.minimum(lo_r + j, max(len(c) - 1, 0))] if len(c) else e[src])
    return ps.astype(np.int64), pe.astype(np.int64), src
