"""Load traces for the CLI: existence checks, a progress bar on large inputs, one-line errors."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from srtscope.cli.errors import Exit, fail

LARGE_BYTES = 50 * 2**20  # show a progress bar from this total input size
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
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        fail(f"{path}: no such file")
    except PermissionError:
        fail(f"{path}: permission denied (a folder on its path cannot be searched, or the file read)")
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    if stat.S_ISDIR(st.st_mode):
        fail(f"{path}: is a directory, expected a trace file")
    if not os.access(path, os.R_OK):
        fail(f"{path}: permission denied")
    return st


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def reading_processes(jobs: int, files: int) -> int:
    """How many processes ``--jobs N`` reads ``files`` files in: at most N and one per file, and at
    most one per two usable cores.

    NOTE: each nsys file's read already runs its device and host scans on two threads; a second
    reading process on a 2-core machine only adds its start-up and imports (measured: 8 rank files of
    34 MB, 2 processes took 1.28x the time of one after another)."""
    return max(1, min(jobs, files, usable_cores() // 2))


def check_cluster_jobs(cluster: str | None, jobs: int) -> None:
    """``--cluster`` with ``--jobs`` > 1 exits 2: the cluster's workers do the reads, there is no pool here."""
    if cluster is not None and jobs > 1:
        fail(f"--cluster and --jobs {jobs}: choose one (with --cluster the cluster's workers read the files)")


def load(paths: list[Path], console: Console | None = None, quiet: bool = False, cache: bool = True,
         jobs: int = 1, cluster: str | None = None, window: tuple[tuple[int, int], int] | None = None) -> Any:
    """Read one or more trace files into a Timeline; bad input exits 2 with one line. ``cache``: the
    user's table cache (``analyzers/readers/cache.py``); ``jobs``: files read in that many processes;
    ``cluster``: a Dask scheduler's address, whose workers read the files (``readers/cluster.py``).
    NOTE: with ``cluster`` the paths are the workers' to check (they need not exist here), and the
    progress bar shows whenever there is a console: remote reads are slow to start whatever the size.
    ``window``: one nsys export's rows in a time window only (``readers.load_timeline``)."""
    from srtscope.analyzers.readers import TraceError, load_timeline
    from srtscope.analyzers.readers.cluster import ClusterError  # cheap: distributed comes later

    if not paths:
        fail("no trace given")
    check_cluster_jobs(cluster, jobs)
    keep_freed_memory()
    jobs = reading_processes(jobs, len(paths))
    total = LARGE_BYTES if cluster is not None else sum(check_input_file(p).st_size for p in paths)
    try:
        if quiet or console is None or total < LARGE_BYTES:
            return load_timeline([str(p) for p in paths], cache=cache, jobs=jobs, cluster=cluster, window=window)
        with Progress(TextColumn("[bold]reading[/] {task.description}"), BarColumn(),
                      TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                      console=console, transient=True) as prog:
            task = prog.add_task(", ".join(p.name for p in paths)[:40], total=1.0)

            def progress(fraction: float, what: str = "") -> None:
                prog.update(task, completed=max(0.0, min(1.0, fraction)))

            return load_timeline([str(p) for p in paths], progress=progress, cache=cache, jobs=jobs,
                                 cluster=cluster, window=window)
    except TraceError as exc:
        fail(str(exc))
    except PermissionError as exc:
        fail(f"{exc.filename or ', '.join(map(str, paths))}: permission denied")
    except MemoryError:
        fail(f"out of memory while reading {', '.join(map(str, paths))}", Exit.INTERNAL)
    except ClusterError as exc:
        fail(str(exc))
