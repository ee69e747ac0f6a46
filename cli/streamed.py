"""Over ``--memory-budget``: one nsys export diagnosed whole, window by window, in bounded memory.

The export is read once into time buckets on disk (``readers/nsys_spill.py``, in a private folder
under ``$TMPDIR``, removed after) and diagnosed window by window (``analyzers/windowed_stream.py``):
the same JSON as a whole read, with the memory of one window. Traces the windowed path does not
cover (``windowed_first.NotWindowable`` says why) give None: the caller reads a window of the trace
instead (``analyzers/memory_plan.py``), and says so.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from srtscope.analyzers.forked import available
from srtscope.analyzers.readers.spill_folder import Ended, check_ended, spill_folder, sweep_stale
from srtscope.cli.errors import fail

if TYPE_CHECKING:
    from srtscope.analyzers.windowed_stream import Held

#: one process's part before its windows, bytes: the interpreter and libraries (the command's own
#: too), the spill's index; measured after the first pass and its heap trimmed (``forked.trim_heap``)
#: on exports of one step per 200 kernels and a bubble per step: 373 MiB at 3 GB, 852 at 10 GB, and
#: ~80 MiB more for the command than for the library alone
BASE_BYTES = 300 << 20
#: ... and per GB of export: ranges, steps and per-step tables held whole, the parts of the windows
#: walked, kept for the reduction, bytes
PER_GB_BYTES = 70 << 20
#: one window's device row (with its API rows) while it is analysed, bytes (measured 320-577)
ROW_BYTES = 650
#: with two walks, each process's part before its windows, its heap trimmed at the fork
#: (``forked.Beside``): measured 346 MiB at 3 GB, ~580 at 10 GB; a window's row, measured 336-550 B
TRIMMED_BASE_BYTES, TRIMMED_PER_GB_BYTES, TWO_WALK_ROW_BYTES = 250 << 20, 50 << 20, 600
#: after the first pass (``resized``), each step's share of what the windows keep for the reduction
#: (its bubbles, their attributed pieces, its accounts), bytes: 1.27-1.31 KB at 3 and 10 GB (two
#: bubbles a step); a window's own bytes besides its rows (the chunks read, what it carries), and a
#: row's: fitted on 10 GB walked once, 3 GB walked twice and a 2 GB export of two ranks (146, 72
#: and 209 MiB; 221-300 B a row)
PART_STEP_BYTES, WINDOW_BYTES, MEASURED_ROW_BYTES = 1300, 200 << 20, 300
#: the reduction's matching of the collectives, bytes a collective row (234 MiB over 2.85 M)
MATCH_ROW_BYTES = 90
MIN_ROWS, MAX_ROWS = 100_000, 4_000_000
#: the fewest device rows a window of each of two walks holds (``walks``)
MIN_SPLIT_ROWS = 500_000
WALKS_ENV = "SRTSCOPE_WINDOW_WALKS"
#: disk the spill takes per byte of export at most: every column varying within a chunk and none of
#: them narrower packed (``time_spool``); a generated export's spill, its kernels' ids mostly one
#: value a chunk, takes 0.17
SPILL_SHARE = 0.85


def over_budget(path: Path, budget_bytes: int) -> bool:
    """Whether ``path`` is an nsys export whose whole read's estimated peak is over the budget."""
    from srtscope.analyzers.readers import detect_format_quiet
    from srtscope.analyzers.readers.memory_estimate import estimate_quiet
    from srtscope.analyzers.timeline import SourceFormat

    try:
        fmt = detect_format_quiet(path) if path.is_file() else None
    except OSError:
        return False                    # the read says what is wrong
    if fmt is not SourceFormat.NSYS_SQLITE:
        return False
    est = estimate_quiet(path, fmt)
    return est is not None and est.peak_bytes > budget_bytes


