"""The private folder a diagnosis in windows spills to, which never outlives its run.

``spill_folder()`` makes ``$TMPDIR/srtscope-spill-*`` with an ``owner`` file (this process's pid and
start time) and removes it on leaving, also when the run is ended by SIGTERM or SIGHUP (they unwind
it like Ctrl-C, then raise ``Ended``: the caller exits 128+signal). A run killed outright (SIGKILL,
out of memory) cannot clean up: the next one removes its folder (``sweep_stale``) — only a folder of
this user whose owner process is gone and that holds nothing but the spill's own files; anything
else is left alone. Nothing is printed: what the caller says goes through its callbacks.
"""
from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "srtscope-spill-"
OWNER = "owner"
#: the files a spill writes (``time_spool.TimeSpool`` of ``nsys_spill``) beside its owner file: one
#: per table, or (an earlier version's) one per segment
_FILE = re.compile(r"(device|api)-[0-9a-f]{12}(-\d{7}\.arrow|\.spool)")
_ENDING = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, from Linux /proc; "" without /proc while
    the pid exists), None where ``pid`` runs no process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
    except (OSError, IndexError):
        return ""
    try:                                       # no /proc: whether the pid exists at all
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return ""


def owner_stamp() -> str:
    """What an ``owner`` file holds: this process's pid and start time (``owner_alive`` reads it)."""
    return f"{os.getpid()} {_started(os.getpid()) or ''}\n"


def owner_alive(owner: str) -> bool:
    """Whether the ``owner`` file's process still runs (a reused pid with another start time does
    not count); True where the file cannot be read as ours."""
    parts = owner.split()
    if not parts or not parts[0].isdigit():
        return True
    started = _started(int(parts[0]))
    if started is None:
        return False
    return not (len(parts) > 1 and started and started != parts[1])


def sweep_stale(tmp: Path, note: Callable[[str], None] | None = None) -> int:
    """Remove the spill folders under ``tmp`` left by runs of this user that ended without cleaning
    up (module doc), saying so to ``note`` (one line) where any were; the bytes given back."""
    freed = 0
    uid = os.getuid() if hasattr(os, "getuid") else None
    for d in sorted(tmp.glob(PREFIX + "*")):
        try:
            if d.is_symlink() or not d.is_dir() or (uid is not None and d.stat().st_uid != uid):
                continue
            owner = d / OWNER
            if owner.is_symlink() or not owner.is_file() or owner_alive(owner.read_text()):
                continue
            files = list(d.iterdir())
            if any(f.is_symlink() or not f.is_file() or not (f.name == OWNER or _FILE.fullmatch(f.name))
                   for f in files):
                continue
            size = sum(f.stat().st_size for f in files)
            for f in files:
                f.unlink()
            d.rmdir()
            freed += size
        except OSError:
            continue
    if freed and note is not None:
        note(f"removed {freed / 2**30:.2f} GiB of spill left under {tmp} by a run that ended without "
             "cleaning up")
    return freed


_ended_by: list[int] = []      # the signal being handled (``_unwind``)


class Ended(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``signum``) ended the run; its spill is removed. The caller says
    ``interrupted (SIGTERM)`` and exits 128+signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _unwind(signum: int, frame: object) -> None:
    """SIGTERM / SIGHUP: unwind like Ctrl-C (the spill's threads stop at their next chunk, a forked
    walk is killed, the folder removed); a second one is ignored while that runs."""
    signal.signal(signum, signal.SIG_IGN)
    _ended_by.append(signum)
    raise KeyboardInterrupt


def check_ended() -> None:
    """Raise KeyboardInterrupt in the main thread where SIGTERM or SIGHUP came and its exception was
    lost. NOTE: C code that clears errors (numpy's dtype comparison, for one) can swallow the
    exception a handler raises: the run then goes on, and ends at the next check."""
    if _ended_by and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt


@contextmanager
def spill_folder() -> Iterator[Path]:
    """A new spill folder under ``$TMPDIR``, removed on leaving; SIGTERM and SIGHUP remove it too and
    raise ``Ended`` (``check_ended`` where the exception was lost); Ctrl-C passes as it is."""
    before = {}
    if threading.current_thread() is threading.main_thread():    # only it may set handlers
        for s in _ENDING:
            before[s] = signal.signal(s, _unwind)
    try:
        # NOTE: a cleanup that fails leaves the rest to the next run's ``sweep_stale``; it never takes
        # the place of the error the run ends with
        with tempfile.TemporaryDirectory(prefix=PREFIX, ignore_cleanup_errors=True) as folder:
            path = Path(folder)
            (path / OWNER).write_text(owner_stamp())
            yield path
            check_ended()                # a signal whose exception was lost still ends the run
    except KeyboardInterrupt:
        if not _ended_by:
            raise                        # Ctrl-C: the caller says so
        raise Ended(_ended_by.pop()) from None
    finally:
        for s, h in before.items():
            signal.signal(s, h)
