"""Writes of a spill file that bypass the page cache where the file system allows (``O_DIRECT``).

A spill is written once and read back in time order later; written through the page cache, each
of its pages is a fresh page of memory filled by a copy, held dirty until written back. At 10 GB
a spill of ~1.7 GB cost ~2 s of system time that way (a buffered write of 1 GiB here: 1.3-3.0 s of
system time; the same write direct: 0.06-0.19 s, and the disk's 0.8-1.0 s of waiting). Read back
through ``mmap``, the pages the disk fills are not zeroed first nor copied.

``SpillWriter.write`` takes the same buffers as a buffered ``pwritev``: they are gathered into one
page-aligned staging buffer and written whole pages at a time, so the file's length is the segment's
span, not its bytes. Where ``O_DIRECT`` is missing (not Linux), refused at open (a file system without
it) or refused at a write (a block size over 4 KiB), writes go through the page cache as before,
with the same bytes. So do the writes after the first ``PROBE_BYTES`` where those went slower than
``MIN_DIRECT_RATE``: a disk that slow (spinning, or over a network) would also read the spill back
that slowly, where the page cache would have held it. ``SRTSCOPE_SPILL_DIRECT=0`` writes through
the page cache always.
NOTE: a segment is written once, past the file's end; a range written direct is never cached
before it is written (the kernel drops any cached page of it anyway).
"""
from __future__ import annotations

import errno
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

DIRECT_ENV = "SRTSCOPE_SPILL_DIRECT"
#: what a direct write's offset, length and buffer are aligned to, bytes
BLOCK = 4096
#: bytes written direct before their pace is judged, and the least pace kept, bytes/s (this VM's
#: disk: 1.1-1.3 GB/s in 1 MiB writes, 0.53-0.63 GB/s in a spill's; a spinning disk: ~0.1-0.2 GB/s)
PROBE_BYTES, MIN_DIRECT_RATE = 64 << 20, 200e6
#: the least write counted in the judging: a small write's time is the device's latency, not its pace
PROBE_WRITE = 256 << 10


class SpillWriter:
    """Writes into the file ``path`` (open as ``fd``, read-write), direct where it can."""

    def __init__(self, path: Path, fd: int) -> None:
        self.fd = fd
        self.direct_fd: int | None = None
        self._stage: mmap.mmap | None = None
        self._probed = [0, 0.0]             # bytes written direct and the seconds they took
        flag = getattr(os, "O_DIRECT", 0)
        if flag and os.environ.get(DIRECT_ENV, "1") != "0":
            try:
                self.direct_fd = os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self.direct_fd = None       # the file system has no direct writes

    @property
    def direct(self) -> bool:
        return self.direct_fd is not None

    def write(self, bufs: list[Any], offset: int) -> None:
        """Every byte of ``bufs`` written at ``offset``; written direct, the bytes after them up to
        the next multiple of ``BLOCK`` are zeros (the caller leaves them unused). An ``OSError`` of
        the writes (``ENOSPC``: a full disk) is raised as it is, no view of the staging buffer left."""
        if self.direct_fd is not None and offset % BLOCK == 0:
            size = sum(memoryview(b).nbytes for b in bufs)
            span = -(-size // BLOCK) * BLOCK
            stage = self._staged(span)
            _fill(stage, bufs, span)
            # NOTE: each view of the staging buffer is released before this returns or raises: one
            # kept alive by an exception's traceback would keep ``close`` from unmapping the
            # buffer (BufferError in the cleanup, in place of the write's own error)
            head = memoryview(stage)[:span]
            t0 = time.perf_counter()
            try:
                done = _write_all(self.direct_fd, [head], offset, aligned=True)
                self._judge(done, time.perf_counter() - t0)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                done = 0                    # refused (alignment, file system): the page cache's way
                self._close_direct()
            finally:
                head.release()
            if done >= size:
                return
            tail = memoryview(stage)[done:size]
            try:
                _write_all(self.fd, [tail], offset + done)
            finally:
                tail.release()
            return
        _write_all(self.fd, bufs, offset)

    def _judge(self, written: int, seconds: float) -> None:
        """Direct writes kept only where the first ``PROBE_BYTES`` went at ``MIN_DIRECT_RATE`` or more."""
        p = self._probed
        if p[0] >= PROBE_BYTES or written < PROBE_WRITE:
            return                          # judged already, or too small a write to tell a pace
        p[0] += written
        p[1] += seconds
        if p[0] >= PROBE_BYTES and p[0] < MIN_DIRECT_RATE * p[1]:
            self._close_direct()

    def _staged(self, span: int) -> mmap.mmap:
        """The staging buffer, page-aligned, of at least ``span`` bytes (grown by doubling)."""
        if self._stage is None or len(self._stage) < span:
            had = 0 if self._stage is None else len(self._stage)
            self._drop_stage()
            self._stage = mmap.mmap(-1, max(span, 2 * had, 1 << 20))
        return self._stage

    def _drop_stage(self) -> None:
        stage, self._stage = self._stage, None
        if stage is not None:
            try:
                stage.close()
            except BufferError:
                # NOTE: a view of it still alive (none should be: ``write`` releases its own); the
                # memory is unmapped when that view goes. Never an error of its own: it would take
                # the place of the error being cleaned up after
                pass

    def _close_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """The direct descriptor and the staging buffer released (``fd`` is the caller's); the
        buffer whatever closing the descriptor raises."""
        try:
            self._close_direct()
        finally:
            self._drop_stage()


def _fill(stage: mmap.mmap, bufs: list[Any], span: int) -> None:
    """``bufs`` one after another at the start of ``stage``, zeros after them up to ``span``."""
    out = np.frombuffer(stage, np.uint8, span)
    try:
        pos = 0
        for b in bufs:
            v = np.frombuffer(memoryview(b).cast("B"), np.uint8)
            out[pos:pos + len(v)] = v
            pos += len(v)
        out[pos:] = 0
    finally:
        del out                             # NOTE: no export of ``stage`` outlives this (see ``write``)


def _write_all(fd: int, bufs: list[Any], offset: int, aligned: bool = False) -> int:
    """``bufs`` written at ``offset`` of ``fd``, short writes resumed; bytes written. ``aligned``:
    a direct write, stopped at a short write that is not whole blocks (the rest is the caller's)."""
    views = [memoryview(b).cast("B") for b in bufs]
    done = 0
    try:
        while views:
            if hasattr(os, "pwritev"):
                n = os.pwritev(fd, views[:1024], offset)
            else:
                n = os.pwrite(fd, views[0], offset)
            if n <= 0:
                raise OSError(errno.EIO, "a write of the spill made no progress")
            offset += n
            done += n
            if aligned and n % BLOCK:
                return done
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0).release()
            if views and n:
                rest = views[0][n:]
                views[0].release()
                views[0] = rest
        return done
    finally:
        for v in views:             # NOTE: released on an error too (see ``SpillWriter.write``)
            v.release()
