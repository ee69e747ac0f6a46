"""The cache folder's mechanics, shared by the table cache (``cache/table_cache.py``) and the diagnosis
cache (``cache/result_cache.py``): where it is, which folders are srtscope's, how a trace is keyed, the
size cap and least-recently-used eviction, atomic publication and removal. The standard library
(and ``xxhash`` where installed) only, so that an answer from the cache costs no numpy or pandas.

Where: ``$SRTSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/srtscope``, else ``~/.cache/srtscope``; in a
folder shared with other users (theirs, or writable by them), this user's ``user-<uid>`` inside it.

Ownership: a folder is an entry only if it holds srtscope's marker file ``srtscope-entry.json``
(written inside it by srtscope: owner, store format, kind, and the entry's MAC); its name means
nothing. Eviction and ``--clear`` remove entries only, and name what they left alone. A folder
being written or removed is a ``.tmp-*`` folder whose marker says so and names its writer (host,
pid); one whose writer is gone (that pid no longer runs on this host, or older than
``STALE_TMP_S``) is a leftover of a killed run, reclaimed by the next write or ``--clear``.

Freshness (``cache_key.trace_key``): path, size, mtime, ctime, inode, device, and a hash of the
*whole* file (xxh3-128): a file changed in place is a miss whatever its mtime says.
Authenticity: an entry's marker carries a keyed BLAKE2b of its ``meta.json`` with this user's key
(``cache/cache_auth.py``); an entry that does not verify is ignored with a one-line note.
Cap: ``$SRTSCOPE_CACHE_MAX_MB`` (default 2048 MiB; a whole number 0..2^32, anything else refused).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from srtscope.analyzers.cache.cache_auth import CacheKeyError, mac, read_regular, same, user_key
from srtscope.analyzers.cache.cache_key import (  # noqa: F401 - the key's names, for the caches' users
    HASH_NAME,
    READER_VERSION,
    TraceKey,
    new_hash,
    trace_key,
)

#: Marker file inside every entry and temp folder; ``STORE_FORMAT`` its layout's version.
MARKER = "srtscope-entry.json"
OWNER = "srtscope cache entry"
STORE_FORMAT = 2
DEFAULT_MAX_MB = 2048
MAX_MB_LIMIT = 2**32
DEFAULT_MIN_BYTES = 1 << 20
META = "meta.json"
MAX_META_BYTES = 64 << 20
MAX_MARKER_BYTES = 4096
TMP_PREFIX = ".tmp-"
#: a temp folder this old (s since its last write) is a killed writer's, whoever wrote it
STALE_TMP_S = 3600.0
_warned = [False]
_noted: set[str] = set()


class CacheWarning(UserWarning):
    """The cache could not be used, or an entry was ignored; the trace is read as usual. The CLI
    prints it as one line ``srtscope: warning: ...``."""


class CacheSettingError(ValueError):
    """A cache setting (``$SRTSCOPE_CACHE_MAX_MB``, ``$SRTSCOPE_CACHE_MIN_BYTES``) that is not a
    whole number in range; one line naming the variable."""


def cache_dir() -> Path:
    """``$SRTSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/srtscope``, else ``~/.cache/srtscope``."""
    if d := os.environ.get("SRTSCOPE_CACHE_DIR"):
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "srtscope"


def env_int(name: str, default: int, limit: int) -> int:
    """``$name`` as a whole number in 0..limit (unset or empty: ``default``); else CacheSettingError."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > limit:
        raise CacheSettingError(f"${name}={raw[:40]!r}: expected a whole number 0..{limit}")
    return int(raw)


def max_bytes() -> int:
    """The cache's size cap in bytes (``$SRTSCOPE_CACHE_MAX_MB`` MiB, default 2048)."""
    return env_int("SRTSCOPE_CACHE_MAX_MB", DEFAULT_MAX_MB, MAX_MB_LIMIT) << 20


def check_settings() -> None:
    """CacheSettingError (one line) for a cache variable that is set to something unusable."""
    max_bytes()
    env_int("SRTSCOPE_CACHE_MIN_BYTES", DEFAULT_MIN_BYTES, 2**62)


def cache_enabled_for(path: Path) -> bool:
    """Whether ``path`` is big enough to be worth caching (``$SRTSCOPE_CACHE_MIN_BYTES``)."""
    try:
        return path.stat().st_size >= env_int("SRTSCOPE_CACHE_MIN_BYTES", DEFAULT_MIN_BYTES, 2**62)
    except OSError:
        return False


def warn_once(message: str) -> None:
    """One ``CacheWarning`` per process, whatever goes wrong how often."""
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(f"srtscope cache not used: {message}", CacheWarning, stacklevel=3)


def note(message: str) -> None:
    """A ``CacheWarning`` about one entry (ignored, left alone); each message once per process."""
    if message not in _noted:
        _noted.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


