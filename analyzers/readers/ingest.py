"""The one way every read of a trace file ends, whatever its path: a whole read (``read_one``, also on
a ``--jobs`` pool or a ``--cluster`` worker) or a spill read in windows (``read_spilled``).

``ingest`` runs the read with its failures mapped to one-line ``TraceError``s (``read_errors``) and
then admits what it read (``admit``): device activity present, times within what a capture can hold.
The readers check values as they fetch them (``columnar.fetch_ints``: types and NULLs of integer
columns; ``NsysStrings.strings``: the names; ``validate_table`` and the spill's spool: ``end < start``)
and raise what they raise; the mapping and the admission live here alone, so a damaged file gets
the same exit code and line whatever the memory budget.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from srtscope.analyzers.model.timeline import Timeline, TimelineError, TimelineMeta, Traced
from srtscope.analyzers.readers.errors import TraceError

#: The largest time value (ns, either sign) and the longest span of a file's events the analyses
#: take: beyond 2^62 their sums and differences would overflow int64; 2^56 ns is 2.3 years, far
#: beyond any capture, and leaves room for sums of thousands of spans.
MAX_ABS_NS = 1 << 62
MAX_SPAN_NS = 1 << 56


@dataclass(frozen=True)
class Extent:
    """What ``admit`` reads of a file's rows: its device rows, and the (lowest start, highest end)
    in ns of each non-empty table (device, API, ranges, counters), whole whatever was kept."""

    device_rows: int
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, tl: Timeline) -> Extent:
        """A Timeline's, from its tables."""
        return cls(len(tl.device), spans_of(tl.device, tl.api, tl.ranges, tl.counters))


def spans_of(*tables: pd.DataFrame) -> tuple[tuple[int, int], ...]:
    """(lowest start, highest end) ns of each non-empty table (a counters table: its ``t_ns``)."""
    out = []
    for df in tables:
        if len(df):
            a, b = ("start_ns", "end_ns") if "start_ns" in df.columns else ("t_ns", "t_ns")
            out.append((int(df[a].min()), int(df[b].max())))
    return tuple(out)


class Read(Protocol):
    """What a read gives back: the file's metadata and its NVTX ranges whole."""

    @property
    def meta(self) -> TimelineMeta: ...

    @property
    def ranges(self) -> pd.DataFrame: ...


R = TypeVar("R", bound=Read)


@contextmanager
def read_errors(path: Path, passing: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Whatever reading ``path`` raises, as a ``TraceError`` of one line; ``passing``: exceptions
    the caller reports itself (a spill's ``OSError``). Our own bugs (``ImportError``, ``NameError``,
    ``AssertionError``) pass as they are: internal errors, not the user's file."""
    try:
        yield
    except TraceError:
        raise
    except passing:
        raise
    except sqlite3.DatabaseError as exc:
        raise TraceError(path, f"corrupt or unreadable SQLite database ({exc})") from None
    except (EOFError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"truncated or corrupt file ({type(exc).__name__}: {exc})") from None
    except TimelineError as exc:
        raise TraceError(path, f"inconsistent trace data: {exc}") from None
    except MemoryError:
        raise TraceError(path, "out of memory while reading") from None
    except (ImportError, NameError, AssertionError):
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt data surfaces as many exception types
        raise TraceError(path, f"cannot read trace ({type(exc).__name__}: {exc})") from None


def admit(path: Path, extent: Extent, meta: TimelineMeta, ranges: pd.DataFrame,
          allow_no_kernels: bool = False) -> None:
    """``TraceError`` for a read the analyses cannot take: no device activity (unless
    ``allow_no_kernels``), or times no capture has (``check_times``)."""
    if not allow_no_kernels and not extent.device_rows:
        from srtscope.analyzers.readers.stand_in import no_device_message
        raise TraceError(path, no_device_message(ranges, Traced.API in meta.traced))
    window = ((meta.window_start_ns, meta.window_end_ns),) if meta.window_end_ns > meta.window_start_ns else ()
    check_times(path, extent.spans + window)


def check_times(path: str | Path, spans: tuple[tuple[int, int], ...]) -> None:
    """``TraceError`` for times no capture has among ``spans`` (lo, hi) ns: beyond ``MAX_ABS_NS`` or
    spanning over ``MAX_SPAN_NS`` (int64 extremes, a corrupt or zeroed timestamp among epoch times)."""
    if not spans:
        return
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if max(-lo, hi) > MAX_ABS_NS:
        raise TraceError(path, f"time values out of range ({lo} .. {hi} ns; beyond 2^62 ns, 146 years, "
                               "they are not times): the trace is corrupt")
    if hi - lo > MAX_SPAN_NS:
        raise TraceError(path, f"the events span {(hi - lo) / 86400e9:.4g} days ({lo} .. {hi} ns): some "
                               "timestamps are corrupt or from another clock")


def ingest(path: Path, read: Callable[[], R], extent: Callable[[R], Extent], allow_no_kernels: bool = False,
           passing: tuple[type[BaseException], ...] = ()) -> R:
    """``read()`` of ``path``, its failures mapped (``read_errors``), what it gave admitted
    (``admit``, on ``extent`` of it). A read with a ``close`` is closed when it is refused."""
    with read_errors(path, passing):
        got = read()
    try:
        admit(path, extent(got), got.meta, got.ranges, allow_no_kernels)
    except BaseException:
        close: Any = getattr(got, "close", None)
        if close is not None:
            close()
        raise
    return got
