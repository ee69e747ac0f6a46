"""One function run in a forked copy of this process, beside the caller's own work.

``Beside(fn)`` forks at once: the copy runs ``fn()`` on everything the caller held at that moment
(copy-on-write: nothing is pickled on the way in) and sends its result back pickled through a pipe;
``result()`` waits for it. The copy writes nothing to the terminal and touches no file of the
caller's: its failure, or its being killed, makes ``result()`` None, and the caller does that work
itself (a failure it meets again says what is wrong). Leaving the ``with`` block early (an error,
Ctrl-C) kills the copy, and on Linux the copy dies with the caller (killed outright, out of
memory): nothing is left running. A copy never left to its caller's ``with`` (a signal that lands
between the fork and the block, a Beside used bare) is killed and reaped when the caller exits.

NOTE: only where ``os.fork`` exists (``available``); the copy's peak memory is its own on top of
the caller's, less the pages both still share: callers size their pieces for two. Before the fork
the caller's C heap gives its freed memory back to the system (glibc ``malloc_trim``): neither
process starts out holding the other's spare (10 GB export: 360 MiB of the reading's buffers).
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

#: signals whose Python handlers may raise (Ctrl-C, and the CLI's SIGTERM / SIGHUP unwinding)
_UNWINDING = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_live: dict[int, int] = {}      # a copy's pid -> the pid of the caller that forked it


def available() -> bool:
    """Whether a copy can be forked and has a core of its own to run on."""
    if not hasattr(os, "fork"):
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


class Beside:
    """``fn()`` in a forked copy of this process (module doc)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        trim_heap()
        read, write = os.pipe()
        parent = os.getpid()
        self.pid: int | None = None
        self.fd: int | None = read
        try:
            # NOTE: a handler that raises waits until the copy is registered (``_signals_held``)
            with _signals_held() as before, warnings.catch_warnings():
                # NOTE: Python >= 3.12 warns of a fork beside threads: ours hold no lock the copy takes
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
                if pid == 0:                  # the copy: never returns
                    for s, h in before.items():
                        signal.signal(s, h)
                    os.close(read)
                    _run(fn, write, parent)
                _live[pid] = parent
                self.pid = pid
        except BaseException:
            self.kill()
            raise
        finally:
            os.close(write)

    def result(self) -> Any:
        """``fn()``'s result, or None where the copy failed or was killed."""
        data = b""
        try:
            assert self.fd is not None and self.pid is not None
            with os.fdopen(self.fd, "rb") as f:
                self.fd = None
                data = f.read()
        finally:
            status = self._wait()
        if status != 0:
            return None
        try:
            return pickle.loads(data)
        except Exception:                     # noqa: BLE001 (a torn message is a failed copy)
            return None

    def _wait(self) -> int:
        if self.pid is None:
            return 1
        _, status = os.waitpid(self.pid, 0)
        _live.pop(self.pid, None)
        self.pid = None
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """Stop the copy if it still runs (its result is dropped)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait()

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()


@contextmanager
def _signals_held() -> Iterator[dict[int, Any]]:
    """Within: SIGINT / SIGTERM / SIGHUP only noted; on leaving, the earlier handlers back and each
    noted signal handed to its own (which may raise). Yields those handlers (empty off the main
    thread, where no handler runs and none can be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    came: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: came.append(signum))
              for s in _UNWINDING if signal.getsignal(s) is not None}      # None: set outside Python
    try:
        yield before
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        for s in came:
            h = before[s]
            if callable(h):
                h(s, None)
            elif h == signal.SIG_DFL:
                signal.raise_signal(s)


@atexit.register
def _reap_left() -> None:
    """Kill and reap the copies this process forked that no ``with`` block ended."""
    me = os.getpid()
    for pid in [p for p, caller in _live.items() if caller == me]:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        _live.pop(pid, None)


def trim_heap() -> bool:
    """Give the C heap's freed memory back to the system (glibc); False where there is no
    ``malloc_trim`` (another C library) or nothing was given back."""
    try:
        import ctypes
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def resident_bytes() -> int | None:
    """This process's resident memory (bytes, Linux ``/proc``); None where the system does not say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _die_with(parent: int) -> None:
    """Linux: the copy is killed when the caller dies (killed itself: nothing left running)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:                                          # it died before that
        os._exit(1)


def _run(fn: Callable[[], Any], fd: int, parent: int) -> None:
    code = 1
    try:
        _die_with(parent)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        data = pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        code = 0
    except BaseException:                     # noqa: BLE001 (the caller redoes the work)
        pass
    finally:
        os._exit(code)
