"""Bubbles: gaps in the union of a device's streams, inside its active window only."""
import numpy as np
import pytest

from srtscope.analyzers.analyses.bubbles import histogram
from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.model.params import DiagnoseParams
from tests.analyzers._tl import bubbles_of, kernel, timeline

US = 1000


def find_bubbles(tl, threshold_ns):
    """(bubbles with ``next_row``, by_device, by_stream) of a whole read."""
    b = diagnose(tl, DiagnoseParams(threshold_us=threshold_ns / US)).bubbles
    return bubbles_of(tl, threshold_ns), b.by_device, b.by_stream


def test_union_over_streams_and_window_edges():
    tl = timeline([
        kernel(100, 200, stream=7),     # first activity: the window starts here, not at 0
        kernel(150, 300, stream=8),     # another stream fills 200..300: no bubble there
        kernel(400, 500, stream=7),     # 300..400 idle on both streams -> one bubble
        kernel(503, 600, stream=7),     # 3 µs gap: under the 5 µs threshold
    ])
    b, by_dev, by_stream = find_bubbles(tl, 5 * US)
    assert b[["start_ns", "end_ns", "dur_ns"]].values.tolist() == [[300 * US, 400 * US, 100 * US]]
    assert tl.device.iloc[int(b["next_row"][0])]["start_ns"] == 400 * US   # the work that ends it
    row = by_dev.iloc[0]
    assert row["window_ns"] == 500 * US and row["busy_ns"] == 397 * US and row["bubble_ns"] == 100 * US
    # per-stream view: stream 8 alone has no gap; stream 7 has 200..400 and the 3 µs one (>= 0 threshold)
    s7 = by_stream[by_stream["stream"] == 7].iloc[0]
    assert s7["gap_count"] == 1 and s7["gap_ns"] == 200 * US


def test_devices_and_ranks_are_kept_apart():
    tl = timeline([
        kernel(0, 100, device=0, rank=0), kernel(200, 300, device=0, rank=0),   # rank 0: bubble 100 µs
        kernel(100, 200, device=0, rank=1),                                     # rank 1 fills rank 0's gap
        kernel(0, 50, device=1, rank=0), kernel(60, 70, device=1, rank=0),     # device 1: 10 µs bubble
    ], ranks=(0, 1))
    b, by_dev, _ = find_bubbles(tl, 5 * US)
    got = sorted(map(tuple, b[["rank", "device", "dur_ns"]].values.tolist()))
    assert got == [(0, 0, 100 * US), (0, 1, 10 * US)]
    assert len(by_dev) == 3


def test_threshold_is_strict_and_validated():
    tl = timeline([kernel(0, 10), kernel(15, 20)])        # exactly 5 µs gap
    assert len(find_bubbles(tl, 5 * US)[0]) == 0
    assert len(find_bubbles(tl, 4 * US)[0]) == 1
    with pytest.raises(ValueError, match="threshold"):
        find_bubbles(tl, -1)


def test_empty_device_table():
    b = bubbles_of(timeline(), 5 * US)
    d = diagnose(timeline())
    assert len(b) == 0 and len(d.bubbles.by_device) == 0 and len(d.bubbles.by_stream) == 0


def test_histogram_counts_and_totals():
    bins = histogram(np.array([6, 15, 15, 700, 80_000]) * US)
    by_lo = {b.lo_ns // US: (b.count, b.total_ns // US) for b in bins if b.count}
    assert by_lo == {0: (1, 6), 10: (2, 30), 500: (1, 700), 50_000: (1, 80_000)}
    assert bins[-1].hi_ns is None and sum(b.count for b in bins) == 5
