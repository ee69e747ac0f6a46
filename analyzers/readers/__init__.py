"""Trace readers: every supported format into one ``Timeline``.

    from srtscope.analyzers.readers import load_timeline, TraceError
    tl = load_timeline(["rank0.sqlite", "rank1.sqlite"])

Formats are detected from content (``detect.py``). Several files (one per rank) are merged. Every
input the readers cannot use raises ``TraceError`` with one line ``"<path>: <what is wrong>"``.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from srtscope.analyzers.model.timeline import SourceFormat, Timeline, merge_timelines
from srtscope.analyzers.readers.detect import detect_format
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.ingest import MAX_ABS_NS, MAX_SPAN_NS, Extent, ingest

if TYPE_CHECKING:
    from srtscope.analyzers.spill.nsys_spill import SpilledTrace

__all__ = ["load_timeline", "read_one", "read_spilled", "detect_format", "TraceError", "MAX_ABS_NS",
           "MAX_SPAN_NS"]

Progress = Callable[[float, str], None]
#: "rank" as a word of its own (not "frank"), its number whole (not "rank_2000mb": a size)
_RANK_IN_NAME = re.compile(r"(?<![a-z])rank[_-]?(\d+)(?![0-9a-z])", re.IGNORECASE)


def rank_from_name(path: str | Path) -> int | None:
    """``rank3`` (also ``rank_3``, ``RANK-3``) in a file name -> 3; None where the digits run on
    into letters (``two_rank_2000mb``) or "rank" ends another word."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


#: a windowed read of an nsys export: ((lo, hi) ns, rows expected in it); see ``read_nsys``
Window = tuple[tuple[int, int], int]


def _read_format(path: Path, fmt: SourceFormat, rank: int, window: Window | None = None) -> Timeline:
    if fmt is SourceFormat.NSYS_SQLITE:
        from srtscope.analyzers.readers.nsys_sqlite import read_nsys
        if window is not None:
            return read_nsys(path, rank, window=window[0], expect_rows=window[1])
        return read_nsys(path, rank)
    if window is not None:
        raise ValueError("only nsys exports are read by time window")
    if fmt is SourceFormat.KINETO:
        from srtscope.analyzers.readers.kineto import read_kineto
        return read_kineto(path, rank)
    from srtscope.analyzers.readers.probe import read_probe
    return read_probe(path, rank)


def read_one(path: str | Path, rank: int = 0, allow_no_kernels: bool = False, cache: bool = False,
             fmt: SourceFormat | None = None, window: Window | None = None) -> Timeline:
    """Read one file of any supported format; ``rank`` is the fallback when the file has none.
    ``cache``: take the tables from the user's cache when it holds this file, else store them
    there (``cache/table_cache.py``; the results are the same either way). ``fmt``: the file's format
    when the caller has detected it already (each file's format is detected once). ``window``: an
    nsys export's rows in that time window only (``read_nsys``), never through the cache: its
    entries hold whole files, and a window's read scans the file anyway. Failures and what is
    admitted: ``ingest``, as for ``read_spilled``."""
    path = Path(path)

    def read() -> Timeline:
        f = fmt or detect_format(path)
        from srtscope.analyzers.cache.table_cache import cache_enabled_for, cached_read
        if window is not None:
            return _read_format(path, f, rank, window)
        if cache and cache_enabled_for(path):
            if f is SourceFormat.NSYS_SQLITE:
                from srtscope.analyzers.readers.sqlite_integrity import check_side_files
                check_side_files(path)      # a -wal beside it changes what a read would see
            return cached_read(path, rank, lambda: _read_format(path, f, rank))
        return _read_format(path, f, rank)

    return ingest(path, read, Extent.of, allow_no_kernels)


