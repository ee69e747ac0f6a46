"""A real engine's server process for the rigs: a free port, waiting until it answers, stopping it
and its children (its process group: SIGINT, then SIGTERM, then SIGKILL)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen, deadline_s: float, who: str, see: str = "",
            timeout_s: float = 5.0) -> None:
    """Until ``url`` answers 200 within ``deadline_s``; exits naming ``who`` (and ``see``: where to look)
    when the server dies or never answers. ``timeout_s``: each request's (a first generate is slow)."""
    end = time.monotonic() + deadline_s
    tail = f"; see {see}" if see else ""
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"{who}: the server exited ({proc.returncode}) before answering{tail}")
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    sys.exit(f"{who}: no answer at {url} within {deadline_s:g} s{tail}")


def stop(proc: subprocess.Popen) -> None:
    """The server's process group ended: SIGINT (its own shutdown), then SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