def window_rows(budget_bytes: int, export_bytes: int, processes: int = 1, first: Held | None = None) -> int:
    """Device rows a window of each of ``processes`` walks (1 or 2) may hold so that together they
    keep to ``budget_bytes``: each process holds its own part before its windows (pages a forked
    copy shares count twice) and its windows' rows. ``first``: what the first pass left
    (``windowed_stream.Held``), the windows never larger than the export's size alone gives."""
    part, row = _held_and_row(export_bytes, processes)
    rows = (budget_bytes / processes - part) / row
    if first is not None:
        rows = min(rows, (budget_bytes / processes - _measured_part(first, processes)) / MEASURED_ROW_BYTES)
    return int(min(MAX_ROWS, max(MIN_ROWS, rows)))


def modelled_peak(export_bytes: int, rows: int, processes: int = 1, first: Held | None = None) -> int:
    """Bytes all ``processes`` hold at their peak with windows of ``rows`` (``window_rows``' model);
    with ``first``, from what it measured: the windows' peak or the reduction's, whichever is more."""
    if first is None:
        part, row = _held_and_row(export_bytes, processes)
        return int(processes * (part + rows * row))
    return int(max(processes * (_measured_part(first, processes) + rows * MEASURED_ROW_BYTES),
                   reduction_peak(first)))


def reduction_peak(first: Held) -> int:
    """Bytes the reduction holds at its peak: the part held, every window's parts and their join, the
    collectives matched."""
    return int(first.resident_bytes + 2 * PART_STEP_BYTES * first.steps + MATCH_ROW_BYTES * first.collectives)


def _held_and_row(export_bytes: int, processes: int) -> tuple[float, int]:
    """One process's part before its windows and a window row's bytes, for one walk or two, from
    the export's size alone."""
    gb = export_bytes / 1e9
    if processes == 1:
        return BASE_BYTES + PER_GB_BYTES * gb, ROW_BYTES
    return TRIMMED_BASE_BYTES + TRIMMED_PER_GB_BYTES * gb, TWO_WALK_ROW_BYTES


def _measured_part(first: Held, processes: int) -> float:
    """One process's part before its windows' rows, from what the first pass left: the bytes held,
    its share of the parts the windows keep, a window's own (an export of several ranks also holds
    every rank's collective rows whole, which its size alone does not tell)."""
    return first.resident_bytes + PART_STEP_BYTES * first.steps / processes + WINDOW_BYTES


def walks(budget_bytes: int, export_bytes: int, first: Held | None = None) -> tuple[int, int]:
    """(device rows a window, walks): two walks where a second core is free and each walk's window
    still holds ``MIN_SPLIT_ROWS`` within the budget for both processes (smaller windows cost more
    than the second core gives back); ``$SRTSCOPE_WINDOW_WALKS`` (1 or 2) decides instead, for
    measurements. ``first``: as ``window_rows``."""
    want = os.environ.get(WALKS_ENV, "")
    two_rows = window_rows(budget_bytes, export_bytes, 2, first)
    two = want == "2" if want in ("1", "2") else two_rows >= MIN_SPLIT_ROWS
    return (two_rows, 2) if two and available() else (window_rows(budget_bytes, export_bytes, 1, first), 1)


def resized(budget_bytes: int, export_bytes: int,
            note: Callable[[int], None]) -> Callable[[Held, int, int], tuple[int, int]]:
    """``diagnose_streamed``'s ``resize``: after the first pass, the windows of ``walks`` with what
    it left (``windowed_stream.Held``), never larger nor more walks than planned from the size alone; ``note(bytes)``
    is told the modelled peak where even the smallest windows pass the budget."""
    def resize(first: Held, rows: int, workers: int) -> tuple[int, int]:
        new_rows, new_workers = walks(budget_bytes, export_bytes, first)
        if new_workers > workers:           # planned as one walk: one, sized for one
            new_rows, new_workers = window_rows(budget_bytes, export_bytes, 1, first), 1
        rows = min(rows, new_rows) if new_workers == workers else new_rows
        need = modelled_peak(export_bytes, rows, new_workers, first)
        if need > budget_bytes:
            note(need)
        return rows, new_workers
    return resize


