"""Reading traces for the CLI: the allocator's settings, input checks as one-line errors, the
progress bar (what to read and how: ``analyzers/traces.py``)."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from srtscope.cli.errors import fail
from srtscope.cli.terminal import Console

#: glibc ``mallopt`` parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """Have glibc serve large blocks from the heap and keep what is freed for reuse, in this process
    only (after ``cli/app.py``'s ``ALLOCATOR_ENV``); False where the C library is not glibc.

    NOTE: by default every array over the mmap threshold is a fresh mapping, given back when freed,
    so the reader's and the analyses' temporaries fault in new zeroed pages again and again: a 1 GB
    export's first look faulted 1.65 M pages for a 1.6 GiB peak (3.5 s in the kernel). Kept, 0.59 M
    faults and 2.4 s, peak RSS +1.3% (3 GB: 5.3 M -> 1.8 M faults, +1.3%), the same output.
    NOTE: one arena for every thread: the reading threads (the spill's two scans) each grew an arena
    of their own, kept as freed, faulted in anew; one shared, a 3 GB export's first look in windows
    faulted 0.85 M pages, not 1.6 M (system time 7.4 -> 5.0 s), peak RSS -50 MiB.
    NOTE: and no transparent huge pages asked for numpy's arrays: in the heap kept this way they
    were zeroed 2 MiB at a time for arrays that touch a part of them (a 3 GB export's first look in
    windows: system time 4.6 -> 3.8 s, the same total CPU and output).
    Trace reading only: a program ``srtscope run`` or ``capture`` starts does not inherit it."""
    import ctypes

    import numpy as np

    advise = getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)
    if advise is not None:
        advise(False)

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return (bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
            and bool(mallopt(_M_ARENA_MAX, 1)))


def check_input_file(path: Path) -> os.stat_result:
    """``path``'s stat if it exists, is no folder and can be read; else exit 2 with one line."""
    from srtscope.analyzers.readers import TraceError
    from srtscope.analyzers.traces import check_input

    try:
        return check_input(path)
    except TraceError as exc:
        fail(str(exc))


def check_cluster_jobs(cluster: str | None, jobs: int) -> None:
    """``--cluster`` with ``--jobs`` > 1 exits 2: the cluster's workers do the reads, there is no pool here."""
    if cluster is not None and jobs > 1:
        fail(f"--cluster and --jobs {jobs}: choose one (with --cluster the cluster's workers read the files)")


@contextmanager
def progress_bar(console: Console | None, quiet: bool) -> Iterator[Callable[[float, str], None] | None]:
    """A ``ReadHooks.progress`` that draws a transient bar on ``console`` (None when quiet or without
    one): shown from a call below 1.0 until one of 1.0 or the block's end, ``what`` its label."""
    if quiet or console is None:
        yield None
        return
    shown: list[tuple[Progress, TaskID]] = []
    lock = threading.Lock()             # reading threads report too

    def progress(fraction: float, what: str = "") -> None:
        with lock:
            _draw(fraction, what)

    def _draw(fraction: float, what: str) -> None:
        if fraction >= 1.0:
            if shown:
                shown.pop()[0].stop()
            return
        if not shown:
            bar = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(),
                           TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=console,
                           transient=True)
            bar.start()
            shown.append((bar, bar.add_task(what[:48], total=1.0)))
        bar, task = shown[0]
        bar.update(task, completed=max(0.0, fraction), description=what[:48] if what else None)
    try:
        yield progress
    finally:
        with lock:
            if shown:
                shown.pop()[0].stop()
