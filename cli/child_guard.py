"""A guard that ends a capture's process group when srtscope dies, even by SIGKILL.

``capture`` runs its command in a process group of its own (so that signals can be forwarded to all
of it); that also means nothing ends the group when srtscope is killed outright: the kernel's
parent-death signal reaches the direct child only, and a child may ignore it. So each child gets a
guard: a small Python process (this file run as a script, standard library only), in a session of
its own so that the signals sent to srtscope's group (Ctrl-C) never reach it, reading a pipe that
only srtscope writes. When srtscope is done it writes ``done`` and closes the pipe: the guard exits.
When srtscope dies the pipe closes without ``done``: the guard ends the group the graceful way —
SIGTERM, up to ``GRACE_S`` for it to exit, then SIGKILL — and exits.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 5.0     # between SIGTERM and SIGKILL to a group, s
POLL_S = 0.05
DONE = b"done"


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live member. NOTE: zombies do not count (a dead member
    whose new parent does not reap it, as a container's init may not, would hold the group open)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not sys.platform.startswith("linux"):
        return True
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):      # state, ppid, pgrp, ...
            return True
    return False


def end_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the group, up to ``grace_s`` for its members to exit, then SIGKILL to what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Guard:
    """The guard of process group ``pgid``; ``release()`` once srtscope is done with the group."""

    def __init__(self, pgid: int, grace_s: float = GRACE_S) -> None:
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(pgid),
                                          str(grace_s)], stdin=subprocess.PIPE, start_new_session=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:            # no interpreter to start: the parent-death signal is all there is
            self.proc = None

    def release(self) -> None:
        """Tell the guard to exit without touching the group, and reap it."""
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(DONE)
            self.proc.stdin.close()
        except OSError:            # the guard is gone already
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:        # a guard slow to exit ends by itself
            pass
        self.proc = None


def main(argv: list[str]) -> int:
    """The guard itself: ``child_guard.py PGID GRACE_S``, the pipe from srtscope on stdin."""
    pgid, grace_s = int(argv[1]), float(argv[2])
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)        # only the pipe ends this process
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    if said != DONE:                            # srtscope died without releasing the group
        # NOTE: Linux reuses no id while a group of that id has a member; an empty group's id
        # taken by a new group in the moments since is the one (remote) risk
        end_group(pgid, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
