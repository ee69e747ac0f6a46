"""Nsight Systems SQLite export read once into time-ordered pieces on disk: the reading half of a
diagnosis in bounded memory.

``read_nsys_spilled`` scans the big tables in rowid chunks with ``read_nsys``'s own SQL and decoding
(its ``_Reader``), spilling the device rows and the API rows into start-time buckets, a file a table (``time_spool``),
in a folder the caller owns. What is small comes back whole and equal to
``read_nsys``'s: the metadata, the NVTX ranges, the counters. ``iter_device`` / ``iter_api`` give the
two big tables back in ascending start, a DataFrame of at most ``chunk_rows`` rows at a time, whose
concatenation is ``read_nsys(path).device`` / ``.api`` exactly (columns, dtypes, categories, row
order, index). Peak memory: a scan chunk per thread and a bucket, whatever the file's size, plus the
NVTX table, read whole (~60 MiB per GB of an export whose every step is a labelled range).
"""
from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np
import pandas as pd

from srtscope.analyzers.model.timeline import (
    ID_COLUMNS,
    WIDE_IDS_ENV,
    DeviceKind,
    TimelineError,
    TimelineMeta,
    validate_table,
)
from srtscope.analyzers.readers.columnar import fetch_ints, rowid_bounds, sort_columns
from srtscope.analyzers.readers.errors import TraceError
from srtscope.analyzers.readers.ingest import Extent, spans_of
from srtscope.analyzers.readers.nsys_facts import TableFacts
from srtscope.analyzers.readers.nsys_sqlite import (
    QUICK_CHECK_ALWAYS_BYTES,
    ScannedTables,
    _ranks,
    _read,
    _Reader,
)
from srtscope.analyzers.readers.nsys_tables import connect_readonly
from srtscope.analyzers.readers.sqlite_integrity import check_integrity, check_side_files
from srtscope.analyzers.spill.time_spool import TimeSpool

#: rows per DataFrame of ``iter_device`` / ``iter_api`` (and per bucket on disk): ~25 MB in memory
DEFAULT_CHUNK_ROWS = 1 << 18
#: rowids read per chunk of a scan
SCAN_ROWS = 1 << 18
_I32 = np.iinfo(np.int32)

_Read = Callable[[_Reader], "dict | None"]
#: the device tables in ``read_nsys``'s concatenation order (its ties of start keep this order)
DEVICE_TABLES: tuple[tuple[str, _Read], ...] = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", lambda r: r.kernels()),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", lambda r: r.copies("CUPTI_ACTIVITY_KIND_MEMCPY", DeviceKind.MEMCPY)),
    ("CUPTI_ACTIVITY_KIND_MEMSET", lambda r: r.copies("CUPTI_ACTIVITY_KIND_MEMSET", DeviceKind.MEMSET)),
    ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", lambda r: r.graph_execs()),
)
API_TABLES: tuple[tuple[str, _Read], ...] = (
    ("CUPTI_ACTIVITY_KIND_RUNTIME", lambda r: r.api()),
    ("OSRT_API", lambda r: r.osrt()),
)


class _ChunkReader(_Reader):
    """``_Reader`` whose big-table reads take one rowid range at a time (``scan``); StringIds
    values and counts asked once per read, not once per chunk."""

    def __init__(self, path: Path, con: sqlite3.Connection, scan_rows: int = SCAN_ROWS) -> None:
        super().__init__(path, con)
        self.scan_rows = scan_rows
        self.rowids: tuple[int, int] | None = None
        self._values: dict[int, str] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._seen: dict[str, int] = {}

    def fetch(self, table: str, exprs: list[str], where: str = "",
              track: dict | None = None) -> list[np.ndarray]:
        # NOTE: ``track`` counts values for a windowed read (``nsys_window``); a spill reads all rows
        if self.rowids is None:
            return super().fetch(table, exprs, where, track)
        span: list[int] = []
        out = fetch_ints(self.arrow, table, exprs, where, span=span, max_rows=self.max_rows,
                         rowids=self.rowids, pages=self.pages)
        if span:
            self._seen[table] = self._seen.get(table, 0) + span[0]
        return out

    def strings(self, ids: np.ndarray) -> dict[int, str]:
        want = np.unique(ids).tolist()
        new = [int(i) for i in want if int(i) not in self._values]
        if new:
            self._values.update(super().strings(np.asarray(new, np.int64)))
        return {int(i): self._values[int(i)] for i in want if int(i) in self._values}

    def count(self, table: str, where: str = "") -> int:
        if (table, where) not in self._counts:
            self._counts[(table, where)] = super().count(table, where)
        return self._counts[(table, where)]

    def scan(self, table: str, read: _Read, spool: TimeSpool, note: Callable[[dict], None],
             stop: threading.Event, publish: Callable[[_Shared | None], None] | None = None) -> None:
        """Every rowid chunk of ``table`` read by ``read`` into ``spool`` (``note`` sees each);
        ``stop`` set: no further chunk (the other side of the read failed). ``publish`` is told the
        scan while it runs, so an idle thread can take chunks of it (``_Shared.help``)."""
        if not self.has(table):
            return
        lo, hi = rowid_bounds(self.con, table)
        if lo is None or hi is None:
            return
        spool.start_part()
        shared = _Shared(table, read, spool, note, lo, hi, self.scan_rows, stop)
        if publish is not None:
            publish(shared)
        try:
            shared.help(self)
            shared.wait()
        finally:
            if publish is not None:
                publish(None)
        if shared.error is not None:
            raise shared.error
        rows = shared.seen
        if rows and hi - lo + 1 != rows:     # as ``NsysTables.fetch`` notes it for a whole table
            self.suspect.append(f"{rows} rows in {table} over rowids {lo}..{hi}")