def read_spilled(path: str | Path, rank: int, folder: str | Path) -> SpilledTrace:
    """An nsys export or a Kineto trace read as ``read_one`` reads it, its device and API tables
    spilled to ``folder`` (``nsys_spill.read_nsys_spilled``, ``kineto_spill.read_kineto_spilled``)
    for a diagnosis in windows: the same ``TraceError`` as ``read_one``'s for the same file; an
    ``OSError`` (the spill's writes) and ``NotWindowable`` (a Kineto trace the spill does not take)
    pass as they are."""
    from srtscope.analyzers.pipeline.first_pass import NotWindowable
    from srtscope.analyzers.spill.nsys_spill import SpilledTrace, read_nsys_spilled

    path = Path(path)
    if detect_format(path) is SourceFormat.KINETO:
        from srtscope.analyzers.spill.kineto_spill import read_kineto_spilled
        return ingest(path, lambda: read_kineto_spilled(path, rank, folder=folder), SpilledTrace.extent,
                      passing=(OSError, NotWindowable))
    return ingest(path, lambda: read_nsys_spilled(path, rank, folder=folder), SpilledTrace.extent,
                  passing=(OSError,))


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files ``paths`` stand for (a directory: its files, sorted); TraceError for an
    empty directory."""
    return _expand(paths)


def _expand(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
            if not files:
                raise TraceError(p, "directory holds no trace files")
            out += files
        else:
            out.append(p)
    return out


@contextmanager
def _scan_progress(progress: Progress | None, path: Path, index: int, count: int,
                   fmt: SourceFormat | None) -> Iterator[None]:
    """Within one nsys file (``fmt``), report progress by the rowids scanned so far (fraction of all files)."""
    if progress is None or fmt is not SourceFormat.NSYS_SQLITE:
        yield
        return
    from srtscope.analyzers.readers.columnar import report_scans
    from srtscope.analyzers.readers.nsys_sqlite import scan_estimate

    total = scan_estimate(path)
    if total <= 0:
        yield
        return
    done = [0]
    lock = threading.Lock()  # reader threads tick concurrently: keep the reports monotonic

    def tick(rows: int) -> None:
        with lock:
            done[0] += rows
            progress((index + min(1.0, done[0] / total)) / count, f"reading {path.name}")

    with report_scans(tick):
        yield


def detect_format_quiet(path: Path) -> SourceFormat | None:
    """The format, or None when the file cannot be read (the read then reports why)."""
    try:
        return detect_format(path)
    except Exception:  # noqa: BLE001
        return None


def _span(tl: Timeline) -> tuple[int, int] | None:
    """The span of a file's device activity (else of all its events); None when empty."""
    for df in (tl.device, tl.api, tl.ranges):
        if len(df):
            return int(df["start_ns"].min()), int(df["end_ns"].max())
    return None


ONE_JOB_GAP_NS = 1_000_000_000


def check_one_job(files: Sequence[Path], parts: Sequence[Timeline]) -> None:
    """Refuse files that cannot be ranks of one job: declared world sizes that disagree, or time
    spans that do not overlap (separate runs: merged, their skew would be the time between them)."""
    declared = {p.meta.world_size for p in parts if p.meta.format.value == "kineto" and p.meta.world_size > 1}
    if len(declared) > 1:
        raise TraceError(files[0], f"these files cannot be ranks of one job: their world sizes differ "
                                   f"({sorted(declared)}); diagnose them one at a time")
    utc = [int(u) for p in parts if (u := p.meta.extra.get("nsys.utc_start_ns")) is not None]
    spans: list[tuple[tuple[int, int], Path]]
    if len(utc) == len(parts):
        # nsys times events from each session's start: the sessions' wall-clock starts place them
        spans = []
        for u, p, f in zip(utc, parts, files):
            d = max(p.meta.window_end_ns - p.meta.window_start_ns, 1)
            spans.append(((u, u + d), f))
    else:
        spans = [(s, f) for s, f in zip(map(_span, parts), files) if s is not None]
    lo = max(s[0] for s, _ in spans) if spans else 0
    hi = min(s[1] for s, _ in spans) if spans else 0
    longest = max((s[1] - s[0] for s, _ in spans), default=0)
    # NOTE: ranks of one job run together; a gap longer than a second and than the longest file is
    # another run (ranks simulated one after another in one process stay within the tolerance)
    if spans and lo - hi > max(ONE_JOB_GAP_NS, longest):
        first = min(spans, key=lambda x: x[0][1])
        last = max(spans, key=lambda x: x[0][0])
        raise TraceError(files[0], f"these files cannot be ranks of one job: {first[1].name} ends "
                                   f"{(last[0][0] - first[0][1]) / 1e9:.3g} s before {last[1].name} starts "
                                   "(separate runs or clocks); diagnose them one at a time")


def _read_job(path: Path, rank: int, allow_no_kernels: bool, cache: bool) -> Timeline:
    """``read_one`` in a worker process (``load_timeline(jobs=N)``)."""
    return read_one(path, rank, allow_no_kernels, cache)


