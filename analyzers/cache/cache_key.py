"""How the caches know a trace is unchanged: ``trace_key`` of a file is its resolved path, size,
mtime, ctime, inode and device, and a hash of *every byte* of it (xxh3-128 where ``xxhash`` is
installed, else BLAKE2b), with the rank asked for and the readers' version.

NOTE: why the whole file (``benchmarks/cache_freshness.py``, a 1 GB export): the first and last
64 KiB, SQLite's header change counter and sampled pages all miss a byte rewritten in the middle
with the mtime restored (``touch -r``); xxh3 over the whole file costs ~0.45-0.7 s/GB from the page
cache, BLAKE2b or SHA-1 4-6x that. ctime is kept too: every write moves it and no user can set it
back. The hash is taken once per process per file while its stat identity holds.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from srtscope.analyzers.cache.cache_auth import open_regular

#: Bump when any reader's output (tables, dtypes, meta) changes: older entries are then stale.
READER_VERSION = 4      # 4: Kineto: the range open at the profiler's stop cut; SGLang's step[...] forwards stand in
#: read in chunks that stay in the CPU cache while hashed (measured: 256 KiB 0.44 s/GB, 8 MiB 0.8 s/GB)
HASH_CHUNK = 256 << 10


def _content_hasher() -> tuple[str, Callable[[], object]]:
    try:
        import xxhash  # type: ignore[import-not-found,unused-ignore]
        return "xxh3_128", xxhash.xxh3_128
    except ImportError:                     # pragma: no cover - xxhash is a dependency
        return "blake2b", lambda: hashlib.blake2b(digest_size=16)


HASH_NAME, new_hash = _content_hasher()


@dataclass(frozen=True)
class TraceKey:
    """What identifies one read of a trace: the file's identity, ``content`` (a hash of all of its
    bytes, ``hash`` the algorithm), the rank asked for and the reader's version. ``size`` in bytes,
    ``mtime_ns`` / ``ctime_ns`` in ns (a write moves ctime, which ``touch`` cannot set back)."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int
    content: str
    rank: int
    hash: str = HASH_NAME
    reader_version: int = READER_VERSION

    @property
    def entry_name(self) -> str:
        """Folder name of the entry: one per (path, rank), so a changed trace replaces its entry."""
        return hashlib.sha1(f"{self.path}\0{self.rank}".encode(), usedforsecurity=False).hexdigest()[:32]

    def unchanged(self) -> bool:
        """Whether the file at ``path`` still has this key's stat identity (ctime included: any
        write since moves it). One stat; False when it cannot be read."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev) == \
            (self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device)


#: content hashes already computed in this process, by the file's full stat identity
_HASHED: dict[tuple, str] = {}


def trace_key(path: Path, rank: int) -> TraceKey:
    """The key of ``path`` as it is now: one stat and one pass over all of its bytes (the hash is
    remembered for the rest of the process while the file's stat identity, ctime included, holds).
    OSError for anything but a regular file (never opened blocking)."""
    real = path.resolve()
    fd = open_regular(real)
    try:
        st = os.fstat(fd)
        ident = (str(real), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        content = _HASHED.get(ident)
        if content is None:
            h = new_hash()
            buf = bytearray(HASH_CHUNK)
            view = memoryview(buf)
            with os.fdopen(os.dup(fd), "rb", buffering=0) as fh:
                while n := fh.readinto(buf):
                    h.update(view[:n])   # type: ignore[attr-defined]
            content = h.hexdigest()      # type: ignore[attr-defined]
            after = os.fstat(fd)
            if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == ident[1:4]:
                _HASHED[ident] = content
    finally:
        os.close(fd)
    return TraceKey(str(real), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                    content, rank)