class _Shared:
    """One table's rowid chunks handed out in order to whichever thread asks (each reading on its own
    connection), their rows noted and added to the spool in rowid order whatever order they are
    read in: the spool's ties of start keep the table's order."""

    def __init__(self, table: str, read: _Read, spool: TimeSpool, note: Callable[[dict], None],
                 lo: int, hi: int, scan_rows: int, stop: threading.Event) -> None:
        self.table, self.read, self.spool, self.note = table, read, spool, note
        self.at: int | None = lo
        self.hi, self.scan_rows, self.stop = hi, scan_rows, stop
        self.cv = threading.Condition()
        self.claimed = self.added = 0
        self.ready: dict[int, dict | None] = {}
        self.seen = 0                          # rows the scans saw (``suspect``)
        self.error: BaseException | None = None

    def help(self, r: _ChunkReader) -> None:
        """Read chunks with ``r`` until none is left."""
        while (got := self._claim(r)) is not None:
            seq, at, end = got
            before = r._seen.get(self.table, 0)
            r.rowids = (at, end)
            try:
                cols = self.read(r)
            except BaseException as exc:
                with self.cv:
                    self.error = self.error or exc
                    self.stop.set()
                    self.cv.notify_all()
                raise
            finally:
                r.rowids = None
            self._deliver(seq, cols, r._seen.get(self.table, 0) - before)

    def _claim(self, r: _ChunkReader) -> tuple[int, int, int] | None:
        with self.cv:
            if self.at is None or self.at > self.hi or self.stop.is_set():
                return None
            at, end = self.at, min(self.at + self.scan_rows - 1, self.hi)
            nxt = r.con.execute(f"SELECT rowid FROM {self.table} WHERE rowid > ? ORDER BY rowid LIMIT 1",
                                (end,)).fetchone()
            self.at = None if nxt is None else int(nxt[0])
            self.claimed += 1
            return self.claimed - 1, at, end

    def _deliver(self, seq: int, cols: dict | None, seen: int) -> None:
        with self.cv:
            self.ready[seq] = cols
            self.seen += seen
            try:
                while self.added in self.ready:
                    c = self.ready.pop(self.added)
                    if c is not None and len(c["start_ns"]):
                        self.note(c)
                        self.spool.add(c)
                    self.added += 1
            except BaseException as exc:
                self.error = self.error or exc
                self.stop.set()
                raise
            finally:
                self.cv.notify_all()

    def wait(self) -> None:
        """Until every chunk handed out is in the spool (or the read stopped)."""
        with self.cv:
            while self.added < self.claimed and not self.stop.is_set():
                self.cv.wait(0.5)


def _plan(con: sqlite3.Connection, tables: tuple[tuple[str, _Read], ...]) -> tuple[int, tuple[int, int] | None]:
    """(rows expected, (lowest, highest) start of the first and last rows) of ``tables``: where the
    buckets start. A damaged or odd table just gives no hint."""
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    rows, starts = 0, []
    for t, _ in tables:
        if t not in have:
            continue
        try:
            lo, hi = rowid_bounds(con, t)
            if lo is None or hi is None:
                continue
            rows += hi - lo + 1
            for rid in (lo, hi):
                v = con.execute(f"SELECT start FROM {t} WHERE rowid = ?", (rid,)).fetchone()
                if v is not None and isinstance(v[0], int):
                    starts.append(v[0])
        except sqlite3.DatabaseError:
            continue
    return rows, ((min(starts), max(starts)) if starts else None)


