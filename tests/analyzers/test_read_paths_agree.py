"""One damaged export, one answer, whatever the read path (issue 43): edits of a real nsys export
(columns dropped or renamed; text, NULL, REAL, blobs in integer columns; end before start; times
near int64's limits; names that are not UTF-8; many distinct names; empty and missing tables)
diagnosed whole (``--memory-budget none``) and in windows (``--memory-budget 100MiB``: the spill
and ``stream``) exit alike, never 1: on 0 with the same JSON byte for byte, on 2 with the
same one ``srtscope: error:`` line. The export is read in place and edited in a copy under tmp_path.
"""
from __future__ import annotations

import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtscope.cli.app import app
from tests.conftest import REAL_TRACES

SOURCE = REAL_TRACES / "nsys" / "saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite"
K, MC, RT = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME"
NV, S = "NVTX_EVENTS", "StringIds"
#: the export's one CUDA process (globalTid of its main thread) and its kernels' name id
TID, KNAME = 302119224788637, 670
I64_MAX, I64_MIN = (1 << 63) - 1, -(1 << 63)
#: a budget under any diagnosis' modelled peak: every export is diagnosed in windows
WINDOWED = "100MiB"
#: ``N`` rows 0..N-1 as ``i`` for an INSERT ... SELECT
SERIES = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) "


@dataclass(frozen=True)
class Edit:
    """A named damage: SQL statements run in order on the copy."""

    name: str
    sql: tuple[str, ...]


def edit(name: str, *sql: str) -> Edit:
    return Edit(name, sql)


def loose(table: str) -> tuple[str, ...]:
    """``table`` made again without its constraints (NOT NULL, keys): any value fits anywhere."""
    return (f"CREATE TABLE loose AS SELECT * FROM {table}", f"DROP TABLE {table}",
            f"ALTER TABLE loose RENAME TO {table}")


def _distinct_ranges(n: int) -> str:
    """``n`` NVTX push/pop ranges of distinct names, 50 us apart, over the kernels' time."""
    return (SERIES.format(last=n - 1) + f"INSERT INTO {NV} (start, end, eventType, text, globalTid, domainId) "
            f"SELECT 900000000 + i * 50000, 900000000 + i * 50000 + 20000, 59, 'range_' || i, {TID}, 0 FROM n")


def _distinct_calls() -> tuple[str, ...]:
    """Every CUDA API row named anew (``cudaCall_<rowid>``): names no API kind is known by."""
    return (f"INSERT INTO {S} (id, value) SELECT 200000 + rowid, 'cudaCall_' || rowid FROM {RT}",
            f"UPDATE {RT} SET nameId = 200000 + rowid")


#: why the windows answer otherwise where the API rows' names tell no kind (issue 43)
def _distinct_kernels(n: int) -> tuple[str, ...]:
    """``n`` kernels of distinct names (new StringIds), 20 us apart after the last kernel."""
    return (*loose(K),
            SERIES.format(last=n - 1) + f"INSERT INTO {S} (id, value) SELECT 100000 + i, 'kernel_' || i FROM n",
            SERIES.format(last=n - 1) + f"INSERT INTO {K} (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, demangledName, shortName, mangledName, launchType, cacheConfig, "
            "registersPerThread) SELECT 1970000000 + i * 20000, 1970000000 + i * 20000 + 10000, 0, 1, 7, "
            "-1, 302119223558144, 100000 + i, 100000 + i, 100000 + i, 0, 0, 32 FROM n")


