"""Every file the CLI writes goes through here: regular files only, atomic, the user's umask.

- A path that exists must be a regular file: a directory, FIFO, socket or device node is refused,
  and so is a symlink (srtscope never writes through a link nor renames over one; give the target's
  own path instead). Refusals are ``OutputError`` (a ValueError, one line); the CLI exits 2.
- Files are written to a hidden temp file beside the target and renamed over it, so a reader never
  sees half a file, and are created with mode ``0o666 & ~umask`` (0644 normally), like ``open()``.
- ``out_dir_lock`` serialises writers of one ``run --out`` folder (``fcntl.flock``).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_NAME = ".srtscope.lock"

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class OutputError(ValueError):
    """An output path srtscope refuses or cannot write; the message is one line naming the path."""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def user_umask() -> int:
    """The process umask, read without changing it where /proc says it (Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666 & ~umask``."""
    return 0o666 & ~user_umask()


def check_output_path(path: Path) -> Path:
    """Raise OutputError unless ``path`` is absent or a regular file (a symlink is refused)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise OutputError(f"{path}: cannot write: a parent of it is not a directory") from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {_why(exc)}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{path}: is a symlink; srtscope does not write through links "
                          f"(give the target's own path)")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise OutputError(f"{path}: is {kind}; srtscope writes regular files only")
    return path


def ensure_dir(path: Path, what: str = "output folder") -> Path:
    """Create ``path`` (and parents) as a folder, or accept an existing folder (or a link to one)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{path}: {what} is not a directory") from None
    except NotADirectoryError:
        raise OutputError(f"{path}: cannot create the {what}: a parent of it is not a directory") from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot create the {what}: {_why(exc)}") from None
    if not path.is_dir():
        raise OutputError(f"{path}: {what} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: {what} is not writable")
    return path


def write_via(path: Path, produce: Callable[[Path], Any]) -> Path:
    """Write ``path`` atomically: ``produce(tmp)`` writes a file at ``tmp`` (beside ``path``), which
    is then given the umask's mode and renamed over ``path``. Refusals and OS errors: OutputError."""
    path = check_output_path(Path(path))
    try:
        ensure_dir(path.parent, "folder")
    except OutputError as exc:
        raise OutputError(f"{path}: cannot write: {exc}") from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        produce(tmp)
        st = os.lstat(tmp)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{path}: the writer left no regular file")
        os.chmod(tmp, file_mode())
        check_output_path(path)        # again, just before the rename: it may have changed since
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {_why(exc)}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return path


def write_bytes(path: Path, data: bytes) -> Path:
    """``data`` into ``path`` (atomic, umask mode, regular files only)."""
    def produce(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    return write_via(path, produce)


def write_text(path: Path, text: str) -> Path:
    """``text`` as UTF-8 into ``path`` (unencodable characters replaced)."""
    return write_bytes(path, text.encode("utf-8", errors="replace"))


def write_json(path: Path, doc: Any, indent: int | None = 2, allow_nan: bool = False) -> Path:
    """``doc`` as JSON into ``path``; NaN refused unless ``allow_nan`` (the diagnosis contract has none)."""
    try:
        text = json.dumps(doc, indent=indent, allow_nan=allow_nan)
    except ValueError as exc:
        raise OutputError(f"{path}: not written: {exc}") from None
    return write_text(path, text + "\n")


def settle_mode(path: Path) -> None:
    """Give a regular file written by another writer (e.g. with ``mkstemp``'s 0600) the umask's mode."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.chmod(path, file_mode())
    except OSError as exc:
        raise OutputError(f"{path}: cannot set its mode: {_why(exc)}") from None


@contextmanager
def out_dir_lock(folder: Path) -> Iterator[Path]:
    """Hold an exclusive ``fcntl.flock`` on ``folder/.srtscope.lock`` for the block; another holder
    makes this fail at once (OutputError), never wait. The lock file stays (it holds nothing)."""
    lock = Path(folder) / LOCK_NAME
    check_output_path(lock)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     file_mode())
    except OSError as exc:
        raise OutputError(f"{lock}: cannot create the run lock: {_why(exc)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"{lock}: the run lock is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{folder}: another srtscope run is writing into this folder "
                                  f"(lock {LOCK_NAME}); wait for it or use another --out") from None
            raise OutputError(f"{lock}: cannot lock: {_why(exc)}") from None
        yield lock
    finally:
        os.close(fd)       # closing releases the lock