def _read_parallel(files: list[Path], hints: list[int], allow_no_kernels: bool, cache: bool, jobs: int,
                   progress: Progress | None) -> list[Timeline]:
    """Each file read by ``read_one(files[i], hints[i])`` in a pool of ``jobs`` spawned processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")     # no fork of a threaded parent
    out: list[Timeline | None] = [None] * len(files)
    with ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=ctx) as pool:
        futs = {pool.submit(_read_job, f, h, allow_no_kernels, cache): i
                for i, (f, h) in enumerate(zip(files, hints))}
        try:
            for done, fut in enumerate(as_completed(futs), 1):
                out[futs[fut]] = fut.result()
                if progress is not None:
                    progress(done / len(files), f"read {files[futs[fut]].name}")
        except BaseException:
            for f in futs:
                f.cancel()
            raise
    return [t for t in out if t is not None]


def load_timeline(paths: Sequence[str | Path] | str | Path, progress: Progress | None = None,
                  allow_no_kernels: bool = False, cache: bool = False, jobs: int = 1,
                  cluster: str | None = None, window: Window | None = None) -> Timeline:
    """Read and merge trace files (a directory stands for its files).

    Rank of each file: Kineto ``distributedInfo.rank`` / probe ``meta.rank`` when present, else
    ``rank<N>`` in the file name, else its position among the files given. ``progress(fraction,
    what)`` is called before each file (fraction of files done) and with 1.0 at the end.
    ``allow_no_kernels`` accepts traces without device activity (they
    carry warning ``no_kernels``) instead of raising ``TraceError``. ``cache``: see ``read_one``.
    ``jobs`` > 1 reads several files in that many processes; the merged Timeline is the same.
    ``cluster``: the address of a Dask scheduler whose workers read every file instead (by path; the
    ``srtscope[cluster]`` extra; ``readers/cluster.py``): the same Timeline again, with ``cache`` the
    workers' own; ``ClusterError`` when the cluster cannot do it. Not with ``jobs`` > 1 (ValueError).
    ``window``: nsys exports read by time window (``read_one``), one after the other; not with a cluster.
    """
    if cluster is not None and jobs > 1:
        raise ValueError("load_timeline: cluster= and jobs > 1 exclude each other")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = _expand(list(paths))
    if not files:
        raise TraceError("<no input>", "no trace files given")
    if window is not None and cluster is not None:
        raise ValueError("load_timeline: window= reads here, not on a cluster")
    if cluster is None:
        # NOTE: windowed reads one file at a time: each scan's memory is the window's, not N of them
        return _load_files(files, progress, allow_no_kernels, cache, 1 if window is not None else jobs, None,
                           window)
    from srtscope.analyzers.readers.cluster import connect

    with connect(cluster) as reads:
        return _load_files(files, progress, allow_no_kernels, cache, 1, reads.read)


#: ``(files, rank hints, allow_no_kernels, cache, progress) -> Timelines``, in the files' order
RemoteRead = Callable[[Sequence[Path], Sequence[int], bool, bool, Progress | None], list[Timeline]]


def _load_files(files: list[Path], progress: Progress | None, allow_no_kernels: bool, cache: bool,
                jobs: int, remote: RemoteRead | None, window: Window | None = None) -> Timeline:
    """``load_timeline`` on expanded ``files``; ``remote`` (a cluster's reads) reads every file when
    given; ``window``: each file read by that time window (``read_one``)."""
    parts: list[Timeline] = []
    next_rank = 0
    early: list[Timeline] | None = None
    if remote is not None or (jobs > 1 and len(files) > 1):
        # NOTE: a file without a rank in its name takes the rank after the previous file's; read in
        # parallel, it is guessed (its position) and read again below when the guess was wrong
        names = [rank_from_name(p) for p in files]
        hints = [n if n is not None else i for i, n in enumerate(names)]
        early = (remote(files, hints, allow_no_kernels, cache, progress) if remote is not None
                 else _read_parallel(files, hints, allow_no_kernels, cache, jobs, progress))
    for i, path in enumerate(files):
        named = rank_from_name(path)
        rank = named if named is not None else next_rank
        if early is not None and (named is not None or rank == i):
            tl = early[i]
        elif remote is not None:
            tl = remote([path], [rank], allow_no_kernels, cache, None)[0]
        else:
            if progress is not None:
                progress(i / len(files), f"reading {path.name}")
            fmt = detect_format_quiet(path) if progress is not None else None   # detected once
            with _scan_progress(progress, path, i, len(files), fmt):
                tl = read_one(path, rank, allow_no_kernels, cache, fmt, window)
        next_rank = max(tl.meta.ranks) + 1
        parts.append(tl)
    ranks = [r for p in parts for r in p.meta.ranks]
    if len(set(ranks)) != len(ranks):
        raise TraceError(files[0], f"several files claim the same rank(s) {sorted(ranks)}: "
                                   "give one file per rank")
    formats = {p.meta.format for p in parts}
    if len(formats) > 1:
        raise TraceError(files[0], "files of different formats cannot be merged: "
                                   + ", ".join(sorted(f.value for f in formats)))
    if len(parts) > 1:
        check_one_job(files, parts)
    tl = merge_timelines(parts)
    if progress is not None:
        progress(1.0, "done")
    if len(parts) > 1 and tl.meta.world_size < len(set(ranks)):
        tl.meta.world_size = len(set(ranks))
    return tl