EDITS: list[Edit] = [
    edit("unchanged"),
    # kernel table: values of the wrong type, NULLs, impossible times, columns gone
    edit("kernel_start_text", f"UPDATE {K} SET start = 'soon' WHERE rowid = 2"),
    edit("kernel_start_numeric_text", f"UPDATE {K} SET start = CAST(start AS TEXT) WHERE rowid = 2"),
    edit("kernel_end_null", *loose(K), f"UPDATE {K} SET end = NULL WHERE rowid = 3"),
    edit("kernel_start_real", f"UPDATE {K} SET start = start + 0.5 WHERE rowid = 2"),
    edit("kernel_end_blob", f"UPDATE {K} SET end = X'00ff00ff' WHERE rowid = 4"),
    edit("kernel_end_before_start", f"UPDATE {K} SET end = start - 1000 WHERE rowid = 2"),
    edit("kernel_end_int64_max", f"UPDATE {K} SET end = {I64_MAX} WHERE rowid = 5"),
    edit("kernel_start_int64_min", f"UPDATE {K} SET start = {I64_MIN} WHERE rowid = 1"),
    edit("kernel_ends_1e18_later", f"UPDATE {K} SET end = end + 1000000000000000000 WHERE rowid = 3"),
    edit("kernel_all_at_int64_max", f"UPDATE {K} SET start = {I64_MAX} - 10, end = {I64_MAX}"),
    edit("kernel_device_text", f"UPDATE {K} SET deviceId = 'gpu0' WHERE rowid = 2"),
    edit("kernel_stream_null", *loose(K), f"UPDATE {K} SET streamId = NULL WHERE rowid = 2"),
    edit("kernel_correlation_real", f"UPDATE {K} SET correlationId = 1.25 WHERE rowid = 2"),
    edit("kernel_pid_text", f"UPDATE {K} SET globalPid = 'x' WHERE rowid = 2"),
    edit("kernel_name_text", f"UPDATE {K} SET demangledName = 'saxpy' WHERE rowid = 2"),
    edit("kernel_name_unknown_id", f"UPDATE {K} SET demangledName = 99999999 WHERE rowid = 2"),
    edit("kernel_start_dropped", f"ALTER TABLE {K} DROP COLUMN start"),
    edit("kernel_end_renamed", f"ALTER TABLE {K} RENAME COLUMN end TO stop"),
    edit("kernel_names_dropped", f"ALTER TABLE {K} DROP COLUMN demangledName",
         f"ALTER TABLE {K} DROP COLUMN shortName"),
    edit("kernel_empty", f"DELETE FROM {K}"),
    edit("kernel_missing", f"DROP TABLE {K}"),
    edit("device_tables_missing", f"DROP TABLE {K}", f"DROP TABLE {MC}"),
    edit("kernel_distinct_names", *_distinct_kernels(20_000)),
    # copies
    edit("memcpy_bytes_text", f"UPDATE {MC} SET bytes = 'many' WHERE rowid = 3"),
    edit("memcpy_kind_null", *loose(MC), f"UPDATE {MC} SET copyKind = NULL WHERE rowid = 3"),
    edit("memcpy_end_before_start", f"UPDATE {MC} SET end = start - 5 WHERE rowid = 3"),
    edit("memcpy_start_int64_min", f"UPDATE {MC} SET start = {I64_MIN} WHERE rowid = 3"),
    # CUDA API rows
    edit("runtime_start_text", f"UPDATE {RT} SET start = 'x' WHERE rowid = 7"),
    edit("runtime_end_null", *loose(RT), f"UPDATE {RT} SET end = NULL WHERE rowid = 7"),
    edit("runtime_tid_real", f"UPDATE {RT} SET globalTid = 1.5 WHERE rowid = 7"),
    edit("runtime_name_null", *loose(RT), f"UPDATE {RT} SET nameId = NULL WHERE rowid = 7"),
    edit("runtime_end_before_start", f"UPDATE {RT} SET end = start - 1 WHERE rowid = 7"),
    edit("runtime_end_int64_max", f"UPDATE {RT} SET end = {I64_MAX} WHERE rowid = 7"),
    edit("runtime_name_dropped", f"ALTER TABLE {RT} DROP COLUMN nameId"),
    # API names no call kind has (their kernels' launches too): no launching thread either way
    edit("runtime_distinct_names", *_distinct_calls()),
    edit("runtime_empty", f"DELETE FROM {RT}"),
    edit("runtime_missing", f"DROP TABLE {RT}"),
    # NVTX
    edit("nvtx_start_text", f"UPDATE {NV} SET start = 'x' WHERE rowid = 6"),
    edit("nvtx_end_before_start", f"UPDATE {NV} SET end = start - 1 WHERE rowid = 6"),
    edit("nvtx_type_text", f"UPDATE {NV} SET eventType = 'push' WHERE rowid = 6"),
    edit("nvtx_text_invalid_utf8", f"UPDATE {NV} SET text = CAST(X'ff6661' AS TEXT) WHERE rowid = 6"),
    edit("nvtx_text_blob", f"UPDATE {NV} SET text = X'00ff' WHERE rowid = 6"),
    edit("nvtx_domain_text", f"UPDATE {NV} SET domainId = 'd' WHERE rowid = 6"),
    edit("nvtx_end_1e18_later", f"UPDATE {NV} SET end = end + 1000000000000000000 WHERE rowid = 6"),
    edit("nvtx_empty", f"DELETE FROM {NV}"),
    edit("nvtx_missing", f"DROP TABLE {NV}"),
    edit("nvtx_distinct_names", _distinct_ranges(20_000)),
    # the strings
    edit("kernel_name_invalid_utf8", f"UPDATE {S} SET value = CAST(X'c328' AS TEXT) WHERE id = {KNAME}"),
    edit("string_null", *loose(S), f"UPDATE {S} SET value = NULL WHERE id = {KNAME}"),
    edit("string_blob", f"UPDATE {S} SET value = X'00' WHERE id = {KNAME}"),
    edit("string_huge", f"UPDATE {S} SET value = printf('%.*c', 2000000, 'k') WHERE id = {KNAME}"),
    edit("string_value_renamed", f"ALTER TABLE {S} RENAME COLUMN value TO text"),
    edit("strings_missing", f"DROP TABLE {S}"),
    # the session
    edit("session_start_text", "UPDATE ANALYSIS_DETAILS SET startTime = 'then'"),
    edit("session_stop_1e18_later", "UPDATE ANALYSIS_DETAILS SET stopTime = stopTime + 1000000000000000000"),
    edit("gpu_id_text", "UPDATE TARGET_INFO_GPU SET id = 'zero'"),
]