def describe_os_error(root: Path, exc: OSError) -> str:
    """What is wrong with the cache folder, in words (not Python's "File exists")."""
    if isinstance(exc, CacheKeyError):
        return str(exc)
    if os.path.islink(root) and not os.path.exists(root):
        return f"{root} is a symlink to nothing"
    if os.path.lexists(root) and not os.path.isdir(root):
        return f"{root} is not a folder"
    return f"{exc.filename or root}: {exc.strerror or exc}"


@dataclass(frozen=True)
class Entry:
    """One of srtscope's folders: ``used`` (s since the epoch, its last use), ``size`` (bytes),
    ``kind`` (``tables`` / ``answer``, or ``writing`` / ``removing`` for a temp folder)."""

    path: Path
    used: float
    size: int
    kind: str


@dataclass
class Scan:
    """What the cache folder holds: ``entries`` (least recently used first), ``leftovers`` (temp
    folders of killed writers), ``busy`` (temp folders being written now), ``foreign`` (everything
    srtscope did not make: never touched)."""

    entries: list[Entry] = field(default_factory=list)
    leftovers: list[Entry] = field(default_factory=list)
    busy: list[Entry] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)


def read_marker(folder: Path) -> dict | None:
    """The marker of ``folder`` when it is a real folder holding srtscope's marker, else None."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        doc = json.loads(read_regular(folder / MARKER, MAX_MARKER_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("owner") != OWNER or type(doc.get("store")) is not int:
        return None
    return doc


def _write_marker(folder: Path, doc: dict) -> None:
    tmp = folder / f".{MARKER}.new"
    tmp.write_text(json.dumps({"owner": OWNER, "store": STORE_FORMAT, **doc}))
    os.replace(tmp, folder / MARKER)


def _tree_size(folder: Path) -> tuple[int, float]:
    """(bytes of the regular files under ``folder``, newest mtime there), links not followed."""
    total, newest = 0, 0.0
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total, newest


def _writer_gone(mark: dict, newest: float) -> bool:
    """Whether the process that made a temp folder is gone: that pid no longer runs on this host,
    or nothing was written there for ``STALE_TMP_S``."""
    if time.time() - newest > STALE_TMP_S:
        return True
    pid = mark.get("pid")
    if mark.get("host") != socket.gethostname() or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _verifies(key: bytes, mark: dict, kind: str, name: str, meta: bytes) -> bool:
    return same(mark.get("mac"), mac(key, kind.encode(), name.encode(), meta))


def own_root(root: Path) -> Path:
    """``root``, or this user's folder ``user-<uid>`` inside it when ``root`` is shared: another
    user's, or writable by others (a sticky ``/tmp``-like folder). Each user then keeps and sees
    only their own entries: another user's are never read, warned about or recomputed."""
    try:
        st = os.stat(root)
    except OSError:
        return root                     # made by the first write, mode 0700: this user's alone
    if st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return root
    return root / f"user-{os.getuid()}"


