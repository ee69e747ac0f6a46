"""Trace files to a Diagnosis, within a memory budget: the one entry; how to read them is decided here.

    got = diagnose_traces(["run.sqlite"], DiagnoseParams(), 2 << 30)   # got.diagnosis, got.cut

- One nsys export or Kineto trace, no step range, its whole read's estimated peak
  (``readers/memory_estimate.py``) over the budget: read once into time buckets on disk
  (``spill/nsys_spill.py``, ``spill/kineto_spill.py``, in a private
  folder under ``$TMPDIR``, ``spill/spill_folder.py``, removed after) and diagnosed window by window
  (``pipeline/stream.py``): the same Diagnosis as a whole read, with the memory of one window; one
  walk or two (``walks``), the windows sized again after the first pass (``resized``). A trace the
  windowed path does not cover (``first_pass.NotWindowable``), or no room to spill: a note says
  why, and it is read as below.
- Otherwise ``memory_plan`` decides: whole, or nsys exports over a time window; a window that cuts
  the trace (not an exact ``step_range``) is said in a ``window_cut`` warning and the answer is
  ``cut``: not the whole trace's.
Errors: ``TraceError`` (the input), ``memory_plan.BudgetError`` (the budget cannot be kept),
``DiagnoseInputError``, ``ClusterError``, ``SpillError`` (the spill's writes), ``OutOfMemory`` (a
whole read), ``spill_folder.Ended`` (SIGTERM/SIGHUP ended a diagnosis in windows). Nothing is
printed: progress, notes and the checks between windows go through ``ReadHooks``.
"""
from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from srtscope.analyzers.pipeline.forked import available, resident_bytes

if TYPE_CHECKING:
    from srtscope.analyzers.model.params import DiagnoseParams
    from srtscope.analyzers.model.results import Diagnosis
    from srtscope.analyzers.model.timeline import Timeline
    from srtscope.analyzers.pipeline.memory_plan import ReadPlan
    from srtscope.analyzers.pipeline.stream import Held

__all__ = ["Diagnosed", "OutOfMemory", "ReadHooks", "SpillError", "diagnose_traces"]

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
#: a window's range row (its copy of the row, the host-activity model's codes and thread rows, the
#: attribution's temporaries), bytes: a Kineto trace with stacks holds ~30 Python frames a device row
RANGE_ROW_BYTES = 150
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
#: a whole read reports progress from this total input size, bytes (smaller ones are quick); reads
#: by a cluster always (remote reads are slow to start whatever the size)
PROGRESS_BYTES = 50 * 2**20


@dataclass(frozen=True)
class ReadHooks:
    """What the caller sees on the way, each optional. ``progress(fraction, what)``: fraction in
    [0, 1] of the current read (1.0: it is over; a later call starts another), ``what`` it does (may
    be called from reading threads); ``note(line)``: one line worth saying (why a trace is not
    diagnosed in windows, a budget no window keeps to, a dead run's spill removed); ``check()``:
    between scanned chunks and windows of a diagnosis in windows (may raise to end it)."""

    progress: Callable[[float, str], None] | None = None
    note: Callable[[str], None] | None = None
    check: Callable[[], None] | None = None


@dataclass(frozen=True)
class Diagnosed:
    """``diagnose_traces``' answer: ``cut``: only a window of the trace was diagnosed (its
    ``window_cut`` warning says which), never to be kept as the trace's answer; ``timeline``: the
    Timeline diagnosed, where asked and the trace was read whole (None in windows)."""

    diagnosis: Diagnosis
    cut: bool = False
    timeline: Timeline | None = None


class SpillError(OSError):
    """The spill of a diagnosis in windows could not be written (one line: the export, the folder, why)."""


def spill_failed(path: Path, folder: Path, tmp: Path, exc: OSError) -> str:
    """The one line of a spill that could not be written: the export, the spill folder, the OS's
    words; for a full disk or quota, where the spill goes and how to move it."""
    line = f"{path}: cannot write the spill in {folder}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        under = "" if folder == tmp else f", {tmp}"
        line += f" (the spill goes under $TMPDIR{under}: set TMPDIR to a disk with room)"
    return line


class OutOfMemory(MemoryError):
    """A whole read ran out of memory (one line naming the files)."""


