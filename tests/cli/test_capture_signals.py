"""Item 12 of issue 14: ``capture --backend torch`` runs its child in its own process group, forwards
SIGINT / SIGTERM to it, waits for the trace to be flushed and exits 128+signal; no orphan in any
order of signals, nor when srtscope itself is SIGKILLed (the child gets SIGTERM from the kernel).

The cases run side by side, each bounded by timeouts. Two children are Python scripts under
torch.profiler (their traces must be flushed); two are shells (cheap): one ignores SIGINT and SIGTERM
so that only the third signal (SIGKILL to its group) ends it, one outlives a SIGKILLed srtscope.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_proc import CLI

pytest.importorskip("torch")

SCRIPT = "import os, time\nprint('ready', os.getpid(), flush=True)\ntime.sleep(120)\n"
STUBBORN = ["sh", "-c", "trap '' INT TERM; echo ready $$; exec sleep 120"]
PLAIN = ["sh", "-c", "echo ready $$; exec sleep 120"]
READY_S = 120      # bounds the start of two torch children at once on two cores
EXIT_S = 60


@dataclass
class Case:
    name: str
    command: list[str] | None        # None: python SCRIPT under torch.profiler
    signals: list[int]               # sent to srtscope, in order
    code: int | None                 # srtscope's exit status (None: it was SIGKILLed)
    trace: bool                      # the trace must have been flushed
    proc: subprocess.Popen | None = None
    lines: queue.Queue = field(default_factory=queue.Queue)
    child: int = 0
    pump: threading.Thread | None = None


CASES = [
    Case("sigterm", None, [signal.SIGTERM], 128 + signal.SIGTERM, True),
    Case("ctrl-c", None, [signal.SIGINT], 128 + signal.SIGINT, True),
    Case("int-term-term", STUBBORN, [signal.SIGINT, signal.SIGTERM, signal.SIGTERM], 128 + signal.SIGINT, False),
    Case("srtscope-killed", PLAIN, [signal.SIGKILL], None, False),
]


def _gone(pid: int) -> bool:
    """No process ``pid``, or only its zombie (its new parent may not reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def test_signals_reach_the_child_and_leave_no_orphan(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SCRIPT)
    for c in CASES:
        command = c.command or [sys.executable, str(script)]
        c.proc = subprocess.Popen([*CLI, "capture", "--backend", "torch", "--out", tmp_path / f"{c.name}.json.gz",
                                   "--", *command],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        c.pump = threading.Thread(target=_pump, args=(c.proc, c.lines), daemon=True)
        c.pump.start()
    try:
        for c in CASES:
            line = c.lines.get(timeout=READY_S)
            assert line.startswith("ready "), line
            c.child = int(line.split()[1])
            assert os.getpgid(c.child) == c.child != os.getpgid(c.proc.pid)   # its own group
        for c in CASES:
            assert c.proc is not None
            for s in c.signals:
                os.kill(c.proc.pid, s)
                time.sleep(0.05)
        for c in CASES:
            assert c.proc is not None
            code = c.proc.wait(timeout=EXIT_S)
            err = c.proc.stderr.read() if c.proc.stderr else ""
            if c.code is not None:
                assert code == c.code, (c.name, code, err)
                assert "Traceback" not in err, err
            deadline = time.monotonic() + EXIT_S
            while not _gone(c.child) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _gone(c.child), f"{c.name}: child {c.child} outlived srtscope"
            if c.trace:
                assert (tmp_path / f"{c.name}.json.gz").stat().st_size > 0, (c.name, err)
    finally:
        for c in CASES:
            for pid in (c.child, c.proc.pid if c.proc else 0):
                if pid and not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
        for c in CASES:                 # reap srtscope, let the pump see EOF, close both pipes
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                pass
            if c.pump is not None:
                c.pump.join(timeout=EXIT_S)
            for pipe in (c.proc.stdout, c.proc.stderr):
                if pipe is not None:
                    pipe.close()