def _check_own(folder: Path) -> None:
    """CacheKeyError unless ``folder`` (when it exists) is a real folder of this user that no one
    else may write: one put there under this user's name by someone else is never used."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise CacheKeyError(f"{folder} is not a folder of this user's that only they may write")


class CacheStore:
    """The entries under ``root`` (``own_root``: this user's folder in a shared one); ``cap`` in
    bytes."""

    def __init__(self, root: Path | None = None, cap: int | None = None) -> None:
        given = root if root is not None else cache_dir()
        self.root = own_root(given)
        self.shared = self.root != given      # this user's folder inside a shared one
        self.cap = max_bytes() if cap is None else cap

    def key(self) -> bytes:
        """This user's MAC key (``cache_auth.user_key``); CacheKeyError when unusable, or when this
        user's folder in a shared one is not theirs (``_check_own``)."""
        if self.shared:
            _check_own(self.root)
        return user_key(self.root)

    def scan(self) -> Scan:
        """Sort what the folder holds (OSError when it cannot be listed)."""
        out = Scan()
        for e in sorted(self.root.iterdir()):
            mark = read_marker(e)
            if mark is None or not isinstance(mark.get("kind"), str):
                out.foreign.append(e)
                continue
            size, newest = _tree_size(e)
            if e.name.startswith(TMP_PREFIX):
                item = Entry(e, newest, size, mark["kind"])
                (out.leftovers if _writer_gone(mark, newest) else out.busy).append(item)
                continue
            try:
                used = os.lstat(e / META).st_mtime
            except OSError:
                used = 0.0
            out.entries.append(Entry(e, used, size, mark["kind"]))
        out.entries.sort(key=lambda x: x.used)
        return out

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every entry, least recently used first."""
        return [(x.used, x.size, x.path) for x in self.scan().entries]

    def reclaim(self, scan: Scan | None = None) -> list[Entry]:
        """Remove the temp folders of killed writers; returns those removed."""
        scan = self.scan() if scan is None else scan
        return [x for x in scan.leftovers if self._remove(x.path)]

    def evict(self, keep: Path | None = None) -> None:
        """Drop least recently used entries until they hold at most ``cap`` bytes; anything else
        in the folder is left alone (and named once, when eviction had to run)."""
        try:
            scan = self.scan()
        except OSError:
            return
        self.reclaim(scan)
        total = sum(x.size for x in scan.entries)
        if total <= self.cap:
            return
        for x in scan.entries:
            if total <= self.cap:
                break
            if x.path != keep and self.drop(x.path):
                total -= x.size
        if scan.foreign:
            names = ", ".join(p.name for p in scan.foreign[:3]) + (" …" if len(scan.foreign) > 3 else "")
            note(f"srtscope cache {self.root}: evicted down to the cap; left alone "
                 f"{len(scan.foreign)} item{'s' if len(scan.foreign) != 1 else ''} srtscope did not make ({names})")

    def open_entry(self, name: str, kind: str) -> bytes | None:
        """The verified ``meta.json`` bytes of entry ``name``; None when there is none, it is not
        srtscope's (left alone), of another format or damaged (dropped), or does not verify with
        this user's key (ignored with a note, dropped)."""
        entry = self.root / name
        if not os.path.lexists(entry):
            return None
        mark = read_marker(entry)
        if mark is None:
            return None
        if mark.get("store") != STORE_FORMAT or mark.get("kind") != kind:
            self.drop(entry)
            return None
        try:
            key = self.key()
        except CacheKeyError as exc:
            warn_once(str(exc))
            return None
        try:
            meta = read_regular(entry / META, MAX_META_BYTES)
        except (OSError, ValueError):
            self.drop(entry)
            return None
        if not _verifies(key, mark, kind, name, meta):
            note(f"srtscope cache: ignored entry {name} (not written by this user's srtscope, or "
                 "edited since); recomputed")
            self.drop(entry)
            return None
        return meta

    def verified(self, entry: Path) -> bool | None:
        """Whether ``entry``'s meta.json verifies with this user's key (None: no usable key, or no
        marker); reads only, drops nothing (for ``srtscope cache``)."""
        mark = read_marker(entry)
        if mark is None or not isinstance(mark.get("kind"), str):
            return None
        try:
            key = self.key()
            meta = read_regular(entry / META, MAX_META_BYTES)
        except CacheKeyError:
            return None
        except (OSError, ValueError):
            return False
        return _verifies(key, mark, mark["kind"], entry.name, meta)

    def publish(self, name: str, kind: str, write: Callable[[Path], None]) -> None:
        """Add the entry ``name`` atomically: ``write(folder)`` fills a new folder inside the cache
        (its ``meta.json`` last), which gets its marker and MAC and is then renamed into place
        (replacing an older entry of that name, never a folder srtscope did not make); then the
        cache is evicted down to its cap. An entry larger than the whole cap is not kept. The
        cache's own trouble (``OSError``) costs one warning per process; another exception of
        ``write`` is raised, the half-written folder removed."""
        try:
            key = self.key()
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.shared:
                _check_own(self.root)
            tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=self.root))
            _write_marker(tmp, {"kind": "writing", "host": socket.gethostname(), "pid": os.getpid()})
        except OSError as exc:
            warn_once(describe_os_error(self.root, exc))
            return
        try:
            write(tmp)
            meta = read_regular(tmp / META, MAX_META_BYTES)
            if _tree_size(tmp)[0] > self.cap:
                return
            _write_marker(tmp, {"kind": kind, "mac": mac(key, kind.encode(), name.encode(), meta)})
            # NOTE: the MAC covers meta.json only; the table files are bound by digests inside it
            entry = self.root / name
            if os.path.lexists(entry) and not self.drop(entry):
                return                      # a folder srtscope did not make: left alone
            try:
                os.rename(tmp, entry)
            except OSError:
                return                      # another process put it there first
            self.evict(keep=entry)
        except (OSError, ValueError) as exc:
            warn_once(describe_os_error(self.root, exc) if isinstance(exc, OSError) else str(exc))
        finally:
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)

    def drop(self, entry: Path) -> bool:
        """Remove one of srtscope's folders (renamed away first: readers never see half of it);
        False, and nothing touched, for anything else."""
        if read_marker(entry) is None:
            return False
        return self._remove(entry)

    def _remove(self, folder: Path) -> bool:
        try:
            gone = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=self.root))
        except OSError:
            return False
        try:
            _write_marker(gone, {"kind": "removing", "host": socket.gethostname(), "pid": os.getpid()})
            os.rename(folder, gone / "x")
        except OSError:
            shutil.rmtree(gone, ignore_errors=True)
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return not os.path.lexists(gone)
