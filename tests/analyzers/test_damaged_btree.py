"""Damaged b-trees of big exports (issue 47): files too big for a full ``PRAGMA quick_check`` before
every read are read first and checked in full only when the read looks wrong. Two damages that
SQLite itself reads without an error must still look wrong:

- a kernel table's root overwritten by one of its leaves: SQLite answers that leaf's rows alone
  (57 of 5.3 M kernels in the audit), in rowid order -- the other pages are reached by no b-tree;
- an interior page whose child points back at the table's root: SQLite's cursor reads the subtrees
  again and again (2.8 GB under a 1.5 GiB budget in the audit) -- now bounded by the rows the
  table's rowids can hold.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

import srtscope.analyzers.readers.nsys_sqlite as nsys_sqlite
from sample_traces.nsys_schema import NsysWriter
from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.analyzers.readers.btree_reach import unreached
from srtscope.analyzers.readers.columnar import connect_arrow, fetch_ints
from srtscope.analyzers.readers.nsys_tables import connect_readonly

N_KERNELS = 20_000      # a kernel table of a few hundred pages: most of the file
PAGE = 4096
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"


def _export(path: Path) -> Path:
    w = NsysWriter(path)
    w.add_gpu()
    t = 1_000_000 + np.arange(N_KERNELS, dtype=np.int64) * 20_000
    w.add_kernels(t + 5_000, t + 15_000, [f"kernel_{i % 17}" for i in range(N_KERNELS)],
                  correlation=np.arange(N_KERNELS))
    w.add_runtime(t, t + 3_000, ["cudaLaunchKernel"] * N_KERNELS, correlation=np.arange(N_KERNELS))
    w.add_nvtx(t[::10], t[::10] + 200_000, ["loop.step"] * (N_KERNELS // 10), domain="srtscope")
    return w.close()


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return _export(tmp_path_factory.mktemp("src") / "trace.sqlite")


def _root(path: Path) -> int:
    con = connect_readonly(path)
    try:
        return int(con.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (KERNELS,)).fetchone()[0])
    finally:
        con.close()


def _page(data: bytes, p: int) -> bytes:
    return data[(p - 1) * PAGE:p * PAGE]


def _root_is_a_leaf(data: bytes, root: int) -> bytes:
    """The kernel table's root page replaced by its first leaf (the damage SQLite reads silently)."""
    page = _page(data, root)
    assert page[0] == 0x05, "the kernel table must span several leaves for this damage"
    first_cell = int.from_bytes(page[12:14], "big")
    leaf = int.from_bytes(page[first_cell:first_cell + 4], "big")
    out = bytearray(data)
    out[(root - 1) * PAGE:root * PAGE] = _page(data, leaf)
    return bytes(out)


def _child_is_the_root(data: bytes, root: int) -> bytes:
    """The root's right-most child pointer set to the root itself: a loop in the b-tree."""
    out = bytearray(data)
    at = (root - 1) * PAGE + 8
    out[at:at + 4] = root.to_bytes(4, "big")
    return bytes(out)


def test_a_sound_export_is_fully_reached(export):
    """Scenario: no damage. The check never makes a sound file suspect (no full check paid)."""
    con = connect_readonly(export)
    try:
        assert unreached(export, con) == ""
    finally:
        con.close()


@pytest.mark.parametrize("damage, phrase", [
    (_root_is_a_leaf, "reached by no b-tree"),
    (_child_is_the_root, "reached twice"),
], ids=["root_is_a_leaf", "child_is_the_root"])
def test_damage_is_seen_by_the_reach(tmp_path, export, damage, phrase):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(damage(export.read_bytes(), _root(export)))
    con = connect_readonly(bad)
    try:
        assert phrase in unreached(bad, con)
    finally:
        con.close()


@pytest.mark.parametrize("damage", [_root_is_a_leaf, _child_is_the_root],
                         ids=["root_is_a_leaf", "child_is_the_root"])
def test_big_file_mode_refuses_what_sqlite_reads_silently(tmp_path, export, monkeypatch, damage):
    """Scenario: a file over ``QUICK_CHECK_ALWAYS_BYTES`` (forced to 0 here), damaged so that SQLite
    reads it without an error: refused with one line, never answered from part of its kernels."""
    monkeypatch.setattr(nsys_sqlite, "QUICK_CHECK_ALWAYS_BYTES", 0)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(damage(export.read_bytes(), _root(export)))
    with pytest.raises(TraceError) as err:
        load_timeline([bad], allow_no_kernels=True)
    msg = str(err.value)
    assert msg.startswith(f"{bad}: corrupt SQLite database") and "\n" not in msg


def test_rows_read_through_sqlite_stop_at_what_the_rowids_hold(tmp_path, export):
    """Scenario: the loop read through SQLite (no page reader): the read stops with a database error
    once more rows came than the table's rowids can hold, instead of growing with each pass."""
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(_child_is_the_root(export.read_bytes(), _root(export)))
    con = connect_arrow(bad)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="more rows than its rowids"):
            fetch_ints(con, KERNELS, ["start", "end"], rowids=(1, N_KERNELS))
    finally:
        con.close()
