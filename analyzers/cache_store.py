"""The cache folder's mechanics, shared by the table cache (``readers/cache.py``) and the diagnosis
cache (``result_cache.py``): where it is, how a trace is keyed, its size cap and least-recently-used
eviction, atomic removal. The standard library only, so that an answer from the cache costs no
numpy or pandas import.

Where: ``$SRTSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/srtscope``, else ``~/.cache/srtscope``. Each
entry is a folder whose ``meta.json`` mtime is its last use; folders starting ``.tmp-`` are being
written or removed. Cap: ``$SRTSCOPE_CACHE_MAX_MB`` (default 2048 MiB).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Bump when any reader's output (tables, dtypes, meta) changes: older entries are then stale.
READER_VERSION = 2
FINGERPRINT_BYTES = 64 << 10
DEFAULT_MAX_MB = 2048
DEFAULT_MIN_BYTES = 1 << 20
META = "meta.json"
TMP_PREFIX = ".tmp-"
#: the names srtscope gives entries: a table entry's hash, or ``diagnosis-`` and a hash
ENTRY_NAME = re.compile(r"(diagnosis-)?[0-9a-f]{32}")
_warned = [False]


class CacheWarning(UserWarning):
    """The cache could not be used (unwritable directory, full disk): the trace is read as usual."""


@dataclass(frozen=True)
class TraceKey:
    """What identifies one read of a trace: the file's identity and content fingerprint, the rank
    asked for and the reader's version. ``size`` in bytes, ``mtime_ns`` in ns."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    device: int
    fingerprint: str
    rank: int
    reader_version: int = READER_VERSION

    @property
    def entry_name(self) -> str:
        """Folder name of the entry: one per (path, rank), so a changed trace replaces its entry."""
        return hashlib.sha1(f"{self.path}\0{self.rank}".encode(), usedforsecurity=False).hexdigest()[:32]


def cache_dir() -> Path:
    """``$SRTSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/srtscope``, else ``~/.cache/srtscope``."""
    if d := os.environ.get("SRTSCOPE_CACHE_DIR"):
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "srtscope"


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


def max_bytes() -> int:
    """The cache's size cap in bytes (``$SRTSCOPE_CACHE_MAX_MB`` MiB, default 2048)."""
    return _env_int("SRTSCOPE_CACHE_MAX_MB", DEFAULT_MAX_MB) << 20


def cache_enabled_for(path: Path) -> bool:
    """Whether ``path`` is big enough to be worth caching (``$SRTSCOPE_CACHE_MIN_BYTES``)."""
    try:
        return path.stat().st_size >= _env_int("SRTSCOPE_CACHE_MIN_BYTES", DEFAULT_MIN_BYTES)
    except OSError:
        return False


def trace_key(path: Path, rank: int) -> TraceKey:
    """The key of ``path`` as it is now (one stat, two small reads)."""
    real = path.resolve()
    with open(real, "rb") as fh:
        st = os.fstat(fh.fileno())
        h = hashlib.sha1(usedforsecurity=False)
        h.update(fh.read(FINGERPRINT_BYTES))
        if st.st_size > FINGERPRINT_BYTES:
            fh.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
            h.update(fh.read(FINGERPRINT_BYTES))
    return TraceKey(str(real), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, h.hexdigest(), rank)


def warn_once(message: str) -> None:
    """One ``CacheWarning`` per process, whatever goes wrong how often."""
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(f"srtscope cache not used: {message}", CacheWarning, stacklevel=3)


class CacheStore:
    """The entries under ``root``; ``cap`` in bytes."""

    def __init__(self, root: Path | None = None, cap: int | None = None) -> None:
        self.root = root if root is not None else cache_dir()
        self.cap = max_bytes() if cap is None else cap

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every entry, least recently used first.

        NOTE: only folders named as srtscope names its entries count: anything else in the folder
        (``$SRTSCOPE_CACHE_DIR`` pointed somewhere shared) is never evicted nor cleared."""
        out = []
        for e in self.root.iterdir():
            if not ENTRY_NAME.fullmatch(e.name) or not e.is_dir():
                continue
            try:
                used = (e / META).stat().st_mtime
            except OSError:
                used = 0.0
            out.append((used, sum(f.stat().st_size for f in e.iterdir() if f.is_file()), e))
        return sorted(out, key=lambda x: x[0])

    def evict(self, keep: Path | None = None) -> None:
        """Drop least recently used entries until the cache holds at most ``cap`` bytes."""
        try:
            found = self.entries()
        except OSError:
            return
        total = sum(b for _, b, _ in found)
        for _, b, e in found:
            if total <= self.cap:
                break
            if e != keep:
                self.drop(e)
                total -= b

    def publish(self, name: str, write: Callable[[Path], None]) -> None:
        """Add the entry ``name`` atomically: ``write(folder)`` fills a new folder inside the cache,
        which is then renamed into place (replacing an older entry of that name) and the cache
        evicted down to its cap. An entry larger than the whole cap is not kept. The cache's own
        trouble (``OSError``) costs one warning per process; another exception of ``write`` is
        raised, the half-written folder removed."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=self.root))
        except OSError as exc:
            warn_once(f"{self.root}: {exc.strerror or exc}")
            return
        try:
            write(tmp)
            if sum(f.stat().st_size for f in tmp.iterdir()) > self.cap:
                return
            entry = self.root / name
            if entry.exists():
                self.drop(entry)
            try:
                os.rename(tmp, entry)
            except OSError:
                return                      # another process put it there first
            self.evict(keep=entry)
        except OSError as exc:
            warn_once(f"{self.root}: {exc.strerror or exc}")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def drop(self, entry: Path) -> None:
        """Remove an entry: renamed away first (readers never see half of it), then deleted."""
        try:
            gone = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=self.root))
            os.rename(entry, gone / "x")
            shutil.rmtree(gone, ignore_errors=True)
        except OSError:
            shutil.rmtree(entry, ignore_errors=True)
