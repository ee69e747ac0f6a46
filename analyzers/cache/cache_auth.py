"""What makes a cache entry trustworthy: files read without ever blocking on something that is not a
regular file, and a per-user secret key that authenticates what this user's srtscope wrote.

The key: 32 random bytes in ``$XDG_CONFIG_HOME/srtscope/cache.key`` (else
``~/.config/srtscope/cache.key``), made on first use with mode 0600 in a 0700 folder, never inside
the cache folder. It is used only if it is a regular file of this user, readable by no one else,
of exactly 32 bytes; otherwise the cache is not used (one warning). Entries carry a keyed BLAKE2b
(RFC 7693's MAC mode, 256 bits) of their contents: an entry another user wrote into a shared cache
folder, or that was edited, does not verify and is ignored. The standard library only.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import os
import stat
from pathlib import Path

KEY_BYTES = 32
KEY_NAME = "cache.key"


class CacheKeyError(OSError):
    """The per-user key cannot be made or is not safe to use (the cache is then not used)."""


class NotRegular(OSError):
    """A cache file that is not a regular file (a FIFO, a device, a link): never opened for reading."""


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file that is no symlink.
    ``O_NONBLOCK``: a FIFO or device put there returns at once (then refused) instead of hanging."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """All of the regular file ``path`` (see ``open_regular``); ``ValueError`` past ``limit`` bytes."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{path}: {size} bytes, more than the {limit} allowed")
        chunks = []
        left = limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: more than the {limit} bytes allowed")
    return data


def key_path() -> Path:
    """``$XDG_CONFIG_HOME/srtscope/cache.key``, else ``~/.config/srtscope/cache.key``."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "srtscope" / KEY_NAME


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


_KEYS: dict[str, bytes] = {}


def user_key(cache_root: Path) -> bytes:
    """This user's cache key (made on first use); ``CacheKeyError`` when it is inside ``cache_root``,
    not a regular file of this user, readable or writable by others, or not 32 bytes."""
    path = key_path()
    if str(path) in _KEYS:
        return _KEYS[str(path)]
    if _inside(path, cache_root):
        raise CacheKeyError(f"the key file {path} lies inside the cache folder {cache_root}: "
                            "set XDG_CONFIG_HOME or SRTSCOPE_CACHE_DIR apart")
    try:
        key = _read_key(path)
    except FileNotFoundError:
        key = _make_key(path)
    _KEYS[str(path)] = key
    return key


def _read_key(path: Path) -> bytes:
    try:
        fd = open_regular(path)
    except NotRegular:
        raise CacheKeyError(f"the key file {path} is not a regular file") from None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(str(path)) from None
        if exc.errno == errno.ELOOP:
            raise CacheKeyError(f"the key file {path} is a symlink") from None
        raise CacheKeyError(f"the key file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise CacheKeyError(f"the key file {path} belongs to another user")
        if st.st_mode & 0o077:
            raise CacheKeyError(f"the key file {path} is open to other users (mode "
                                f"{stat.S_IMODE(st.st_mode):o}, expected 600)")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise CacheKeyError(f"the key file {path} holds {len(key)} bytes, not {KEY_BYTES}")
    return key


def _make_key(path: Path) -> bytes:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return _read_key(path)          # another process made it first
    except OSError as exc:
        raise CacheKeyError(f"cannot make the key file {path}: {exc.strerror or exc}") from None
    key = os.urandom(KEY_BYTES)
    try:
        os.fchmod(fd, 0o600)            # whatever the umask
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def mac(key: bytes, *parts: bytes | memoryview) -> str:
    """Keyed BLAKE2b-256 of ``parts`` (each length-prefixed, so parts cannot run into each other)."""
    h = hashlib.blake2b(key=key, digest_size=32)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def same(a: object, b: object) -> bool:
    """Constant-time equality of two MACs (strings)."""
    return isinstance(a, str) and isinstance(b, str) and hmac.compare_digest(a.encode(), b.encode())
