"""Issue 47: nothing outlives a killed ``srtscope capture``. The command ignores SIGTERM (so the
kernel's parent-death SIGTERM is not enough) and leaves a grandchild that ignores it too; srtscope
is SIGKILLed (or interrupted once, for the graceful path) and the whole process group must be gone
within a grace period, under every backend (nsys through a stand-in ``nsys`` that, like the real
one, runs the command as its own child). Whatever the outcome, the test kills what it started."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_proc import CLI, REPO

#: the command: ignores SIGTERM and SIGINT, starts a grandchild that inherits that, says both pids
STUBBORN = ("trap '' TERM INT HUP; sleep 120 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; "
            "while :; do sleep 1; done")
#: the same but the command ends on Ctrl-C; its grandchild does not (a shell's background job
#: ignores SIGINT) nor on SIGTERM
LEAVES_ONE = ("trap '' TERM; sleep 120 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; "
              "while :; do sleep 1; done")
#: a stand-in nsys: ``profile [--opts] CMD...`` runs CMD as its child and ignores SIGTERM itself
FAKE_NSYS = """#!/bin/sh
trap '' TERM
[ "$1" = profile ] || exit 0
shift
while [ "${1#--}" != "$1" ]; do shift; done
"$@"
"""
START_S = 30          # bounds the command's start
GONE_S = 20           # the guard's grace is 5 s: loosely bounded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _live(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its new parent may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _members(pgid: int) -> list[int]:
    """The live processes of group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _guards(pgid: int) -> list[int]:
    """srtscope's guard processes for group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            guard = any(a.endswith(b"child_guard.py") for a in argv) and str(pgid).encode() in argv
            if guard and _live(int(entry.name)):
                found.append(int(entry.name))
    return found


def _wait_until(done, seconds: float) -> float:
    t0 = time.monotonic()
    while not done() and time.monotonic() - t0 < seconds:
        time.sleep(0.1)
    return time.monotonic() - t0


def _default_signals() -> None:
    """In the child before exec: Ctrl-C and SIGTERM act as in a shell's foreground command, whatever
    the test process's own dispositions are (an ignored signal stays ignored across exec)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.fixture
def nsys_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(FAKE_NSYS)
    (bin_dir / "nsys").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}


BACKENDS = {"torch": ["--backend", "torch"], "probe": ["--backend", "probe", "--instrument", "vllm"],
            "nsys": ["--backend", "nsys"]}


@pytest.mark.parametrize("backend, signum, script", [
    ("torch", signal.SIGKILL, STUBBORN), ("probe", signal.SIGKILL, STUBBORN), ("nsys", signal.SIGKILL, STUBBORN),
    ("torch", signal.SIGINT, LEAVES_ONE), ("nsys", signal.SIGINT, LEAVES_ONE),
], ids=["torch-killed", "probe-killed", "nsys-killed", "torch-ctrl-c", "nsys-ctrl-c"])
def test_nothing_outlives_srtscope(tmp_path, nsys_env, backend, signum, script):
    pids = tmp_path / "pids"
    argv = [*CLI, "capture", *BACKENDS[backend], "--out", str(tmp_path / "cap"), "--",
            "sh", "-c", script.format(pids=pids)]
    proc = subprocess.Popen(argv, env=nsys_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True,       # NOTE: apart from pytest's group and terminal
                            preexec_fn=_default_signals)  # not a disposition inherited from the suite
    pgid, child, grandchild = 0, 0, 0
    try:
        assert _wait_until(pids.exists, START_S) < START_S, proc.stderr.read() if proc.poll() is not None else ""
        child, grandchild = map(int, pids.read_text().split())
        pgid = os.getpgid(child)
        assert pgid != os.getpgid(proc.pid) and os.getpgid(grandchild) == pgid      # the command's own group
        os.kill(proc.pid, signum)
        code = proc.wait(timeout=GONE_S)
        took = _wait_until(lambda: not _members(pgid), GONE_S)
        assert not _members(pgid), f"{backend}: {_members(pgid)} outlived srtscope (child {child})"
        assert took < GONE_S
        assert _wait_until(lambda: not _guards(pgid), GONE_S) < GONE_S, "the guard outlived its group"
        if signum == signal.SIGINT:
            assert code == 128 + signal.SIGINT and b"Traceback" not in proc.stderr.read()
    finally:
        for pid in ([proc.pid] + (_members(pgid) + _guards(pgid) if pgid else []) + [child, grandchild]):
            if pid and _live(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=GONE_S)
        if proc.stderr is not None:
            proc.stderr.close()