def diagnose_in_windows(path: Path, params: Any, budget_bytes: int, console: Console | None,
                        quiet: bool) -> Any:
    """The whole-trace Diagnosis of one nsys export within ``budget_bytes``, or None where the
    windowed path does not cover the trace (said on stderr)."""
    from srtscope.cli.loading import keep_freed_memory

    size = path.stat().st_size
    tmp = Path(tempfile.gettempdir())
    sweep_stale(tmp, _note)             # a killed run's spill: its space counts as free
    free = shutil.disk_usage(tmp).free
    if free < SPILL_SHARE * size + (1 << 30):
        print(f"srtscope: note: {path.name}: not diagnosed whole in windows: its spill needs "
              f"~{SPILL_SHARE * size / 2**30:.1f} GiB free under {tmp} ({free / 2**30:.1f} GiB; set TMPDIR)",
              file=sys.stderr)
        return None
    said: list[bool] = []

    def over(need: int) -> None:        # the fewest rows a window, and still more: say so, once
        if not said:
            said.append(True)
            print(f"srtscope: note: {path.name}: what a diagnosis in windows holds at this size, ~{need >> 20} MiB, "
                  f"passes --memory-budget {budget_bytes >> 20} MiB", file=sys.stderr)
    rows, workers = walks(budget_bytes, size)
    need = modelled_peak(size, rows, workers)
    if need > budget_bytes:
        over(need)
    keep_freed_memory()                 # before the spill's threads start (one arena for them all)
    try:
        return _spilled(path, params, budget_bytes, console, quiet, rows, workers, over)
    except Ended as exc:
        print(f"srtscope: interrupted ({exc.name})", file=sys.stderr)
        raise SystemExit(128 + exc.signum) from None


def _note(line: str) -> None:
    print(f"srtscope: note: {line}", file=sys.stderr)


def _spilled(path: Path, params: Any, budget_bytes: int, console: Console | None, quiet: bool, rows: int,
             workers: int, over: Callable[[int], None]) -> Any:
    """``diagnose_in_windows`` once planned: spilled, then diagnosed window by window."""
    from srtscope.analyzers.readers import TraceError, rank_from_name, read_spilled
    from srtscope.analyzers.windowed_stream import NotWindowable, diagnose_streamed

    size = path.stat().st_size
    rank = rank_from_name(path) or 0
    with spill_folder() as folder, _bar(console, quiet, path) as tick:
        try:
            with _scanned(tick, path):
                src = read_spilled(path, rank, folder)
            def progress(f: float) -> None:
                check_ended()           # after the first pass and each window
                tick(0.5 + 0.5 * f, "diagnosing in windows")
            with src:
                return diagnose_streamed(src, params, rows, workers=workers, progress=progress,
                                         resize=resized(budget_bytes, size, over))
        except NotWindowable as exc:
            print(f"srtscope: note: {path.name}: not diagnosed whole in windows ({exc})", file=sys.stderr)
            return None
        except TraceError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{path}: cannot spill to {folder}: {exc.strerror or exc}")


@contextmanager
def _bar(console: Console | None, quiet: bool, path: Path) -> Iterator[Callable[[float, str], None]]:
    """A progress bar on the console (nothing when quiet): ``tick(fraction, what)``."""
    def silent(fraction: float, what: str = "") -> None:
        return None

    if quiet or console is None:
        yield silent
        return
    with Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=True) as prog:
        task = prog.add_task(f"reading {path.name}"[:48], total=1.0)

        def tick(fraction: float, what: str = "") -> None:
            prog.update(task, completed=max(0.0, min(1.0, fraction)),
                        description=f"{what} {path.name}"[:48] if what else None)
        yield tick


@contextmanager
def _scanned(tick: Callable[[float, str], None], path: Path) -> Iterator[None]:
    """The scan's rows as the first half of the bar."""
    import threading

    from srtscope.analyzers.readers.columnar import report_scans
    from srtscope.analyzers.readers.nsys_sqlite import scan_estimate

    total = max(scan_estimate(path), 1)
    done = [0]
    lock = threading.Lock()

    def scanned(rows: int) -> None:
        with lock:
            done[0] += rows
            tick(0.5 * min(1.0, done[0] / total), "reading")
        check_ended()
    with report_scans(scanned):
        yield