def diagnose_traces(paths: Sequence[str | Path], params: DiagnoseParams, budget_bytes: int | None, *,
                    cache: bool = True, jobs: int = 1, cluster: str | None = None,
                    hooks: ReadHooks = ReadHooks(), timeline: bool = False) -> Diagnosed:
    """Read and diagnose ``paths`` (several: one per rank; a folder stands for its files) within
    ``budget_bytes`` (None: no limit), as the module doc says. ``cache``: the user's table cache;
    ``jobs``: rank files read in that many processes (at most ``reading_processes``); ``cluster``:
    read by the workers of the Dask scheduler at that address (their reads are theirs to bound; not
    with ``jobs`` > 1); ``timeline``: keep the Timeline read in the answer. The caller may have glibc
    keep freed memory first (``cli/loading.keep_freed_memory``): the windows' sizes were measured so."""
    from srtscope.analyzers.cache.table_cache import deferred_writes
    from srtscope.analyzers.diagnose import diagnose
    from srtscope.analyzers.readers import TraceError

    files = [Path(p) for p in paths]
    if not files:
        raise TraceError("<no input>", "no trace given")
    if (cluster is None and len(files) == 1 and params.step_range is None and budget_bytes is not None
            and over_budget(files[0], budget_bytes)):
        whole = _in_windows(files[0], params, budget_bytes, hooks)
        if whole is not None:
            return Diagnosed(whole)
    plan = plan_reads(files, budget_bytes, params, cache, cluster)
    with deferred_writes():             # new table entries are written while the analyses run
        tl = read_whole(files, hooks, cache=cache, jobs=jobs, cluster=cluster,
                        window=None if plan is None else (plan.window, plan.rows + plan.rows // 8 + 4096))
        cut = plan is not None and not plan.pushed
        if plan is not None and cut:
            from srtscope.analyzers.model.timeline import WarningCode
            from srtscope.analyzers.pipeline.memory_plan import window_message

            # NOTE: a diagnosis of part of the trace: said in the report, never kept as the answer
            tl.meta.warn(WarningCode.WINDOW_CUT, window_message(plan, budget_bytes or 0, tl.meta.window_start_ns))
        diag = diagnose(tl, params)
    return Diagnosed(diag, cut, tl if timeline else None)


def check_input(path: Path) -> os.stat_result:
    """``path``'s stat if it exists, is no folder and can be read; else ``TraceError``."""
    from srtscope.analyzers.readers import TraceError

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise TraceError(path, "no such file") from None
    except PermissionError:
        raise TraceError(path, "permission denied (a folder on its path cannot be searched, or the file "
                               "read)") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(path, "is a directory, expected a trace file" + _folder_hint(path))
    if not os.access(path, os.R_OK):
        raise TraceError(path, "permission denied")
    return st


#: what a trace file's name ends with, the glob suggested for a folder given as a trace
TRACE_SUFFIXES = (".sqlite", ".json.gz", ".json", ".nsys-rep")


def _folder_hint(folder: Path) -> str:
    """"; did you mean FOLDER/*.json.gz (7 files)?" for the most common trace suffix in ``folder``
    (its first 10,000 entries, not recursing); "" when none or it cannot be listed."""
    import shlex

    counts = dict.fromkeys(TRACE_SUFFIXES, 0)
    try:
        with os.scandir(folder) as it:
            for i, e in enumerate(it):
                if i >= 10_000:
                    break
                suffix = next((x for x in TRACE_SUFFIXES if e.name.endswith(x)), None)
                if suffix is not None and e.is_file():
                    counts[suffix] += 1
    except OSError:
        return ""
    suffix, n = max(counts.items(), key=lambda kv: kv[1])
    if not n:
        return f" (it holds no {', '.join(TRACE_SUFFIXES)} file)"
    return f"; did you mean {shlex.quote(str(folder).rstrip('/'))}/*{suffix} ({n} file{'s' if n > 1 else ''})?"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def reading_processes(jobs: int, files: int) -> int:
    """How many processes ``jobs`` asked for read ``files`` files in: at most ``jobs`` and one per
    file, and at most one per two usable cores.

    NOTE: each nsys file's read already runs its device and host scans on two threads; a second
    reading process on a 2-core machine only adds its start-up and imports (measured: 8 rank files of
    34 MB, 2 processes took 1.28x the time of one after another)."""
    return max(1, min(jobs, files, usable_cores() // 2))


def read_whole(paths: list[Path], hooks: ReadHooks = ReadHooks(), cache: bool = True, jobs: int = 1,
               cluster: str | None = None, window: tuple[tuple[int, int], int] | None = None) -> Timeline:
    """``paths`` (each a file: ``check_input``; with ``cluster`` the workers' to check) read into one
    Timeline by ``readers.load_timeline``; ``window``: one nsys export's rows in a time window only.
    A file that cannot be read: ``TraceError``; out of memory: ``OutOfMemory``."""
    from srtscope.analyzers.readers import TraceError, load_timeline

    jobs = reading_processes(jobs, len(paths))
    total = PROGRESS_BYTES if cluster is not None else sum(check_input(p).st_size for p in paths)
    progress = None
    if hooks.progress is not None and total >= PROGRESS_BYTES:
        tell, what = hooks.progress, "reading " + ", ".join(p.name for p in paths)[:40]

        def progress(fraction: float, _: str = "") -> None:
            tell(fraction, what)
        progress(0.0)
    try:
        return load_timeline([str(p) for p in paths], progress=progress, cache=cache, jobs=jobs,
                             cluster=cluster, window=window)
    except PermissionError as exc:
        raise TraceError(exc.filename or ", ".join(map(str, paths)), "permission denied") from None
    except MemoryError:
        raise OutOfMemory(f"out of memory while reading {', '.join(map(str, paths))}") from None


def plan_reads(paths: list[Path], budget_bytes: int | None, params: DiagnoseParams, cache: bool,
               cluster: str | None) -> ReadPlan | None:
    """The ``memory_plan.ReadPlan`` of a windowed read of ``paths``, or None to read them whole;
    ``BudgetError`` (one line) when the diagnosis cannot keep to the budget. Reads by a cluster's
    workers are theirs to bound (None)."""
    if cluster is not None:
        return None
    from srtscope.analyzers.cache.cache_store import cache_enabled_for
    from srtscope.analyzers.model.timeline import SourceFormat
    from srtscope.analyzers.pipeline.memory_plan import BudgetError, plan_files
    from srtscope.analyzers.readers import TraceError, detect_format_quiet, expand_paths
    from srtscope.analyzers.readers.memory_estimate import estimate_quiet

    try:
        paths = expand_paths(paths)     # a folder stands for its files, as the read takes it
    except (TraceError, OSError):
        return None                     # the read says what is wrong
    ests = []
    for p in paths:
        try:
            fmt = detect_format_quiet(p) if p.is_file() else None
        except OSError:                 # e.g. a folder on its path that cannot be searched
            fmt = None
        est = estimate_quiet(p, fmt) if fmt is not None else None
        if est is None:
            return None                 # the read says what is wrong with it
        ests.append(est)
    # --steps on exports the table cache would not keep anyway: read only those steps
    push = all(e.format is SourceFormat.NSYS_SQLITE for e in ests) and (
        not cache or not any(cache_enabled_for(p) for p in paths))
    try:
        return plan_files(paths, ests, budget_bytes, params, push_steps=push)
    except BudgetError:
        raise
    except (OSError, ValueError, sqlite3.Error) as exc:
        raise BudgetError(f"{', '.join(p.name for p in paths)}: cannot plan a read within --memory-budget: "
                          f"{exc}") from exc


def over_budget(path: Path, budget_bytes: int) -> bool:
    """Whether ``path`` is an nsys export or a Kineto trace whose whole read's estimated peak is
    over the budget."""
    from srtscope.analyzers.model.timeline import SourceFormat
    from srtscope.analyzers.readers import detect_format_quiet
    from srtscope.analyzers.readers.memory_estimate import estimate_quiet

    try:
        fmt = detect_format_quiet(path) if path.is_file() else None
    except OSError:
        return False                    # the read says what is wrong
    if fmt not in (SourceFormat.NSYS_SQLITE, SourceFormat.KINETO):
        return False
    est = estimate_quiet(path, fmt)
    return est is not None and est.peak_bytes > budget_bytes


def window_rows(budget_bytes: int, export_bytes: int, processes: int = 1, first: Held | None = None) -> int:
    """Device rows a window of each of ``processes`` walks (1 or 2) may hold so that together they
    keep to ``budget_bytes``: each process holds its own part before its windows (pages a forked
    copy shares count twice) and its windows' rows. ``first``: what the first pass left
    (``stream.Held``), the windows never larger than the export's size alone gives."""
    part, row = _held_and_row(export_bytes, processes)
    rows = (budget_bytes / processes - part) / row
    if first is not None:
        rows = min(rows, (budget_bytes / processes - _measured_part(first, processes)) / _measured_row(first))
    return int(min(MAX_ROWS, max(MIN_ROWS, rows)))


def _measured_row(first: Held) -> float:
    """A window's bytes a device row: its own and its share of the ranges, which windows hold in
    proportion (millions of Python frames around a few hundred thousand kernels)."""
    return MEASURED_ROW_BYTES + RANGE_ROW_BYTES * first.range_rows / max(first.device_rows, 1)


def modelled_peak(export_bytes: int, rows: int, processes: int = 1, first: Held | None = None) -> int:
    """Bytes all ``processes`` hold at their peak with windows of ``rows`` (``window_rows``' model);
    with ``first``, from what it measured: the windows' peak or the reduction's, whichever is more."""
    if first is None:
        part, row = _held_and_row(export_bytes, processes)
        return int(processes * (part + rows * row))
    return int(max(processes * (_measured_part(first, processes) + _window_bytes(first, rows)),
                   reduction_peak(first)))


def _window_bytes(first: Held, rows: int) -> float:
    """A window's bytes with ``rows`` device rows: no more rows than the trace has before its last
    step, and no more ranges than it has (``_measured_row``'s share of them per row, at most all)."""
    held = min(rows, first.device_rows) if first.device_rows else rows
    ranges = first.range_rows * held / first.device_rows if first.device_rows else first.range_rows
    return MEASURED_ROW_BYTES * held + RANGE_ROW_BYTES * ranges


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
    it left (``stream.Held``), never larger nor more walks than planned from the size alone; ``note(bytes)``
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


def _in_windows(path: Path, params: DiagnoseParams, budget_bytes: int, hooks: ReadHooks) -> Diagnosis | None:
    """The whole-trace Diagnosis of one nsys export or Kineto trace within ``budget_bytes``, or None where the
    windowed path does not cover the trace or there is no room to spill (a note says why)."""
    from srtscope.analyzers.pipeline.stream import NotWindowable, diagnose_streamed
    from srtscope.analyzers.readers import rank_from_name, read_spilled
    from srtscope.analyzers.readers.memory_estimate import json_text_bytes
    from srtscope.analyzers.spill.spill_folder import spill_folder, sweep_stale

    def note(line: str) -> None:
        if hooks.note is not None:
            hooks.note(line)

    def tick(fraction: float, what: str) -> None:
        if hooks.progress is not None:
            hooks.progress(fraction, f"{what} {path.name}")

    size = path.stat().st_size
    kineto = _is_kineto(path)
    tmp = Path(tempfile.gettempdir())
    sweep_stale(tmp, note)              # a killed run's spill: its space counts as free
    free = shutil.disk_usage(tmp).free
    if free < SPILL_SHARE * size + (1 << 30):
        note(f"{path.name}: not diagnosed whole in windows: its spill needs ~{SPILL_SHARE * size / 2**30:.1f} "
             f"GiB free under {tmp} ({free / 2**30:.1f} GiB; set TMPDIR)")
        return None
    said: list[bool] = []

    def over(need: int) -> None:        # the fewest rows a window, and still more: say so, once
        if not said:
            said.append(True)
            note(f"{path.name}: a diagnosis in windows holds ~{need >> 20} MiB even at their smallest, "
                 f"over --memory-budget {budget_bytes >> 20} MiB")
    # NOTE: the window model's size is an export's bytes; a Kineto trace's text holds ~2.5x the
    # bytes of an export of the same rows (its ranges are held whole in both)
    model_bytes = int(json_text_bytes(path) / 2.5) if kineto else size
    rows, workers = walks(budget_bytes, model_bytes)
    need = modelled_peak(model_bytes, rows, workers)
    # NOTE: said from the size alone only where the first pass cannot measure what it holds
    # (``resized`` says it then): a Kineto trace's size tells little of its rows
    if need > budget_bytes and resident_bytes() is None:
        over(need)
    rank = rank_from_name(path) or 0
    stack = ExitStack()
    try:
        folder = stack.enter_context(spill_folder())
    except OSError as exc:              # the folder itself (made, marked): nothing of it is left
        raise SpillError(spill_failed(path, tmp, tmp, exc)) from None
    with stack:
        try:
            tick(0.0, "reading")
            with nullcontext() if kineto else _scanned(path, tick, hooks.check):
                src = read_spilled(path, rank, folder)

            def progress(f: float) -> None:
                if hooks.check is not None:
                    hooks.check()       # after the first pass and each window
                tick(0.5 + 0.5 * f, "diagnosing in windows")
            with src:
                return diagnose_streamed(src, params, rows, workers=workers, progress=progress,
                                         resize=resized(budget_bytes, model_bytes, over))
        except NotWindowable as exc:
            note(f"{path.name}: not diagnosed whole in windows ({exc})")
            return None
        except OSError as exc:
            raise SpillError(spill_failed(path, folder, tmp, exc)) from None
        finally:
            tick(1.0, "read")


def _is_kineto(path: Path) -> bool:
    from srtscope.analyzers.model.timeline import SourceFormat
    from srtscope.analyzers.readers import detect_format_quiet
    return detect_format_quiet(path) is SourceFormat.KINETO


@contextmanager
def _scanned(path: Path, tick: Callable[[float, str], None], check: Callable[[], None] | None) -> Iterator[None]:
    """The spill's scanned rows as the first half of the progress, ``check`` after each chunk."""
    from srtscope.analyzers.readers.columnar import report_scans
    from srtscope.analyzers.readers.nsys_sqlite import scan_estimate

    total = max(scan_estimate(path), 1)
    done = [0]
    lock = threading.Lock()

    def scanned(rows: int) -> None:
        with lock:
            done[0] += rows
            tick(0.5 * min(1.0, done[0] / total), "reading")
        if check is not None:
            check()
    with report_scans(scanned):
        yield

