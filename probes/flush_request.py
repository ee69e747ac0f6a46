"""Traces written on request, before a signal reaches the capture's processes.

``capture --backend torch --instrument`` starts a torch.profiler in each process where an engine
function runs (a server's engine core, its workers), and such a process writes its trace when it
ends. A server stopped by Ctrl-C does not end that way: vLLM's API server SIGKILLs its engine core
and workers at once (shutdown mode ``abort``, timeout 0 s). So the capture asks first: on the first
signal, srtscope creates ``STOP`` in the capture's control folder (the boot folder) and holds the
signal back; each process with a running profiler (it registered ``torch.<pid>`` there) sees it
within ``POLL_S``, stops its profiler, writes its trace and removes its mark; the signal goes on when
no live process is marked, or after ``WAIT_S`` at most (a second signal sends it at once).
An engine's own shutdown that SIGKILLs its processes (``EngineTable.shutdown``: SGLang's) is hooked
to ask the same way, under ``--backend probe`` too: there each process with a probe stream marks
itself and, asked, appends the spans recorded since its last flush.

Standard library only: both sides (``probes.capture_boot`` in the engine's processes, ``cli.capture``)
use it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

STOP = "stop"         # the request, a file in the control folder
MARK = "torch."       # + pid: a process whose trace (profiler's or probe stream's) is not written yet
POLL_S = 0.1          # how often a process looks for the request, s
WAIT_S = 30.0         # the most srtscope holds a signal back for the traces, s


def mark(folder: Path, pid: int) -> Path:
    """Register ``pid`` as a process that writes a trace on request; its mark's path."""
    path = folder / f"{MARK}{pid}"
    path.touch()
    return path


def unmark(folder: Path, pid: int) -> None:
    """Take ``pid``'s mark back: its trace is written (at exit)."""
    (folder / f"{MARK}{pid}").unlink(missing_ok=True)


def watch(folder: Path, pid: int, write: Callable[[], None]) -> threading.Thread:
    """Mark ``pid`` and start a daemon thread that calls ``write`` once when the request appears (or
    never), then removes the mark; ``write`` must not raise."""
    own = mark(folder, pid)

    def run() -> None:
        stop = folder / STOP
        while not stop.exists():
            if not own.exists():             # written already (the process is ending) or folder gone
                return
            time.sleep(POLL_S)
        try:
            write()
        finally:
            own.unlink(missing_ok=True)

    th = threading.Thread(target=run, name="srtscope-flush-request", daemon=True)
    th.start()
    return th


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                     # a zombie has written all it will
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


class FlushRequest:
    """srtscope's side: ``ask()`` on the first signal, then ``settled()`` until the signal may go on."""

    def __init__(self, folder: Path, wait_s: float = WAIT_S) -> None:
        if wait_s <= 0:
            raise ValueError(f"wait_s must be positive, got {wait_s}")
        self.folder, self.wait_s = folder, wait_s
        self.deadline: float | None = None

    def pending(self) -> list[int]:
        """The marked processes still alive (a mark whose process died writes nothing)."""
        try:
            names = [p.name for p in self.folder.iterdir() if p.name.startswith(MARK)]
        except OSError:
            return []
        pids = [int(n[len(MARK):]) for n in names if n[len(MARK):].isdigit()]
        return sorted(p for p in pids if _alive(p))

    def ask(self) -> int:
        """Ask the marked processes to write their traces; how many were asked (0: nothing to wait for)."""
        waiting = self.pending()
        if not waiting:
            return 0
        try:
            (self.folder / STOP).touch()
        except OSError:
            return 0
        self.deadline = time.monotonic() + self.wait_s
        return len(waiting)

    def settled(self) -> bool:
        """Whether the held signal may go on: every asked process wrote (or died), or the time is up."""
        return self.deadline is None or time.monotonic() >= self.deadline or not self.pending()
