"""A rank file's rank from its name: ``rank3``, ``rank_3``, ``RANK-3``; nothing from a number that
runs on into a unit (a size in a benchmark file's name) or from "rank" inside another word."""
from __future__ import annotations

import pytest

from srtscope.analyzers.readers import rank_from_name


@pytest.mark.parametrize("name, rank", [
    ("profile_rank3.sqlite", 3),            # nsys -o profile_rank%q{RANK}
    ("rank_3.sqlite", 3),
    ("RANK-12.nsys.sqlite", 12),
    ("rank03.pt.trace.json", 3),
    ("worker_rank_1_step5.json.gz", 1),     # another number after it: the rank's own ends first
    ("two_rank_2000mb.sqlite", None),       # a size, not rank 2000
    ("rank2gpu.sqlite", None),
    ("frank1.sqlite", None),                # a word that ends in "rank"
    ("trace.sqlite", None),
])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(f"/data/run/{name}") == rank


def test_only_the_file_name_counts() -> None:
    assert rank_from_name("/runs/rank7/trace.sqlite") is None