runner = CliRunner()


@dataclass(frozen=True)
class Answer:
    code: int
    stdout: str
    errors: list[str]           # ``srtscope: error:`` lines
    others: list[str]           # any other stderr line that is not a note
    crash: str                  # an exception that escaped the CLI (exit 1)


def diagnose(path: Path, budget: str) -> Answer:
    """``srtscope diagnose PATH --json --no-cache --memory-budget BUDGET``, in this process."""
    r = runner.invoke(app, ["diagnose", str(path), "--json", "--no-cache", "--memory-budget", budget],
                      env={"COLUMNS": "200", "SRTSCOPE_WINDOW_WALKS": "1"})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    crash = "" if r.exception is None or isinstance(r.exception, SystemExit) else repr(r.exception)
    return Answer(r.exit_code, r.stdout, [ln for ln in lines if ln.startswith("srtscope: error: ")],
                  [ln for ln in lines if not ln.startswith(("srtscope: error: ", "srtscope: note: "))], crash)


def damaged(tmp_path: Path, e: Edit) -> Path:
    """A copy of ``SOURCE`` under ``tmp_path`` with ``e`` applied."""
    out = tmp_path / f"{e.name}.sqlite"
    shutil.copyfile(SOURCE, out)
    con = sqlite3.connect(out)
    try:
        for stmt in e.sql:
            con.execute(stmt)
        con.commit()
    finally:
        con.close()
    return out


@pytest.fixture
def spills(monkeypatch) -> list[Path]:
    """The exports ``read_nsys_spilled`` read (the windowed path ran on them)."""
    from srtscope.analyzers.spill import nsys_spill

    seen: list[Path] = []
    real = nsys_spill.read_nsys_spilled

    def spy(path, *args, **kw):
        seen.append(Path(path))
        return real(path, *args, **kw)
    monkeypatch.setattr(nsys_spill, "read_nsys_spilled", spy)
    return seen


def _params() -> list:
    return [pytest.param(e, id=e.name)
            for e in EDITS]


def test_the_edits_are_distinct() -> None:
    assert len({e.name for e in EDITS}) == len(EDITS) >= 30


@pytest.mark.parametrize("e", _params())
def test_whole_and_windowed_reads_agree(e: Edit, tmp_path: Path, spills: list[Path]) -> None:
    if not SOURCE.is_file():
        pytest.skip(f"{SOURCE} not found (needs the shared/ folder beside the repo)")
    path = damaged(tmp_path, e)
    whole = diagnose(path, "none")
    assert not spills, "a budget of none read the export in windows"
    windowed = diagnose(path, WINDOWED)
    assert spills == [path], "the windowed path did not run"
    for how, a in (("whole", whole), ("windowed", windowed)):
        assert a.code in (0, 2) and not a.crash, (how, a.code, a.crash, a.errors, a.others)
        assert not a.others, (how, a.others)
        assert len(a.errors) == (a.code == 2), (how, a.errors)
    assert (whole.code, whole.errors) == (windowed.code, windowed.errors)
    if whole.code == 0:
        assert whole.stdout == windowed.stdout