class _Spiller:
    """The ``scan`` of ``_read``: device tables here, API and NVTX tables on a second connection in
    a thread (as ``read_nsys`` overlaps them), which then takes chunks of the device table still
    being scanned (``_Shared``); rows into the two spools, facts gathered."""

    def __init__(self, device: TimeSpool, api: TimeSpool, scan_rows: int) -> None:
        self.device, self.api, self.scan_rows = device, api, scan_rows
        # add_device and add_api touch disjoint fields: one object for both threads
        self.facts = TableFacts()
        self.stop = threading.Event()      # set when either side fails: the other stops early
        # the device table being scanned: the API thread, done first, takes chunks of it
        self.current: _Shared | None = None

    def _publish(self, shared: _Shared | None) -> None:
        self.current = shared

    def __call__(self, path: Path, r: _Reader) -> ScannedTables:
        assert isinstance(r, _ChunkReader)
        with ThreadPoolExecutor(max_workers=1) as pool:
            host = pool.submit(self._host, path)
            try:
                for table, read in DEVICE_TABLES:
                    r.scan(table, read, self.device, self.facts.add_device, self.stop, self._publish)
            except BaseException:
                self.stop.set()
                raise
            ranges, marks, hr = host.result()
        r.missing_strings += hr.missing_strings
        r.named_rows += hr.named_rows
        r.suspect += hr.suspect
        return None, None, ranges, marks, self.facts

    def _host(self, path: Path) -> tuple[dict | None, int, _Reader]:
        con = connect_readonly(path)
        try:
            r = _ChunkReader(path, con, self.scan_rows)
            try:
                for table, read in API_TABLES:
                    r.scan(table, read, self.api, self.facts.add_api, self.stop)
                ranges, marks = r.nvtx()
                shared = self.current
                if shared is not None:
                    shared.help(r)
            except BaseException:
                self.stop.set()
                raise
            finally:
                r.close()
            return sort_columns(ranges), marks, r
        finally:
            con.close()


class SpilledTrace:
    """An nsys export read by ``read_nsys_spilled``: ``meta``, ``ranges``, ``counters`` whole (as
    ``read_nsys`` gives them), the device and API tables on disk (``device_rows`` / ``api_rows``),
    read back in time order by ``iter_device`` / ``iter_api`` (as often as wanted). ``close`` (or
    leaving a ``with`` block) deletes the files it wrote."""

    def __init__(self, meta: TimelineMeta, ranges: pd.DataFrame, counters: pd.DataFrame,
                 device: TimeSpool, api: TimeSpool, rank_pids: list[int], rank: int,
                 one_device: bool = False, graph_launches: bool = True,
                 spans: tuple[tuple[int, int], ...] = ()) -> None:
        self.meta, self.ranges, self.counters = meta, ranges, counters
        #: (lowest start, highest end) ns of the spilled tables, each non-empty one (``TableFacts``)
        self.spans = spans
        #: every device row is of one process and one device (from the facts the spill gathered)
        self.one_device = one_device
        #: some API row is a graph launch (from the facts; True when not known)
        self.graph_launches = graph_launches
        self._device, self._api = device, api
        self._rank_pids, self._rank = rank_pids, rank
        self.device_rows, self.api_rows = device.rows, api.rows
        self.chunk_rows = device.bucket_rows
        self.closed = False

    def extent(self) -> Extent:
        """What ``ingest`` admits of the read: the spilled tables' rows and spans with the ranges'
        and counters' (``Extent.of`` the Timeline a whole read gives)."""
        return Extent(self.device_rows, self.spans + spans_of(self.ranges, self.counters))

    def iter_device(self) -> Iterator[pd.DataFrame]:
        """The device table in ascending ``start_ns`` (ties in ``read_nsys``'s order), a DataFrame of
        at most ``chunk_rows`` rows at a time (more only where more rows share one start)."""
        return self._frames(self._device, "device")

    def iter_api(self) -> Iterator[pd.DataFrame]:
        """The API table, as ``iter_device``."""
        return self._frames(self._api, "api")

    def _frames(self, spool: TimeSpool, table: str) -> Iterator[pd.DataFrame]:
        if self.closed:
            raise ValueError(f"the spilled {table} table was closed (its files are removed)")
        return self._read_frames(spool, table)

    def _read_frames(self, spool: TimeSpool, table: str) -> Iterator[pd.DataFrame]:
        if not spool.buckets:
            return
        cats = {c: spool.categories(c) for c in ("kind", "name")}
        luts = {c: spool.lookup(c, v) for c, v in cats.items()}
        # NOTE: one dtype per table, its codes made here: no chunk hashes the categories again
        dtypes = {c: pd.CategoricalDtype(v) for c, v in cats.items()}
        wide = os.environ.get(WIDE_IDS_ENV) == "1"
        narrow = {c for c, (lo, hi) in spool.id_range.items()
                  if not wide and c in ID_COLUMNS and _I32.min <= lo and hi <= _I32.max}
        offset = 0
        for chunk in spool.chunks():
            cols: dict = {}
            for k, v in chunk.items():
                if k in cats:
                    cols[k] = pd.Categorical.from_codes(luts[k][v], dtype=dtypes[k], validate=False)
                elif k in ID_COLUMNS:       # int32 on disk where a chunk fitted: one width per table
                    cols[k] = v.astype(np.int32 if k in narrow else np.int64, copy=False)
                else:
                    cols[k] = v
            self._finish_columns(table, chunk, cols, wide)
            df = validate_table(pd.DataFrame(cols, copy=False), table, copy=False)
            n = len(df)
            df.index = pd.RangeIndex(offset, offset + n)
            offset += n
            yield df

    def _finish_columns(self, table: str, chunk: dict[str, np.ndarray], cols: dict, wide: bool) -> None:
        """What a chunk's columns lack, in place: each row's rank (from its pid)."""
        rank = _ranks(chunk["pid"], self._rank_pids, self._rank)
        cols["rank"] = rank if wide else rank.astype(np.int32)

    def close(self) -> None:
        """Delete the files the read wrote: both tables' whatever the first raised; then its
        ``OSError``."""
        self.closed = True
        try:
            self._device.remove()
        finally:
            self._api.remove()

    def __enter__(self) -> SpilledTrace:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        _remove_quietly(self._device, self._api)        # NOTE: the error in flight is the one to tell
        self.closed = True


