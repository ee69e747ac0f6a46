"""Interval primitives: normal form, measures, set operations — checked against a brute-force grid."""
import numpy as np
import pytest

from srtscope.analyzers.model import intervals as iv


def grid(starts, ends, size=128):
    g = np.zeros(size, bool)
    for s, e in zip(starts, ends):
        g[s:e] = True
    return g


def as_grid(ivs, size=128):
    return grid(ivs[0], ivs[1], size)


@pytest.mark.parametrize("starts, ends, want", [
    ([], [], ([], [])),                                        # empty input
    ([5, 0, 3, 20], [8, 4, 6, 25], ([0, 20], [8, 25])),        # unsorted + overlapping + chained
    ([0, 4], [4, 8], ([0], [8])),                              # touching intervals merge
    ([3, 3], [3, 9], ([3], [9])),                              # zero-length input vanishes
    ([0, 1], [10, 2], ([0], [10])),                            # nested
])
def test_union_normal_form(starts, ends, want):
    s, e = iv.union(starts, ends)
    assert s.tolist() == want[0] and e.tolist() == want[1]


def test_gaps_only_inside_span_and_above_threshold():
    u = iv.union([0, 10, 13, 40], [5, 12, 30, 50])
    assert [x.tolist() for x in iv.gaps(u)] == [[5, 12, 30], [10, 13, 40]]
    assert [x.tolist() for x in iv.gaps(u, min_len_ns=2)] == [[5, 30], [10, 40]]
    assert [x.tolist() for x in iv.gaps(iv.union([0], [5]))] == [[], []]


def test_random_against_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(200):
        a_s = rng.integers(0, 60, 6)
        a_e = a_s + rng.integers(0, 8, 6)
        b_s = rng.integers(0, 60, 5)
        b_e = b_s + rng.integers(0, 8, 5)
        a, b = iv.union(a_s, a_e), iv.union(b_s, b_e)
        ga, gb = grid(a_s, a_e), grid(b_s, b_e)
        assert (as_grid(a) == ga).all()
        assert iv.total(a) == ga.sum()
        assert (as_grid(iv.intersect(a, b)) == (ga & gb)).all()
        assert (as_grid(iv.subtract(a, b)) == (ga & ~gb)).all()
        q0 = rng.integers(0, 60, 4)
        q1 = q0 + rng.integers(0, 20, 4)
        want = [ga[x:y].sum() for x, y in zip(q0, q1)]
        assert iv.overlap(a, q0, q1).tolist() == want
        # normal form: sorted, disjoint, not touching
        s, e = iv.intersect(a, b)
        assert (s[1:] > e[:-1]).all() and (e > s).all()


def test_intersect_of_a_long_set_and_a_narrow_one_against_brute_force():
    """The case ``intersect`` narrows for: many intervals (a thread's bursts over a trace) against a
    few in a short span (one window's bubbles), either side first, spans that touch or miss."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        a_s = rng.integers(0, 600, 40)
        a = iv.union(a_s, a_s + rng.integers(1, 12, 40))
        lo = int(rng.integers(0, 640))
        b_s = lo + rng.integers(0, 15, 3)
        b = iv.union(b_s, b_s + rng.integers(0, 10, 3))
        ga, gb = grid(*a, size=700), grid(*b, size=700)
        for x, y in ((a, b), (b, a)):
            got = iv.intersect(x, y)
            assert (as_grid(got, size=700) == (ga & gb)).all()
            assert (got[0][1:] > got[1][:-1]).all() and (got[1] > got[0]).all()
    edge = (np.array([0, 10]), np.array([5, 20]))
    assert iv.total(iv.intersect(edge, (np.array([5]), np.array([10])))) == 0    # touching: nothing
    assert iv.intersect(edge, (np.array([20]), np.array([30])))[0].tolist() == []


def _normal(x):
    return bool((x[0][1:] > x[1][:-1]).all() and (x[1] > x[0]).all())


@pytest.mark.parametrize("many, few, span", [
    (40, 3, 15),      # the few reach a short stretch: most of the many pass untouched
    (40, 3, 600),     # the few spread over the whole span
    (3, 40, 600),     # a few intervals minus many (collectives minus a window's compute)
    (40, 40, 600),    # both dense: nearly every interval touched (no narrowing)
])
def test_subtract_and_intersect_narrowed_against_brute_force(many, few, span):
    """``subtract`` / ``intersect`` work on the intervals of each side that reach the other; the
    rest pass whole or drop. Against the grid, and in normal form, either side first, with spans
    that touch at end points."""
    rng = np.random.default_rng(many * 1000 + few + span)
    for _ in range(300):
        a_s = rng.integers(0, 600, many)
        a = iv.union(a_s, a_s + rng.integers(1, 12, many))
        lo = int(rng.integers(0, 640 - min(span, 600)))
        b_s = lo + rng.integers(0, span, few)
        b = iv.union(b_s, b_s + rng.integers(0, 10, few))
        ga, gb = grid(*a, size=700), grid(*b, size=700)
        for x, y, gx, gy in ((a, b, ga, gb), (b, a, gb, ga)):
            got = iv.subtract(x, y)
            assert (as_grid(got, size=700) == (gx & ~gy)).all() and _normal(got)
            got = iv.intersect(x, y)
            assert (as_grid(got, size=700) == (gx & gy)).all() and _normal(got)
    edge = (np.array([0, 10]), np.array([5, 20]))
    # shares only end points with ``edge``: nothing taken away
    assert [v.tolist() for v in iv.subtract(edge, (np.array([5, 20]), np.array([10, 30])))] == [[0, 10], [5, 20]]
    assert [v.tolist() for v in iv.subtract(edge, (np.array([12]), np.array([14])))] == [[0, 10, 14], [5, 12, 20]]


def test_split_at_pieces_add_up():
    ps, pe, src = iv.split_at([0, 10, 30], [10, 25, 40], [5, 12, 20, 35, 100])
    assert ps.tolist() == [0, 5, 10, 12, 20, 30, 35]
    assert pe.tolist() == [5, 10, 12, 20, 25, 35, 40]
    assert src.tolist() == [0, 0, 1, 1, 1, 2, 2]
    ps, pe, src = iv.split_at([0, 50], [10, 60], [])              # no cuts: pieces = inputs
    assert ps.tolist() == [0, 50] and pe.tolist() == [10, 60] and src.tolist() == [0, 1]


def test_clip_and_covered_upto():
    u = iv.union([0, 20], [10, 30])
    assert [x.tolist() for x in iv.clip(u, 5, 25)] == [[5, 20], [10, 25]]
    assert iv.covered_upto(u, [0, 5, 15, 25, 99]).tolist() == [0, 5, 10, 15, 20]


@pytest.mark.parametrize("offset", [0, 1_700_000_000 * 10**9])    # session-relative and epoch ns
def test_measure_in_and_gap_count_match_clip_and_gaps(offset):
    """``measure_in`` / ``count_gaps_from`` (no array of the set's size) give what ``clip`` and
    ``gaps`` do, also at epoch timestamps (3 M intervals: more than one chunk)."""
    n = 3_000_000
    s = offset + np.arange(n, dtype=np.int64) * 10
    u = iv.union(s, s + 7)
    for lo, hi in ((offset - 5, offset + 10 * n + 5), (offset + 13, offset + 25_000_003), (offset + 40, offset + 40)):
        assert iv.measure_in(u, lo, hi) == iv.total(iv.clip(u, lo, hi))
        gs, _ = iv.gaps(u, 0)
        assert iv.count_gaps_from(u, lo, hi) == int(((gs >= lo) & (gs < hi)).sum())
