"""``python _full_disk.py WRITE_LIMIT CLOSE_ERRNO SRTSCOPE_ARGS...``: the ``srtscope`` command (its
entry point, ``cli.app.main``) whose spill meets a full disk, for ``test_spill_full_disk``.

``WRITE_LIMIT``: the spill's writes (``spill_writes``' ``pwritev`` / ``pwrite``) raise ``ENOSPC``
once they would pass that many bytes in all (-1: never). ``CLOSE_ERRNO``: closing a descriptor of a
spill file (``*.spool``) closes it, then raises that ``OSError`` (as a network file system reports a
write it could not keep; 0: never). The bytes written before are real: the spill's own files are on
disk when the error comes."""
from __future__ import annotations

import os
import sys
from typing import Any

from srtscope.analyzers.spill import spill_writes, time_spool


class _FullDisk:
    """``os`` as the spill modules see it, with the faults above."""

    def __init__(self, limit: int, close_errno: int) -> None:
        self.limit, self.close_errno, self.written = limit, close_errno, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _room(self, n: int) -> None:
        if self.limit >= 0 and self.written + n > self.limit:
            raise OSError(28, os.strerror(28))          # ENOSPC
        self.written += n

    def pwritev(self, fd: int, bufs: list, offset: int) -> int:
        self._room(sum(memoryview(b).nbytes for b in bufs))
        return os.pwritev(fd, bufs, offset)

    def pwrite(self, fd: int, buf: Any, offset: int) -> int:
        self._room(memoryview(buf).nbytes)
        return os.pwrite(fd, buf, offset)

    def close(self, fd: int) -> None:
        try:
            spool = os.readlink(f"/proc/self/fd/{fd}").endswith(".spool")
        except OSError:
            spool = False
        os.close(fd)
        if spool and self.close_errno:
            raise OSError(self.close_errno, os.strerror(self.close_errno))


if __name__ == "__main__":
    fake = _FullDisk(int(sys.argv[1]), int(sys.argv[2]))
    spill_writes.os = fake          # type: ignore[assignment]
    time_spool.os = fake            # type: ignore[assignment]
    sys.argv = ["srtscope", *sys.argv[3:]]
    from srtscope.cli.app import main

    main()