def _remove_quietly(*spools: TimeSpool | None) -> None:
    """Each spool's file removed as far as it can be, nothing raised: called while another error is
    on its way up, which a failed cleanup must not replace."""
    for spool in spools:
        if spool is not None:
            try:
                spool.remove()
            except OSError:
                pass


def read_nsys_spilled(path: str | Path, rank: int = 0, *, folder: str | Path,
                      chunk_rows: int = DEFAULT_CHUNK_ROWS, scan_rows: int = SCAN_ROWS) -> SpilledTrace:
    """Read one nsys SQLite export as ``read_nsys`` does, its device and API tables spilled to
    ``folder`` (made if missing; only files this read writes there are ever removed) in buckets of
    at most ``chunk_rows`` rows, scanned ``scan_rows`` rowids at a time. Errors as ``read_nsys``'s;
    on any error the files written so far are removed."""
    if chunk_rows < 1 or scan_rows < 1:
        raise ValueError(f"chunk_rows and scan_rows must be >= 1, got {chunk_rows}, {scan_rows}")
    path, folder = Path(path), Path(folder)
    check_side_files(path)
    con = connect_readonly(path)
    device: TimeSpool | None = None
    api: TimeSpool | None = None
    try:
        checked = path.stat().st_size <= QUICK_CHECK_ALWAYS_BYTES
        if checked:
            check_integrity(path, con)
        reader = _ChunkReader(path, con, scan_rows)
        try:
            if "StringIds" in reader.tables:   # else ``_read`` says what the file is not
                folder.mkdir(parents=True, exist_ok=True)
            device = TimeSpool(folder, "device", chunk_rows, *_plan(con, DEVICE_TABLES), narrow=ID_COLUMNS)
            api = TimeSpool(folder, "api", chunk_rows, *_plan(con, API_TABLES), narrow=ID_COLUMNS)
            spiller = _Spiller(device, api, scan_rows)
            tl = _read(path, reader, rank, checked, scan=spiller)
            for table, bad in (("device", device.bad_rows), ("api", api.bad_rows)):
                if bad:      # as validate_table says it of the whole table
                    raise TimelineError(f"{table} table has {bad} row(s) with end_ns < start_ns")
        except (sqlite3.DatabaseError, ValueError, TimelineError) as exc:
            if not checked and not isinstance(exc, TraceError):
                check_integrity(path, con, why=str(exc))
            raise
        finally:
            reader.close()
    except BaseException:
        _remove_quietly(device, api)
        raise
    finally:
        con.close()
    facts = spiller.facts
    return SpilledTrace(tl.meta, tl.ranges, tl.counters, device, api, facts.rank_pids(), rank,
                        len(facts.devices) <= 1 and len(facts.dev_pids) <= 1, facts.graph_launches > 0,
                        tuple(facts.spans()))
